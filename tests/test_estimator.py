"""The score-function estimator: exact enumeration, returns, advantages, sampling, rate targeting."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from learntok.boundaries.learned import LearnedBoundaries, LearnedConfig
from learntok.boundaries.reinforce import (
    SCAN_MAX_WINDOW,
    _scan_sample,
    batch_relative_advantage,
    discounted_returns,
    reference_returns,
    reference_sample,
    sample_window_policy,
    window_logits,
)


@pytest.mark.parametrize("T,gamma,chunk", [(1, 0.99, 256), (37, 0.9, 8), (600, 0.99, 256), (4096, 0.99, 256),
                                           (100, 1.0, 16)])
def test_discounted_returns_equal_loop(T, gamma, chunk):
    r = torch.randn(3, T, dtype=torch.float64)
    torch.testing.assert_close(discounted_returns(r, gamma, chunk), reference_returns(r, gamma), rtol=1e-9,
                               atol=1e-9)


def test_discounted_returns_float32_long_sequence_is_accurate():
    r = torch.randn(2, 4096)
    ref = reference_returns(r.double(), 0.99)
    torch.testing.assert_close(discounted_returns(r, 0.99).double(), ref, rtol=1e-4, atol=1e-4)


def test_discounted_returns_stay_fp32_under_bf16_autocast():
    """The forward pass runs under bf16 autocast on a GPU (and with --precision bf16-mixed): the returns'
    matmuls must not run in bf16 (that rounds returns of ~10 by ~1e-2)."""
    r = torch.randn(4, 1024)
    ref = discounted_returns(r, 0.99)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = discounted_returns(r, 0.99)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


def test_discounted_returns_make_no_fp32_matmul_that_tf32_could_round():
    """On a GPU with TF32 on (training enables it under bf16-mixed) an fp32 matmul keeps 10 mantissa bits:
    returns of ~10 off by ~1e-2, the error autocast was kept out for. Every matmul of the returns runs in
    float64, seen by a dispatch-mode recorder (device-independent), and the result keeps r's dtype."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("mm", "bmm", "addmm", "baddbmm", "matmul"):
                self.dtypes.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    r = torch.randn(2, 600)
    with Matmuls() as rec:
        g = discounted_returns(r, 0.99)
    assert rec.dtypes and set(rec.dtypes) == {torch.float64}
    assert g.dtype == torch.float32


def test_batch_centring_zero_mean_per_position():
    g = torch.randn(5, 30)
    valid = torch.ones(5, 30, dtype=torch.bool)
    valid[3, 20:] = False  # padding at the end of one row
    a = batch_relative_advantage(g, valid)
    mean = (a * valid).sum(0) / valid.sum(0)
    assert mean.abs().max() < 1e-6
    assert (a[~valid] == 0).all()
    # a padded entry does not shift the other rows' baseline
    g2 = g.clone()
    g2[3, 20:] = 1e6
    assert torch.equal(batch_relative_advantage(g2, valid), a)


@pytest.mark.parametrize("w,cap", [(0, 0.0), (1, 6.0), (3, 0.0), (8, 6.0), (10, 0.0)])
def test_window_sampler_equals_sequential_reference(w, cap):
    """Both parallel samplers (Jacobi, as run eagerly, and the state scan, as run under torch.compile) draw
    exactly what the one-byte-at-a-time sampler draws from the same uniforms."""
    torch.manual_seed(w)
    B, T = 4, 300
    base = torch.randn(B, T)
    coef = 3 * torch.randn(B, T, w)  # strong dependence on previous boundaries: long Jacobi chains
    u = torch.rand(B, T)
    forced = torch.zeros(B, T, dtype=torch.bool)
    forced[:, 0] = True
    forced[:, 7::50] = True  # forced positions inside the sequence too
    reference = reference_sample(base, coef, u, forced, cap)
    fast, rounds = sample_window_policy(base, coef, u, forced, cap)
    assert torch.equal(fast, reference)
    assert rounds <= T + 1
    if 0 < w <= SCAN_MAX_WINDOW:
        scanned, steps = _scan_sample(base, coef, u, forced, cap)
        assert torch.equal(scanned, reference) and steps == 1 + math.ceil(math.log2(T))


