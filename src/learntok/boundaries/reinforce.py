"""The score-function (REINFORCE) estimator's maths (paper eq. 15-24, docs/method.md).

Pure functions on tensors, each with a plain reference beside it for the tests:

- `sample_window_policy`: draw a_t ~ Bernoulli(sigmoid(l_t)) where l_t depends on a_{t-1..t-w}, without a
  Python loop over bytes (a parallel scan over the 2^w window states, or Jacobi fixed-point iteration for
  wide windows; both exact, see their docstrings).
- `discounted_returns`: G_t = sum_{j>=0} gamma^j r_{t+j}, a reverse discounted cumsum done with two small
  triangular matmuls (no gamma^-t factors, which overflow at T = 4096).
- `batch_relative_advantage`: A_{t,b} = G_{t,b} - mean_b G_{t,b} over valid rows; `leave_one_out_advantage`
  over the K samples of one text instead (--policy-samples).
- `BatchStatistics`: the sums the estimator averages over the global batch (a `BatchSums`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from learntok.boundaries.base import sample_groups
from learntok.nn.attention import softcap


def previous_boundaries(a: torch.Tensor, w: int) -> torch.Tensor:
    """(B,T) {0,1} -> (B,T,w) float where [..., t, j] = a_{t-1-j} (0 before the sequence start)."""
    B, T = a.shape
    padded = F.pad(a.float(), (w, 0))  # (B, T+w)
    win = padded.unfold(1, w, 1)[:, :T]  # (B,T,w): [..., t, :] = a_{t-w} .. a_{t-1}
    return win.flip(-1)


def window_logits(base: torch.Tensor, coef: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """l_t = base_t + sum_j a_{t-1-j} coef_{t,j} (eq. 21 after scaling). base (B,T), coef (B,T,w)."""
    if coef.shape[-1] == 0:
        return base
    return base + (previous_boundaries(a, coef.shape[-1]) * coef).sum(-1)


SCAN_MAX_WINDOW = 8
"""Widest policy window sampled by the state scan (2^w states per byte; 256 at the paper's w = 8). Wider
windows use Jacobi iteration."""


@torch.no_grad()
def sample_window_policy(base: torch.Tensor, coef: torch.Tensor, u: torch.Tensor, forced: torch.Tensor,
                         cap: float) -> tuple[torch.Tensor, float]:
    """Sample a_t = [u_t < sigmoid(softcap(l_t))] (or forced) for all t at once, exactly as the sequential
    sampler would with the same uniforms u. base (B,T), coef (B,T,w), u (B,T), forced (B,T) bool.

    With w = 0 the decisions are independent: one step. Otherwise, for w <= SCAN_MAX_WINDOW where `use_scan`
    says so (compiling, an accelerator, fake tensors), `_scan_sample` (ceil(log2 T) steps fixed by the shape:
    no data-dependent loop, no host read, so the compiled step has no graph break and a GPU never waits for
    the host); eagerly on the CPU, or for wider windows, `_jacobi_rounds` (a few rounds of O(B T w) work with
    one host read each, against the scan's log2 T rounds of O(B T 2^w): fewer operations where a host read is
    free). Both give the same draws (tests/test_estimator.py).
    Returns (a bool (B,T), the number of parallel rounds as a Python number: logged as
    boundary/sample_rounds; fixed by the shape for the scan, so a compiled graph holds no host tensor for it).
    """
    w = coef.shape[-1]
    if w == 0:
        return forced | (u < torch.sigmoid(softcap(base, cap))), 1.0
    if w <= SCAN_MAX_WINDOW and use_scan(base):
        return _scan_sample(base, coef, u, forced, cap)
    return _jacobi_rounds(base, coef, u, forced, cap, forced | (u < torch.sigmoid(softcap(base, cap))))


def use_scan(base: torch.Tensor) -> bool:
    """The state scan rather than Jacobi: while compiling, on an accelerator, and for fake tensors (no values
    to iterate on); Jacobi eagerly on the CPU."""
    return torch.compiler.is_compiling() or base.device.type != "cpu" or is_fake(base)


def _scan_sample(base, coef, u, forced, cap):
    """The window sampler as a parallel prefix scan over the policy's 2^w states.

    The state before byte t is s = (a_{t-1}, ..., a_{t-w}) as bits (bit j = a_{t-1-j}; 0 before the start).
    Given the uniforms, byte t's decision is a function of the state only, so byte t is a map f_t on the 2^w
    states, s -> (s << 1 | a_t(s)) mod 2^w, tabulated from the logits of all 2^w states at once. The state
    after byte t is (f_t o ... o f_0)(0); function composition is associative, so a Hillis-Steele scan builds
    every prefix in ceil(log2 T) rounds of one gather each, and a_t is the low bit of the state after byte t.
    Exact (the same draws as the sequential sampler); memory B x T x 2^w indices."""
    B, T, w = coef.shape
    S = 1 << w
    states = torch.arange(S, device=base.device)
    bits = ((states[:, None] >> torch.arange(w, device=base.device)) & 1).to(coef.dtype)  # (S,w): bit j = a_{t-1-j}
    # l_t in every state, as window_logits computes it (elementwise, not a matmul that autocast would run in bf16)
    logits = base[..., None] + (bits * coef[:, :, None, :]).sum(-1)  # (B,T,S)
    a = forced[..., None] | (u[..., None] < torch.sigmoid(softcap(logits, cap)))  # (B,T,S): a_t in state s
    f = ((states << 1) & (S - 1)) | a.long()  # (B,T,S): f_t(s)
    d, rounds = 1, 1
    while d < T:  # a Python loop over log2(T) static steps: unrolled when compiled
        f = torch.cat([f[:, :d], torch.gather(f[:, d:], 2, f[:, :-d])], 1)  # f_t <- f_t o f_{t-d}
        d, rounds = 2 * d, rounds + 1
    return (f[..., 0] & 1).bool(), float(rounds)


@torch.compiler.disable  # a data-dependent loop (one host read per round): eager inside a compiled model
def _jacobi_rounds(base, coef, u, forced, cap, a):
    """Jacobi iteration for wide windows: a_t depends on a_{<t} only, so F(a)_t = [u_t < sigmoid(softcap(
    l_t(a_{<t})))] has exactly one fixed point, the sequential sample; iteration k fixes at least the first k
    positions, and once F(a) = a it is exact (at most T + 1 rounds; a few when the window terms are small)."""
    rounds = 1
    while rounds <= a.shape[1]:
        rounds += 1
        new = forced | (u < torch.sigmoid(softcap(window_logits(base, coef, a), cap)))
        if torch.equal(new, a):
            break
        a = new
    return a, float(rounds)


@torch.no_grad()
def reference_sample(base: torch.Tensor, coef: torch.Tensor, u: torch.Tensor, forced: torch.Tensor,
                     cap: float) -> torch.Tensor:
    """The naive sequential sampler, one byte at a time (for tests)."""
    B, T = base.shape
    w = coef.shape[-1]
    a = torch.zeros(B, T, dtype=torch.bool)
    for t in range(T):
        prev = torch.stack([a[:, t - 1 - j] if t - 1 - j >= 0 else torch.zeros(B, dtype=torch.bool)
                            for j in range(w)], -1).float() if w else torch.zeros(B, 0)
        logit = base[:, t] + (prev * coef[:, t]).sum(-1) if w else base[:, t]
        a[:, t] = forced[:, t] | (u[:, t] < torch.sigmoid(softcap(logit, cap)))
    return a


def discounted_returns(r: torch.Tensor, gamma: float, chunk: int = 256) -> torch.Tensor:
    """G_t = sum_{j>=0} gamma^j r_{t+j} along dim 1. r: (B,T) -> (B,T).

    Within chunks of C positions: G_loc = r @ M^T with M[i,k] = gamma^(k-i) for k >= i. Across chunks the
    start values S_c obey S_c = G_loc[c,0] + gamma^C S_{c+1}: the same triangular form with gamma^C.
    Then G[c,i] = G_loc[c,i] + gamma^(C-i) S_{c+1}. Only non-negative powers appear, so nothing overflows.
    Computed in float64 with autocast off, and returned in r's dtype: under bf16 autocast the matmuls would
    round the returns to bf16 (errors of ~1e-2 on returns of ~10), and an fp32 matmul runs in TF32 on a GPU
    where TF32 is on (10 mantissa bits; training enables it under bf16-mixed). The float64 matmuls are tiny
    (B T C multiply-adds, C = 256). The gamma tables are built on the device (no host copy).
    """
    with torch.autocast(r.device.type, enabled=False):
        B, T = r.shape
        C = min(chunk, T)
        pad = (-T) % C
        n = (T + pad) // C
        dtype, dev = torch.float64, r.device
        rc = F.pad(r.to(dtype), (0, pad)).view(B, n, C)  # (B,n,C)

        def tri(size: int, g: float) -> torch.Tensor:  # (size,size): g^(k-i) for k >= i, else 0
            e = torch.arange(size, device=dev, dtype=dtype)
            d = e[None, :] - e[:, None]
            return torch.where(d >= 0, g ** d.clamp(min=0), 0.0)

        g_loc = rc @ tri(C, gamma).T  # (B,n,C)
        s = g_loc[:, :, 0] @ tri(n, gamma**C).T  # (B,n) return at each chunk start
        s_next = F.pad(s[:, 1:], (0, 1))  # (B,n) S_{c+1}, 0 after the last chunk
        tail = gamma ** (C - torch.arange(C, device=dev, dtype=dtype))  # gamma^(C-i)
        g = g_loc + tail * s_next.unsqueeze(-1)  # (B,n,C)
        return g.reshape(B, n * C)[:, :T].to(r.dtype)


def reference_returns(r: torch.Tensor, gamma: float) -> torch.Tensor:
    """Plain reverse loop G_t = r_t + gamma G_{t+1} (for tests)."""
    g = torch.zeros_like(r)
    acc = torch.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        acc = r[:, t] + gamma * acc
        g[:, t] = acc
    return g


def masked_std(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation of x over entries with weight 1 (0 with fewer than two): `x[mask].std()`
    without a data-dependent shape or branch, so a compiled step does not break its graph."""
    n = weight.sum()
    mean = (x * weight).sum() / n.clamp(min=1)
    return (((x - mean) ** 2 * weight).sum() / (n - 1).clamp(min=1)).sqrt()


def batch_relative_advantage(g: torch.Tensor, valid: torch.Tensor, mean: torch.Tensor | None = None) -> torch.Tensor:
    """A_{t,b} = G_{t,b} - mean over valid b of G_{t,b} (eq. 17); 0 at invalid entries. (B,T) -> (B,T).
    `mean` (T,) replaces the local per-position mean by the global batch's (see learntok.train.parallel)."""
    vf = valid.to(g.dtype)
    if mean is None:
        mean = (g * vf).sum(0) / vf.sum(0).clamp(min=1)  # (T,)
    return (g - mean) * vf


def leave_one_out_advantage(g: torch.Tensor, keep: torch.Tensor, k: int) -> torch.Tensor:
    """Returns of K samples per text (rows in the `repeat_samples` layout) minus, per row and position, the mean
    return of the other K - 1 samples of its text: G - (sum_group - G) / (K - 1). The others' boundaries are
    drawn independently of this row's, so the baseline adds no bias (RLOO). Positions outside `keep` count
    neither as a baseline nor get an advantage. g, keep (B,T) with B a multiple of K -> (B,T)."""
    kf = keep.to(g.dtype)
    gk, kk = sample_groups(g * kf, k), sample_groups(kf, k)  # (B/K,K,T): the rows of one text together
    others = (gk.sum(1, keepdim=True) - gk) / (kk.sum(1, keepdim=True) - kk).clamp(min=1)  # (B/K,K,T)
    return ((gk - others) * kk).view(g.shape)


@dataclass
class BatchStatistics:
    """Sums over a batch of what the estimator averages over the batch: the learned policy's `BatchSums`. Kept per
    stratum of rows that share a target rate (S = 1 for a fixed-rate model; learntok.boundaries.rates)."""

    g_sum: torch.Tensor
    """(S,T) sum over rows of the return G_t at valid positions."""
    g_cnt: torch.Tensor
    """(S,T) number of valid rows at each position."""
    g2_sum: torch.Tensor
    """(S,T) sum of G_t^2 (for optional advantage normalisation)."""
    p_sum: torch.Tensor
    """(S,) sum of boundary probabilities over trained decisions."""
    n: torch.Tensor
    """(S,) number of trained decisions."""

    def _parts(self) -> tuple[torch.Tensor, ...]:
        return self.g_sum, self.g_cnt, self.g2_sum, self.p_sum, self.n

    def stacked(self) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in self._parts()])

    def unstacked(self, v: torch.Tensor) -> BatchStatistics:
        parts, i = [], 0
        for t in self._parts():  # the same shapes as these sums
            parts.append(v[i:i + t.numel()].view(t.shape))
            i += t.numel()
        return BatchStatistics(*parts)
