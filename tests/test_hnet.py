"""H-Net dynamic chunking (baselines.md §2c): EMA closed form vs loop, routing init, gradients, ratio loss."""

from __future__ import annotations

import pytest
import torch

from learntok.boundaries.base import BoundaryOutput
from learntok.boundaries.hnet import P_MIN, ema_scan, ema_scan_loop, ratio_loss
from learntok.boundaries.pooling import distribute_add, select
from learntok.vocab import BOS

from .conftest import build_model, sample_docs


def _text_batch(B: int, T: int, seed: int) -> torch.Tensor:
    """(B,T+1) ids: BOS + T bytes of real text from random offsets."""
    data = b"".join(sample_docs())
    starts = torch.randint(0, len(data) - T, (B,), generator=torch.Generator().manual_seed(seed)).tolist()
    return torch.tensor([[BOS, *data[s:s + T]] for s in starts])


def _rotate_query(m, seed: int = 0) -> None:
    """Replace W_q by a random rotation: adjacent states become unrelated, p ~ 0.5 and many boundaries."""
    d = m.boundary.w_q.shape[0]
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed)))
    with torch.no_grad():
        m.boundary.w_q.copy_(q)


@pytest.mark.parametrize("M,block", [(1, 128), (37, 128), (37, 8), (64, 16), (200, 7)])
def test_ema_closed_form_matches_loop(M, block):
    """Values and gradients of the blocked closed form (fp32) equal the sequential recurrence (fp64), including
    gates at both clamp limits (long runs of P = 1e-4 drive the cumulative log-decay to -9e-4 M; P = 1 - 1e-4
    to -9.2 M)."""
    g = torch.Generator().manual_seed(M)
    y = torch.randn(3, M, 5, generator=g, dtype=torch.float64)
    gate = torch.rand(3, M, generator=g, dtype=torch.float64)
    gate[1] = P_MIN  # slow decay: the state remembers far back
    gate[2, ::2] = 1 - P_MIN  # near-resets
    gate = gate.clamp(P_MIN, 1 - P_MIN)
    y32, gate32 = y.float().requires_grad_(), gate.float().requires_grad_()
    y64, gate64 = y.clone().requires_grad_(), gate.clone().requires_grad_()
    z = ema_scan(y32, gate32, block=block)
    ref = ema_scan_loop(y64, gate64)
    assert z.dtype == torch.float32
    torch.testing.assert_close(z.double(), ref, rtol=0, atol=2e-6)
    w = torch.randn(3, M, 5, generator=g, dtype=torch.float64)
    (z.double() * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(y32.grad.double(), y64.grad, rtol=0, atol=1e-5)
    torch.testing.assert_close(gate32.grad.double(), gate64.grad, rtol=1e-4, atol=1e-4)
    if M > 1:  # negative control: the recurrence really smooths (it is not P_k y_k)
        assert not torch.allclose(ref, y * gate.unsqueeze(-1), atol=1e-3)


def test_ema_with_padding_tokens_and_upsample_reference(tmp_path):
    """With real token counts differing per row (padding after the real tokens), upsample gives each byte
    X_t + z_{c(t)} where z is the loop EMA over that row's *real* tokens only, P_j = clamp(p at token j's
    boundary); padding rows are finite. The STE factor is exactly 1 in the forward pass."""
    m = build_model("hnet", tmp_path).boundary
    B, T, D = 3, 30, 6
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, D, generator=g)
    probs = torch.rand(B, T, generator=g)
    probs[:, 0] = 1.0
    mask = probs > 0.5
    mask[2, 1:] = False  # one row with a single token: maximal padding
    mask[0, 1:] = True  # one row where every byte is a token: no padding
    out = BoundaryOutput(mask=mask, probs=probs)
    tokens = select(x, mask)
    assert tokens.count.tolist()[0] == T and tokens.count.tolist()[2] == 1
    y_tok = torch.randn(B, tokens.x.shape[1], D, generator=g)
    got = m.upsample(y_tok, x, tokens, out)  # (B,T,D)
    for b in range(B):
        pos = mask[b].nonzero().squeeze(1)  # boundary bytes of row b
        gate = probs[b, pos].clamp(P_MIN, 1 - P_MIN).double()[None]  # (1,M_b)
        z = ema_scan_loop(y_tok[b, : len(pos)].double()[None], gate)[0]  # (M_b,D)
        c = torch.searchsorted(pos, torch.arange(T), right=True) - 1  # latest token at or before t
        torch.testing.assert_close(got[b].double(), x[b].double() + z[c], rtol=0, atol=1e-6)
    z_all = ema_scan(y_tok, probs.gather(1, tokens.pos).clamp(P_MIN, 1 - P_MIN))
    assert torch.isfinite(z_all).all()