def _toy_problem(n=6, w=2, seed=0):
    """A window policy over n bytes and causal per-byte rewards r_k(a_<=k) that depend strongly on a_k."""
    g = torch.Generator().manual_seed(seed)
    base = (0.5 * torch.randn(n, generator=g)).requires_grad_()
    coef = (0.8 * torch.randn(n, w, generator=g)).requires_grad_()
    v = torch.randn(n, generator=g)
    tri = torch.tril(torch.randn(n, n, generator=g)) + 2 * torch.eye(n)

    def rewards(a: torch.Tensor) -> torch.Tensor:  # (N,n) {0,1} -> (N,n): log sigmoid(v_k + sum_{j<=k} M_kj a_j)
        return torch.nn.functional.logsigmoid(v + a.float() @ tri.T)

    return base, coef, rewards


def _log_pi(base, coef, a):
    lg = window_logits(base.expand(a.shape[0], -1), coef.expand(a.shape[0], -1, -1), a)
    af = a.float()
    return af * torch.nn.functional.logsigmoid(lg) + (1 - af) * torch.nn.functional.logsigmoid(-lg)  # (N,n)


def _z_scores(drop_own_reward: bool, N=40000):
    base, coef, rewards = _toy_problem()
    n = base.shape[0]
    # Exact gradient of E_a[sum_k r_k(a)] by enumerating all 2^n boundary sequences.
    allseq = torch.tensor(list(itertools.product([0, 1], repeat=n)), dtype=torch.bool)  # (2^n, n)
    prob = _log_pi(base, coef, allseq).sum(1).exp()
    exact = torch.autograd.grad((prob * rewards(allseq).sum(1)).sum(), (base, coef))
    # Monte-Carlo: per-decision REINFORCE with gamma = 1 and no centring, per-sample gradients.
    g = torch.Generator().manual_seed(1)
    u = torch.rand(N, n, generator=g)
    forced = torch.zeros(N, n, dtype=torch.bool)
    a, _ = sample_window_policy(base.detach().expand(N, -1), coef.detach().expand(N, -1, -1), u, forced, 0.0)
    ret = discounted_returns(rewards(a), 1.0)
    if drop_own_reward:  # the biased control: decision t credited only with later rewards
        ret = ret - rewards(a)
    b_rep = base.detach().repeat(N, 1).requires_grad_()
    c_rep = coef.detach().repeat(N, 1, 1).requires_grad_()
    lg = window_logits(b_rep, c_rep, a)
    af = a.float()
    logp = af * torch.nn.functional.logsigmoid(lg) + (1 - af) * torch.nn.functional.logsigmoid(-lg)
    per_sample = torch.autograd.grad((logp * ret.detach()).sum(), (b_rep, c_rep))
    zs = []
    for ps, ex in zip(per_sample, exact):
        ps = ps.reshape(N, -1)
        se = ps.std(0) / N**0.5
        diff = (ps.mean(0) - ex.reshape(-1)).abs()
        # Zero spread (coefficients that look before the sequence start): the mean must be exact.
        zs.append(torch.where(se > 0, diff / se.clamp(min=1e-30), torch.where(diff < 1e-7, 0.0, float("inf"))))
    return torch.cat(zs)


def test_reinforce_is_unbiased_against_exact_enumeration():
    z = _z_scores(drop_own_reward=False)
    assert z.max() < 4.5, z


def test_biased_estimator_fails_the_same_check():
    z = _z_scores(drop_own_reward=True)
    assert z.max() > 4.5, z


