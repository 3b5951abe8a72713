"""Dynamic token pooling (Nawrot et al. 2023): Gumbel-sigmoid STE, mean pooling, its gradient path, the
binomial prior, causality against the off-by-one upsampler, bf16 counts, and a short training run."""

from __future__ import annotations

import math

import pytest
import torch

from learntok.boundaries.dynamic import (
    DynamicOutput,
    gumbel_sigmoid_boundaries,
    mean_pool,
    nawrot_dense_weights,
)
from learntok.boundaries.pooling import distribute_add
from learntok.vocab import BOS

from .conftest import build_model


def _ids(B: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (B, T + 1), generator=g)
    ids[:, 0] = BOS
    return ids


def _boundaries(B: int, T: int, seed: int, p: float = 0.3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (leaf), mask and straight-through boundaries with position 0 forced."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, generator=g) + math.log(p / (1 - p))).requires_grad_()
    forced = torch.zeros(B, T, dtype=torch.bool)
    forced[:, 0] = True
    mask, ste = gumbel_sigmoid_boundaries(logits, torch.rand(B, T, generator=g), 1.0, forced)
    return logits, mask, ste


def test_gumbel_sigmoid_is_bernoulli_with_surrogate_gradient():
    """b_t = [s_t > 0.5] = [u_t > 1 - p_t] for every tau; b~ equals b exactly in the forward pass; its
    gradient is s(1 - s)/tau at free positions and 0 at forced ones."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) * 2
    u = torch.rand(4, 50, generator=g)
    forced = torch.zeros(4, 50, dtype=torch.bool)
    forced[:, 0] = forced[:, -1] = True
    for tau in (0.5, 1.0, 2.0):
        lg = logits.clone().requires_grad_()
        mask, ste = gumbel_sigmoid_boundaries(lg, u, tau, forced)
        assert torch.equal(mask, (u > 1 - torch.sigmoid(logits)) | forced)
        assert torch.equal(ste.detach(), mask.float())
        ste.sum().backward()
        s = torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / tau)
        torch.testing.assert_close(lg.grad, torch.where(forced, 0.0, s * (1 - s) / tau))
    assert 0.2 < mask[:, 1:-1].float().mean() < 0.8  # both outcomes occur: the comparison above is not vacuous


def test_mean_pool_equals_explicit_group_loop():
    """Token j = mean of X over bytes (pos_{j-1}, pos_j], at RoPE position pos_j; bytes after the last
    boundary are pooled nowhere; padding rows are zero."""
    B, T, D = 3, 40, 5
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
    _, mask, ste = _boundaries(B, T, 2)
    tok = mean_pool(x, mask, ste)
    M = int(mask.sum(1).max())
    assert tok.x.shape == (B, M, D)
    for b in range(B):
        pos = mask[b].nonzero().squeeze(1).tolist()
        assert tok.count[b] == len(pos) and tok.pos[b, :len(pos)].tolist() == pos
        start = 0
        for j, end in enumerate(pos):
            torch.testing.assert_close(tok.x[b, j], x[b, start:end + 1].mean(0))
            start = end + 1
        assert (tok.x[b, len(pos):] == 0).all()
        for t in range(T):  # byte t reads the latest group whose boundary is <= t
            assert pos[tok.index[b, t]] == max(p for p in pos if p <= t)
    assert mask.sum(1).min() < M and (mask.sum(1) > 1).all()  # padding and multi-group sequences occur
    assert not mask[:, -1].all()  # some sequence has an unfinished group


def test_pooling_matches_nawrot_dense_reference_with_gradient():
    """The O(B T D) scatter equals Nawrot's dense B x T x M matrices in output and in the gradient with
    respect to X and the straight-through boundaries; the dense upsample equals the gather and gives b~ zero
    gradient. Negative control: with hard (non-STE) boundaries the boundary gradient vanishes."""
    B, T, D = 2, 60, 6
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, D, generator=gen, requires_grad=True)
    logits, mask, ste = _boundaries(B, T, 4)
    count = mask.sum(1)
    M = int(count.max())
    real = (torch.arange(M) < count.unsqueeze(1)).unsqueeze(-1)  # (B,M,1) rows that are real tokens
    r = torch.randn(B, M, D, generator=gen)  # a random linear read-out of the real tokens

    def grads(pooled):
        loss = (pooled * r * real).sum()
        return [pooled.detach(), *torch.autograd.grad(loss, (x, logits), retain_graph=True, allow_unused=True)]

    ours = grads(mean_pool(x, mask, ste).x)
    dense = grads(torch.einsum("btm,btd->bmd", nawrot_dense_weights(ste, M, upsample=False), x))
    torch.testing.assert_close(ours[0] * real, dense[0] * real, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[1:], dense[1:]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert ours[2].abs().max() > 1e-3  # the LM-side gradient does reach the boundary logits
    hard = grads(mean_pool(x, mask, mask.float()).x)
    assert hard[2] is None or hard[2].abs().max() == 0

    y = torch.randn(B, M, D, generator=gen)
    tok = mean_pool(x.detach(), mask, ste)
    up = torch.einsum("btm,bmd->btd", nawrot_dense_weights(ste, M, upsample=True), y)
    torch.testing.assert_close(up + x.detach(), distribute_add(y, x.detach(), tok))
    (g_up,) = torch.autograd.grad((up * torch.randn(B, T, D, generator=gen)).sum(), logits)
    assert g_up.abs().max() == 0  # v / (v + 1e-9) over one entry: Nawrot's upsample passes b~ nothing


@pytest.mark.parametrize("pooling,reaches", [("auto", True), ("select", False)])
def test_lm_loss_reaches_predictor_only_through_mean_pooling(pooling, reaches, tmp_path):
    m = build_model("dynamic", tmp_path, prior_weight=0.0, pooling=pooling)
    seq = _ids(2, 48, 0)
    out = m(seq[:, :-1], seq[:, 1:], noise=torch.rand(2, 48, generator=torch.Generator().manual_seed(1)))
    out.loss.backward()
    g = [p.grad for p in m.boundary.mlp.parameters()]
    biggest = max(float(x.abs().max()) if x is not None else 0.0 for x in g)
    assert (biggest > 0) == reaches, biggest


def test_counts_exact_under_bf16_autocast(tmp_path):
    """T = 700 with p = 0.5 gives > 256 boundaries per sequence: counts, indices and RoPE positions under
    bf16 autocast equal fp32 and the int64 reference; a bf16 cumsum of the same boundaries does not."""
    B, T = 2, 700
    m = build_model("dynamic", tmp_path)
    with torch.no_grad():
        m.boundary.mlp[-1].weight.zero_()  # l_t = 0 exactly in any precision: both runs draw the same mask
    ids = _ids(B, T, 5)[:, :-1]
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(6))
    runs = []
    for dtype in (None, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            x = m.encode(ids)
            x = x.bfloat16() if dtype else x  # as a bf16 residual stream would be
            out = m.boundary.propose(x, ids, noise=noise, generator=None)
            runs.append((out, m.boundary.downsample(x, out), x))
    (o32, t32, x32), (o16, t16, x16) = runs
    assert x16.dtype == torch.bfloat16 and o16.ste.dtype == torch.float32
    assert torch.equal(o32.mask, o16.mask)
    ref = o32.mask.long().cumsum(1)  # (B,T) exact inclusive counts
    assert ref[:, -1].min() > 300
    for tok in (t32, t16):
        assert torch.equal(tok.count, ref[:, -1]) and torch.equal(tok.index, ref - 1)
        assert torch.equal(tok.pos, t32.pos)
    torch.testing.assert_close(t16.x.float(), mean_pool(x16.float(), o16.mask, o16.ste).x, rtol=2e-2, atol=2e-2)
    assert not torch.equal(o16.ste.bfloat16().cumsum(1).long(), ref)  # the pitfall is real at this length


def test_off_by_one_upsample_leaks(tmp_path):
    """Negative control for the generic no-lookahead test: reading group c(t) + 1 (the null group dropped
    without re-indexing) lets bytes after t change the logits at t; the real upsample does not."""
    B, T, j = 3, 48, 20
    seq = _ids(B, T, 1)
    seq2 = seq.clone()
    seq2[:, j:] = _ids(B, T, 2)[:, j:]
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(3))

    def off_by_one(y, x, tokens, out):
        y = torch.cat([y, torch.zeros_like(y[:, :1])], 1)  # (B,M+1,D): a row past the end reads zero
        idx = (tokens.index + 1).clamp(max=y.shape[1] - 1)  # (B,T)
        return x + y.gather(1, idx.unsqueeze(-1).expand_as(x))

    diffs = []
    for leaky in (False, True):
        m = build_model("dynamic", tmp_path)
        if leaky:
            m.boundary.upsample = off_by_one
        o1, o2 = (m(s[:, :-1], noise=noise) for s in (seq, seq2))
        assert torch.equal(o1.boundaries.mask[:, :j], o2.boundaries.mask[:, :j])
        diffs.append(float((o1.logits[:, :j] - o2.logits[:, :j]).abs().max().detach()))
    assert diffs[0] < 1e-5 and diffs[1] > 1e-3, diffs


def test_binomial_prior_matches_reference(tmp_path):
    """L_B = -mean_b log Binomial(k_b; n_b, alpha) / n_b over free, valid positions, with the digamma
    gradient in k; forced positions and padding count in neither k nor n."""
    alpha, w = 0.2, 0.7
    m = build_model("dynamic", tmp_path, target_rate=alpha, prior_weight=w)
    B, T = 3, 30
    logits, mask, ste = _boundaries(B, T, 7)
    free = torch.ones(B, T, dtype=torch.bool)
    free[:, 0] = False
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[2, 20:] = False  # padding
    out = DynamicOutput(mask=mask, probs=torch.sigmoid(logits.detach()), free=free, ste=ste)
    terms = m.boundary.losses(out, None, None, valid)
    keep = free & valid
    k, n = (mask & keep).sum(1).float(), keep.sum(1).float()
    lp = torch.distributions.Binomial(total_count=n, probs=torch.tensor(alpha)).log_prob(k)
    torch.testing.assert_close(terms["loss/prior"], -w * (lp / n).mean())
    torch.testing.assert_close(terms["boundary/p_mean"], torch.sigmoid(logits.detach())[keep].mean())
    (g,) = torch.autograd.grad(terms["loss/prior"], ste)
    dk = torch.digamma(n - k + 1) - torch.digamma(k + 1) + math.log(alpha / (1 - alpha))  # d log pmf / dk
    torch.testing.assert_close(g, (-w * dk / n / B).unsqueeze(1) * keep)
    # baselines.md's worked number: at T = 4096, k = 800 the slope is +0.029 (pulls k up toward 819)
    kk = torch.tensor(800.0, requires_grad=True)
    logpmf = torch.lgamma(torch.tensor(4097.0)) - torch.lgamma(kk + 1) - torch.lgamma(4097 - kk) \
        + kk * math.log(alpha) + (4096 - kk) * math.log(1 - alpha)
    logpmf.backward()
    assert abs(float(kk.grad) - 0.029) < 1e-3


def test_eval_boundaries_fixed_seed_and_greedy(tmp_path):
    m = build_model("dynamic", tmp_path).eval()
    ids = _ids(2, 64, 8)[:, :-1]
    x = m.encode(ids)
    a = m.boundary.propose(x, ids, noise=None, generator=torch.Generator().manual_seed(9))
    b = m.boundary.propose(x, ids, noise=None, generator=torch.Generator().manual_seed(9))
    u = torch.rand(2, 64, generator=torch.Generator().manual_seed(9))
    p = torch.sigmoid(m.boundary.mlp(m.boundary.norm(x)).squeeze(-1))
    assert torch.equal(a.mask, b.mask)
    assert torch.equal(a.mask[:, 1:], (u > 1 - p)[:, 1:])
    greedy = build_model("dynamic", tmp_path, eval_boundaries="greedy").eval()
    gm = greedy.boundary.propose(x, ids, noise=None, generator=None).mask
    assert torch.equal(gm[:, 1:], (p > 0.5)[:, 1:]) and gm[:, 0].all()
    assert not torch.equal(gm, a.mask)


def _train_rate(tmp_path, target: float, steps: int = 12) -> tuple[float, float]:
    """Mean boundary probability on a fixed batch before and after `steps` AdamW steps from p ~ 0.6."""
    m = build_model("dynamic", tmp_path, target_rate=target)
    with torch.no_grad():
        m.boundary.mlp[-1].weight.mul_(0.1)
        m.boundary.mlp[-1].bias.fill_(math.log(0.6 / 0.4))
    opt = torch.optim.AdamW(m.parameters(), lr=1.5e-2, weight_decay=0.0)
    probe = _ids(4, 64, 100)[:, :-1]
    gen = torch.Generator().manual_seed(0)

    def rate() -> float:
        with torch.no_grad():
            return float(m(probe, generator=torch.Generator().manual_seed(1)).boundaries.probs[:, 1:].mean())

    before = rate()
    for step in range(steps):
        seq = _ids(2, 64, step)
        m(seq[:, :-1], seq[:, 1:], generator=gen).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return before, rate()


def test_training_moves_rate_toward_target(tmp_path):
    """From p ~ 0.6, twelve steps pull the rate down toward 0.2; control: with target 0.9 it goes up."""
    before, down = _train_rate(tmp_path, 0.2)
    _, up = _train_rate(tmp_path, 0.9)
    assert abs(before - 0.6) < 0.05
    assert abs(down - 0.2) < abs(before - 0.2) / 2 and abs(up - 0.9) < abs(before - 0.9) / 2, (before, down, up)


def test_running_mean_matches_mean_pool_in_bf16_past_256_bytes():
    """Generation's running group mean (RunningMean) equals the full pass's mean_pool with bf16 states and a
    group longer than 256 bytes, where a bf16 count would stop growing (256 + 1 = 256 in bf16)."""
    from learntok.boundaries.pooling import RunningMean

    B, T, D = 2, 600, 4
    x = (torch.randn(B, T, D, generator=torch.Generator().manual_seed(3)) + 1).bfloat16()
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, 0] = mask[:, -1] = True  # one group of 599 bytes
    mask[1, 300] = True
    full = mean_pool(x, mask, mask.float())
    run = RunningMean()
    outs = [run.update(x[:, t], mask[:, t]) for t in range(T)]
    assert outs[-1].dtype == torch.bfloat16
    for b in range(B):
        for j, t in enumerate(mask[b].nonzero().squeeze(1).tolist()):  # the mean at each boundary is token j
            torch.testing.assert_close(outs[t][b], full.x[b, j], rtol=1e-2, atol=1e-2)  # bf16 rounding