def test_identity_init_survives_bytelm_construction(tmp_path):
    """ByteLM re-initialises every nn.Linear after building the strategy; W_q, W_k must stay the identity, so
    at init p_t = (1 - cos(h_{t-1}, h_t)) / 2 with h the RMS-normalised encoder output."""
    m = build_model("hnet", tmp_path)
    d = m.cfg.d_model
    assert torch.equal(m.boundary.w_q, torch.eye(d)) and torch.equal(m.boundary.w_k, torch.eye(d))
    ids = _text_batch(2, 40, 0)[:, :-1]
    with torch.no_grad():
        x = m.encode(ids)  # (B,T,D)
        p = m(ids).boundaries.probs  # (B,T)
    h = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()  # RMSNorm with unit weight
    cos = (h[:, :-1] * h[:, 1:]).sum(-1) / (h[:, :-1].norm(dim=-1) * h[:, 1:].norm(dim=-1))  # (B,T-1)
    torch.testing.assert_close(p[:, 1:], (1 - cos) / 2, rtol=0, atol=1e-6)
    # Negative control: a rotated W_q changes p, so the comparison above is not vacuous.
    _rotate_query(m)
    with torch.no_grad():
        assert (m(ids).boundaries.probs[:, 1:] - (1 - cos) / 2).abs().max() > 0.05
    m.boundary.reset_parameters()  # the hook a model-wide re-init would call: back to the identity
    assert torch.equal(m.boundary.w_q, torch.eye(d))


@pytest.mark.parametrize("force_last", [False, True])
def test_first_position_always_a_boundary_with_p_one(force_last, tmp_path):
    """p_0 = 1 and b_0 = 1 in train and eval, whatever the routing weights; both are excluded from the
    trained decisions (and so is the last byte with --force-last). Hard decisions are [p > 0.5] in eval
    and train alike, independent of noise."""
    m = build_model("hnet", tmp_path, force_last=force_last)
    ids = _text_batch(3, 50, 1)[:, :-1]
    for rotate in (False, True):
        if rotate:
            _rotate_query(m, seed=3)
        for train in (True, False):
            m.train(train)
            with torch.no_grad():
                out = [m(ids, noise=torch.rand(3, 50, generator=torch.Generator().manual_seed(s))).boundaries
                       for s in (0, 1)]
            o = out[0]
            assert (o.probs[:, 0] == 1).all() and o.mask[:, 0].all() and not o.free[:, 0].any()
            assert torch.equal(o.mask, out[1].mask)  # no noise in the decision
            free = o.free
            assert torch.equal(o.mask[free], o.probs[free] > 0.5)
            if force_last:
                assert (o.probs[:, -1] == 1).all() and o.mask[:, -1].all() and not o.free[:, -1].any()
            assert o.free[:, 1:-1].all()


@pytest.mark.parametrize("rotate", [False, True])
def test_router_learns_from_lm_loss_alone(rotate, tmp_path):
    """Ratio weight 0: W_q, W_k still get gradient from the LM loss (through P in the EMA and the STE(c)
    factor). Negative control: with pooling = select (hard select + distribute-add) they get none."""
    ids = _text_batch(2, 48, 2)
    grads = {}
    for pooling in ("auto", "select"):
        m = build_model("hnet", tmp_path, ratio_loss_weight=0.0, pooling=pooling)
        if rotate:
            _rotate_query(m)  # many boundaries: the EMA gate path is exercised, not just STE(c)
        out = m(ids[:, :-1], ids[:, 1:])
        assert out.terms["loss/ratio"] == 0
        out.loss.backward()
        grads[pooling] = [p.grad for p in (m.boundary.w_q, m.boundary.w_k)]
    for gr in grads["auto"]:
        assert gr is not None and torch.isfinite(gr).all() and gr.abs().max() > 0
    for gr in grads["select"]:
        assert gr is None or gr.abs().max() == 0