def _policy_losses(cfg: LearnedConfig):
    """A policy on random encoder states x (4,20,8) with gradient, its draw and its loss terms on random
    per-byte log-likelihoods: (policy, x, out, logp, logp_early, valid, terms)."""
    torch.manual_seed(0)
    pol = LearnedBoundaries(cfg, 8).train()
    x = torch.randn(4, 20, 8, requires_grad=True)
    out = pol.propose(x, torch.zeros(4, 20, dtype=torch.long), noise=torch.rand(4, 20), generator=None)
    logp, logp_early = torch.randn(4, 20), torch.randn(4, 20)
    valid = torch.ones(4, 20, dtype=torch.bool)
    return pol, x, out, logp, logp_early, valid, pol.losses(out, logp, logp_early, valid)


def test_policy_loss_is_minus_logprob_times_advantage():
    cfg = LearnedConfig(policy_window=2, lambda_policy=1.0, lambda_target=1.0)
    pol, x, out, logp, logp_early, valid, terms = _policy_losses(cfg)
    adv = batch_relative_advantage(discounted_returns(logp - logp_early, cfg.gamma), valid)
    decided = torch.ones_like(valid)
    decided[:, 0] = False  # a_0 = 1 is forced (BOS); nothing else is without --force-last
    expected = -(out.log_prob * adv)[decided].mean()
    torch.testing.assert_close(terms["loss/policy"], expected)
    # The forced a_0 carries no policy gradient: byte 0's encoder state feeds only a_0's logit (every policy
    # logit l_t reads X_t), so the loss does not depend on it at all, while it does on byte 1's.
    g = torch.autograd.grad(terms["loss/policy"], x)[0]  # (B,T,D)
    assert out.mask[:, 0].all() and (out.probs[:, 0] == 1).all()
    assert g[:, 0].abs().max() == 0 and g[:, 1].abs().max() > 0


def test_rate_targeting_alone_drives_mean_p_to_target():
    torch.manual_seed(0)
    cfg = LearnedConfig(policy_window=2, target_rate=0.2, lambda_target=1.0)
    pol = LearnedBoundaries(cfg, 16).train()
    with torch.no_grad():
        pol.proj.weight.normal_(0, 0.1)
        pol.proj.weight[0].fill_(2.0)  # inputs have a positive mean: the content term starts p far above target
    x = torch.randn(8, 64, 16) + 2.0
    opt = torch.optim.Adam(pol.parameters(), lr=0.05)
    valid = torch.ones(8, 64, dtype=torch.bool)
    zeros = torch.zeros(8, 64)
    start = None
    for _ in range(300):
        out = pol.propose(x, zeros.long(), noise=None, generator=None)
        terms = pol.losses(out, zeros, zeros, valid)
        start = float(terms["boundary/p_mean"]) if start is None else start
        opt.zero_grad()
        terms["loss/target"].backward()
        opt.step()
    assert abs(start - 0.2) > 0.05
    assert abs(float(terms["boundary/p_mean"]) - 0.2) < 0.01


def test_value_baseline_is_subtracted_and_trained_on_its_own():
    cfg = LearnedConfig(policy_window=0, lambda_policy=1.0, lambda_target=1.0, value_baseline=True)
    pol, x, out, logp, logp_early, valid, terms = _policy_losses(cfg)
    g = discounted_returns(logp - logp_early, cfg.gamma)
    adv = batch_relative_advantage(g - out.value.detach(), valid)
    torch.testing.assert_close(terms["loss/policy"], -(out.log_prob * adv)[out.free].mean())
    torch.testing.assert_close(terms["loss/value"], cfg.lambda_policy * ((out.value - g) ** 2).mean())
    # The value loss trains the value head only: nothing reaches the encoder state or the policy.
    assert torch.autograd.grad(terms["loss/value"], x, allow_unused=True)[0] is None
    grads = torch.autograd.grad(terms["loss/value"], [*pol.proj.parameters(), *pol.value.parameters()],
                                allow_unused=True)
    assert grads[0] is None and all(gr is not None for gr in grads[1:])


