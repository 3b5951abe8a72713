"""H-Net dynamic chunking (Hwang, Wang & Gu 2025), ported to our U-Net as the paper does (docs/baselines.md).

Routing (cosine similarity of adjacent states, trained straight-through):
    h_t  = RMSNorm(X_t),   q_t = W_q h_{t-1},   k_t = W_k h_t          (W_q, W_k: d x d, identity init)
    p_t  = clamp((1 - cos(q_t, k_t)) / 2, 0, 1),   p_0 = 1
    b_t  = [p_t > 0.5]                                                   (same in train and eval; no noise)

Downsample: select X at b = 1 (base `select`). Upsample ("dechunk"): an EMA over the token outputs y_j,
    z_j = P_j y_j + (1 - P_j) z_{j-1},   P_j = clamp(p_{tau_j}, 1e-4, 1 - 1e-4)
then byte t gets X_t + STE(c_t) z_{c(t)}, with c_t = p_t if b_t else 1 - p_t and STE(c) = 1 + c - sg(c)
(forward value exactly 1, gradient of c). The LM loss reaches W_q, W_k only through P and c.

Ratio loss with N = 1 / target_rate, F = mean b_t (no gradient), G = mean p_t over decided positions:
    L_ratio = N / (N - 1) * ((N - 1) F G + (1 - F)(1 - G)),   dL/dG = N (N F - 1) / (N - 1)

W_q and W_k start as the identity (`reset_parameters`, the official initialisation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy, RateConfig, StepState, forced_positions
from learntok.boundaries.pooling import Tokens, distribute_add
from learntok.nn.layers import RMSNorm


@dataclass(frozen=True, kw_only=True)
class HNetConfig(RateConfig):
    """Options of `--boundaries hnet` (H-Net's dynamic chunking)."""

    boundaries: str = "hnet"
    ratio_loss_weight: float = 0.03
    """Weight alpha of H-Net's ratio loss (N = 1/target_rate)."""


@dataclass(kw_only=True)
class HNetState(StepState):
    q_prev: torch.Tensor | None = None
    """(B,D) W_q h_{t-1}, the previous byte's routing query."""


P_MIN = 1e-4
"""EMA gates are clamped to [P_MIN, 1 - P_MIN] (as the official dechunk does) so log(1 - P) stays finite."""


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """a (..., L) -> (..., L, L): S[k, j] = sum_{i=j+1..k} a_i for j <= k, -inf above the diagonal.

    Each entry sums only its own segment (masked cumsum), instead of differencing two long cumsums, so there
    is no cancellation in fp32 however negative the cumulative sums get."""
    L = a.shape[-1]
    strict = torch.ones(L, L, dtype=torch.bool, device=a.device).tril(-1)  # (L,L) i > j
    s = a.unsqueeze(-1).expand(*a.shape, L).masked_fill(~strict, 0.0).cumsum(-2)  # (...,L,L) rows k, cols j
    lower = torch.ones(L, L, dtype=torch.bool, device=a.device).tril()
    return s.masked_fill(~lower, float("-inf"))


def ema_scan(y: torch.Tensor, gate: torch.Tensor, block: int = 128) -> torch.Tensor:
    """z_k = gate_k y_k + (1 - gate_k) z_{k-1}, z_{-1} = 0, in closed form (fp32, fully vectorised).

    y (B,M,D), gate (B,M) in (0,1) -> z (B,M,D) fp32. With a_i = log(1 - gate_i) <= 0,
        z_k = sum_{j<=k} exp(sum_{i=j+1..k} a_i) gate_j y_j.
    Evaluated in blocks of `block` tokens (Mamba-2's state-space-dual form): the O(block^2) kernel inside
    each block, the same closed form over the per-block end states to carry between blocks, and a decay
    from each block's start. Memory O(B M block) instead of O(B M^2). All exponents are <= 0."""
    with torch.autocast(device_type=y.device.type, enabled=False):
        y, gate = y.float(), gate.float()
        B, M, D = y.shape
        L = max(1, min(block, M))
        n = -(-M // L)
        pad = n * L - M
        a = torch.log1p(-gate)  # (B,M)
        u = gate.unsqueeze(-1) * y  # (B,M,D)
        if pad:  # trailing zero-input, no-decay rows: they cannot influence earlier rows
            a = F.pad(a, (0, pad))
            u = F.pad(u, (0, 0, 0, pad))
        a = a.view(B, n, L)  # (B,n,L)
        u = u.view(B, n, L, D)  # (B,n,L,D)
        intra = torch.exp(_segsum(a)) @ u  # (B,n,L,D): the scan within each block, starting from 0
        decay_in = torch.exp(a.cumsum(-1))  # (B,n,L): decay from the block's start to row k (one sign: exact)
        # carry_m = state after block m: the same EMA over blocks, with end states intra[:, m, -1] and
        # per-block decays exp(sum a over block m).
        carry = torch.exp(_segsum(a.sum(-1))) @ intra[:, :, -1]  # (B,n,D)
        prev = F.pad(carry[:, :-1], (0, 0, 1, 0))  # (B,n,D) state entering block m (0 for the first)
        z = intra + decay_in.unsqueeze(-1) * prev.unsqueeze(2)  # (B,n,L,D)
        return z.view(B, n * L, D)[:, :M]


def ema_scan_loop(y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Sequential reference of `ema_scan`: the recurrence as written, one token at a time."""
    z = torch.zeros_like(y[:, 0])  # (B,D)
    out = []
    for k in range(y.shape[1]):
        g = gate[:, k, None]  # (B,1)
        z = g * y[:, k] + (1 - g) * z
        out.append(z)
    return torch.stack(out, 1)  # (B,M,D)


def ratio_loss(frac: torch.Tensor, G: torch.Tensor, N: float) -> torch.Tensor:
    """H-Net's ratio loss N/(N-1) ((N-1) F G + (1-F)(1-G)); equals 1 at F = G = 1/N."""
    return N / (N - 1) * ((N - 1) * frac * G + (1 - frac) * (1 - G))


class HNetChunking(BoundaryStrategy):
    """H-Net's routing module, chunking (select) and smoothed dechunking (EMA x STE(c) + identity residual).

    With cfg.pooling == "select" the U-Net uses plain select + distribute-add: the hard boundaries then give
    the router no LM gradient at all, and W_q, W_k (and the router's norm) learn from the ratio loss only."""

    config = HNetConfig
    learns_by = "straight_through"
    own_pooling = True
    has_step = True

    def __init__(self, cfg: HNetConfig, dim: int):
        super().__init__(cfg, dim)
        self.N = 1.0 / cfg.target_rate  # target bytes per chunk (N in H-Net's eq. 10)
        self.norm = RMSNorm(dim)  # H-Net routes on the encoder output after its final RMSNorm
        self.w_q = nn.Parameter(torch.eye(dim))  # applied to the previous state h_{t-1}
        self.w_k = nn.Parameter(torch.eye(dim))  # applied to the current state h_t

    def reset_parameters(self, init_std: float = 0.0) -> None:
        """Identity routing matrices and a unit norm, the official initialisation."""
        with torch.no_grad():
            self.w_q.copy_(torch.eye(self.w_q.shape[0]))
            self.w_k.copy_(torch.eye(self.w_k.shape[0]))
            self.norm.weight.fill_(1.0)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        """Boundary probabilities p (B,T) fp32 with grad; p_0 = 1. x (B,T,D)."""
        h = self.norm(x)  # (B,T,D)
        qk = F.linear(h, torch.cat([self.w_q, self.w_k])).float()  # (B,T,2D): W_q h_t and W_k h_t, one matmul
        q, k = qk[:, :-1, : h.shape[-1]], qk[:, 1:, h.shape[-1]:]  # (B,T-1,D) W_q h_{t-1}, W_k h_t
        cos = F.cosine_similarity(q, k, dim=-1, eps=1e-8)  # (B,T-1)
        p = ((1 - cos) / 2).clamp(0.0, 1.0)  # (B,T-1)
        return torch.cat([p.new_ones(p.shape[0], 1), p], 1)  # (B,T); T = 1 too (p_0 alone)

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        B, T, _ = x.shape
        forced = forced_positions(B, T, self.cfg.force_last, x.device)
        p = self.route(x)  # (B,T)
        p = torch.where(forced, torch.ones_like(p), p)  # forced: p = 1, no gradient
        mask = (p.detach() > 0.5) | forced  # (B,T) b_t; a tie p = 0.5 is "no boundary" (official argmax)
        return BoundaryOutput(mask=mask, probs=p, free=~forced)

    def init_step_state(self, batch, noise):
        return HNetState(noise=noise)

    def step(self, x_t, ids_t, t, state):
        h = self.norm(x_t)  # (B,D)
        qk = F.linear(h, torch.cat([self.w_q, self.w_k])).float()  # (B,2D)
        q, k = qk[:, : h.shape[-1]], qk[:, h.shape[-1]:]
        if t == 0:
            p = torch.ones(h.shape[0], device=h.device)
        else:
            p = ((1 - F.cosine_similarity(state.q_prev, k, dim=-1, eps=1e-8)) / 2).clamp(0.0, 1.0)  # (B,)
        state.q_prev = q
        a = (p > 0.5) | (t == 0)
        return a, p

    def step_token_output(self, y_t, a_t, p_t, last, state):
        """The EMA of token outputs, z_j = P_j y_j + (1 - P_j) z_{j-1}, advanced where a token ends."""
        if self.cfg.pooling == "select":
            return super().step_token_output(y_t, a_t, p_t, last, state)
        gate = p_t.clamp(P_MIN, 1 - P_MIN)[:, None]  # (B,1)
        return torch.where(a_t[:, None], gate * y_t.float() + (1 - gate) * last, last)  # fp32, as ema_scan

    def step_upsample(self, x_t: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return x_t + last.to(x_t.dtype)  # the fp32 EMA added in the encoder's dtype, as `upsample` adds it

    def upsample(self, y_tok: torch.Tensor, x: torch.Tensor, tokens: Tokens, out: BoundaryOutput) -> torch.Tensor:
        """Byte t gets X_t + STE(c_t) z_{c(t)}, z the EMA of token outputs (auto), or X_t + Y'_{c(t)} (select)."""
        if self.cfg.pooling == "select":
            return distribute_add(y_tok, x, tokens)
        B, T, D = x.shape
        gate = out.probs.gather(1, tokens.pos).clamp(P_MIN, 1 - P_MIN)  # (B,M) P_j = p at token j's boundary
        z = ema_scan(y_tok, gate)  # (B,M,D) fp32; padded rows sit after the real ones and never feed them
        z = z.gather(1, tokens.index.unsqueeze(-1).expand(B, T, D))  # (B,T,D) z_{c(t)}
        p = out.probs  # (B,T)
        c = torch.where(out.mask, p, 1 - p)  # (B,T) confidence in the decision taken
        ste = (1 + (c - c.detach())).unsqueeze(-1)  # (B,T,1) forward exactly 1, backward dc
        return x + (ste * z).to(x.dtype)

    def losses(self, out, logp, logp_early, valid, reduce=None):
        # Per micro-batch, as H-Net's train utils compute it: `reduce` is not used.
        keep = (valid & out.free).float()  # (B,T) decided, non-padding positions
        n = keep.sum().clamp(min=1)
        f_hard = (out.mask.float() * keep).sum() / n  # F: fraction of hard boundaries (no gradient)
        g_mean = (out.probs * keep).sum() / n  # G: mean boundary probability
        loss = ratio_loss(f_hard, g_mean, self.N)
        return {
            "loss/ratio": self.cfg.ratio_loss_weight * loss,
            "boundary/p_mean": g_mean.detach(),
            "boundary/ratio_loss": loss.detach(),
        }