def test_select_pooling_is_distribute_add(tmp_path):
    m = build_model("hnet", tmp_path, pooling="select").boundary
    x, y = torch.randn(2, 12, 4), torch.randn(2, 12, 4)
    probs = torch.rand(2, 12)
    probs[:, 0] = 1
    out = BoundaryOutput(mask=probs > 0.5, probs=probs)
    tok = select(x, out.mask)
    y = y[:, : tok.x.shape[1]]
    assert torch.equal(m.upsample(y, x, tok, out), distribute_add(y, x, tok))


@pytest.mark.parametrize("n_bound", [2, 5, 9])
def test_ratio_loss_gradient_sign_follows_NF_minus_one(n_bound, tmp_path):
    """dL/dp_t = alpha N (N F - 1) / ((N - 1) n) at every decided, valid position (G's gradient spread over the
    n positions): G is pushed down when F > 1/N, up when F < 1/N, not at all at F = 1/N. Forced and padded
    positions get no gradient and do not count in F or G."""
    alpha, rate = 0.5, 0.2
    m = build_model("hnet", tmp_path, ratio_loss_weight=alpha, target_rate=rate, force_last=True).boundary
    N, T = 1 / rate, 27  # 25 decided positions (0 and T-1 forced) of which 25 valid
    probs = torch.rand(1, T, generator=torch.Generator().manual_seed(n_bound)).requires_grad_()
    mask = torch.zeros(1, T, dtype=torch.bool)
    mask[0, 1:1 + n_bound] = True
    mask[0, [0, T - 1]] = True
    free = torch.ones_like(mask)
    free[0, [0, T - 1]] = False
    valid = torch.ones_like(mask)
    valid[0, 1 + n_bound] = False  # a padded target: its decision is excluded too
    n = 24.0
    terms = m.losses(BoundaryOutput(mask=mask, probs=probs, free=free), None, None, valid)
    terms["loss/ratio"].backward()
    F_, G = n_bound / n, (probs.detach()[0, 1:T - 1].sum() - probs.detach()[0, 1 + n_bound]) / n
    torch.testing.assert_close(terms["boundary/p_mean"], G)
    torch.testing.assert_close(terms["loss/ratio"].detach(), alpha * ratio_loss(torch.tensor(F_), G, N))
    expect = alpha * N * (N * F_ - 1) / ((N - 1) * n)
    keep = free[0] & valid[0]
    torch.testing.assert_close(probs.grad[0, keep], torch.full((int(keep.sum()),), expect))
    assert (probs.grad[0, ~keep] == 0).all()
    assert {2: -1.0, 5: 1.0, 9: 1.0}[n_bound] == torch.sign(torch.tensor(N * F_ - 1)).item()


def test_ratio_loss_minimum_value():
    """L_ratio = 1 at F = G = 1/N, and at F = 1/N it does not depend on G."""
    N = 5.0
    assert abs(ratio_loss(0.2, 0.2, N) - 1.0) < 1e-12
    assert abs(ratio_loss(0.2, 0.9, N) - 1.0) < 1e-12
    assert ratio_loss(0.5, 0.5, N) > 1.0


def test_training_moves_rate_toward_target(tmp_path):
    """From the identity init the router is almost closed in our U-Net (Gemma-2 post-norm makes the first
    block's smooth attention output dominate the 0.02-scale embedding, so adjacent states are nearly parallel:
    rate ~ 0). 20 AdamW steps with the ratio loss open it to about target_rate; without it (negative control)
    the rate stays ~0. Weight 1 instead of the default 0.03 so that 20 steps suffice."""
    rates = {}
    for weight in (1.0, 0.0):
        m = build_model("hnet", tmp_path, ratio_loss_weight=weight)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        r = []
        for step in range(20):
            ids = _text_batch(4, 64, step)
            out = m(ids[:, :-1], ids[:, 1:])
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            r.append(out.boundaries.mask[:, 1:].float().mean().item())
        rates[weight] = r
    assert rates[1.0][0] < 0.05  # starts closed
    assert 0.1 < sum(rates[1.0][-5:]) / 5 < 0.35  # target 0.2
    assert max(rates[0.0][-5:]) < 0.05