def test_leave_one_out_advantage_subtracts_the_other_samples_mean():
    from learntok.boundaries.reinforce import leave_one_out_advantage

    g = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0], [0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])  # 2 texts x 3
    keep = torch.ones(6, 2, dtype=torch.bool)
    keep[3, 1] = False  # a position that is not trained neither gets an advantage nor serves as a baseline
    a = leave_one_out_advantage(g, keep, 3)
    torch.testing.assert_close(a[:3], torch.tensor([[1 - 4.0, 2 - 3.5], [3 - 3.0, 6 - 1.5], [5 - 2.0, 1 - 4.0]]))
    torch.testing.assert_close(a[3:], torch.tensor([[0 - 1.5, 0.0], [1 - 1.0, 1 - 2.0], [2 - 0.5, 2 - 1.0]]))
    with pytest.raises(ValueError, match="groups of 4"):
        leave_one_out_advantage(g, keep, 4)


def test_the_k_samples_row_layout_is_one_contract_of_the_loop_and_the_baseline(tmp_path, text_corpus, monkeypatch):
    """--policy-samples K: the training loop lays out its rows with `repeat_samples` and the leave-one-out
    baseline groups them with `sample_groups`. Either side changing the layout without the other fails here:
    the loop's rows, grouped, must be K copies of one text, and K equal returns of one text leave no advantage."""
    from learntok.boundaries import boundary_config
    from learntok.boundaries.base import repeat_samples, sample_groups
    from learntok.boundaries.reinforce import leave_one_out_advantage
    from learntok.model.lm import ByteLM
    from learntok.train import train

    from .conftest import tiny_train_config

    k = 2
    texts = torch.arange(10.0).view(2, 5)
    rows = repeat_samples(texts, k)  # (4, 5)
    assert torch.equal(sample_groups(rows, k), texts[:, None].expand(2, k, 5))
    assert not leave_one_out_advantage(rows, torch.ones(4, 5, dtype=torch.bool), k).any()
    seen, real = [], ByteLM.forward

    def spy(self, ids, *a, **kw):
        if self.training and torch.is_grad_enabled():
            seen.append(ids.clone())
        return real(self, ids, *a, **kw)

    monkeypatch.setattr(ByteLM, "forward", spy)
    train(tiny_train_config(tmp_path / "run", text_corpus, max_steps=1, batch_size=4,
                            boundary=boundary_config("learned", policy_samples=k)), log=lambda *_: None)
    (ids,) = seen
    groups = sample_groups(ids, k)  # (2, K, T)
    assert torch.equal(groups, groups[:, :1].expand_as(groups)) and not torch.equal(groups[0, 0], groups[1, 0])


def test_k_samples_train_and_evaluate_on_batches_of_any_size(tmp_path, text_corpus):
    """Validation rows are distinct texts in batches of any size (here the last holds 2 rows with K = 3): the
    leave-one-out grouping applies to training rows only. It used to fail at the final evaluation."""
    from learntok.boundaries import boundary_config
    from learntok.train import train

    from .conftest import tiny_train_config

    res = train(tiny_train_config(tmp_path / "run", text_corpus, max_steps=2, batch_size=6,
                                  boundary=boundary_config("learned", policy_samples=3)), log=lambda *_: None)
    assert res.val_bpb > 0


@pytest.mark.parametrize("w", [0, 3])
def test_the_sampler_on_an_accelerator_makes_no_host_tensor(w):
    """On a device other than the CPU (here "meta", which runs the same code path as CUDA: the state scan) the
    sampler's outputs are all on that device and its round count is a plain number. A `torch.tensor(...)`
    made on the host used to sit in every compiled stage-1 graph (a host-to-device copy per step)."""
    from learntok.boundaries.reinforce import sample_window_policy

    B, T = 2, 16
    base, coef = torch.zeros(B, T, device="meta"), torch.zeros(B, T, w, device="meta")
    u, forced = torch.zeros(B, T, device="meta"), torch.zeros(B, T, dtype=torch.bool, device="meta")
    a, rounds = sample_window_policy(base, coef, u, forced, 6.0)
    assert a.device.type == "meta" and a.shape == (B, T)
    assert isinstance(rounds, float) and rounds == (1.0 if w == 0 else 1 + 4)  # the scan: log2(16) rounds
