"""The estimator as the code computes it, against exact expectations: every batch of boundary patterns of a
small policy is enumerated and pushed through `LearnedBoundaries.losses` with its real settings, so the
expected update is known without Monte-Carlo noise.

What the paper's settings give, per row (J = E_a[sum_t r_t], r_t = log p_t(a) - log p_early_t):
- gamma = 1, no centring: exactly the gradient of J (reward-to-go drops only rewards a decision cannot reach);
- batch-relative centring with the row's own return in the mean: exactly (1 - 1/B) times the uncentred
  expectation (a shrinkage, not a change of direction);
- a learned value baseline V(X_t) (--value-baseline) subtracted before the centring: exactly the expectation
  without it, with a different text in each row (one that sees a_t, or the rewards it predicts, changes it);
- gamma < 1: the expectation of its own discounted estimator, which is not the gradient of J (a bias);
- std normalisation: a direction that differs from the gradient of J, the less so the larger the batch.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from learntok.boundaries.learned import LearnedBoundaries, LearnedConfig

T, D = 4, 3  # bytes per row (a_0 forced: 3 free decisions, 8 patterns), width


def _setup(**cfg):
    torch.manual_seed(0)
    base = dict(policy_window=1, logit_scale=1.0, target_rate=0.3, lambda_policy=1.0, lambda_target=0.0,
                logit_softcap=0.0, gamma=1.0)
    pol = LearnedBoundaries(LearnedConfig(**{**base, **cfg}), D).train()
    with torch.no_grad():
        pol.proj.weight.normal_(0, 1.0)
    return pol, *_text(1)


def _text(seed: int):
    """One text: its encoder states x (1,T,D), its per-byte log-likelihoods as a function of the boundaries,
    and its early-exit log-likelihoods (T,)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, D, generator=g)
    v = torch.randn(T, generator=g)
    m = 2 * torch.tril(torch.randn(T, T, generator=g), diagonal=-1) + torch.eye(T)  # decisions reach later bytes
    early = torch.randn(T, generator=g) - 1.0

    def logp(a: torch.Tensor) -> torch.Tensor:  # (B,T) causal per-byte log-likelihoods under boundaries a
        return torch.nn.functional.logsigmoid(v + a.float() @ m.T)

    return x, logp, early


def _patterns() -> torch.Tensor:
    free = torch.tensor(list(itertools.product([0, 1], repeat=T - 1)), dtype=torch.bool)
    return torch.cat([torch.ones(len(free), 1, dtype=torch.bool), free], 1)  # (8,T), a_0 = 1


def _forcing(patterns: torch.Tensor) -> torch.Tensor:
    """Uniforms that make the sampler draw exactly `patterns` (a_t = [u_t < p_t])."""
    return torch.where(patterns, torch.zeros(()), torch.full((), 1 - 1e-7))


def _batch_update(pol, x, logp, early, patterns: torch.Tensor, params, reduce=None) -> list[torch.Tensor]:
    """The per-row estimate of grad J that one batch of rows with these boundary patterns gives through
    `losses`: minus the gradient of loss/policy times the free decisions per row (the loss is a per-decision
    mean)."""
    B = len(patterns)
    out = pol.propose(x.expand(B, T, D), torch.zeros(B, T, dtype=torch.long), noise=_forcing(patterns),
                      generator=None)
    assert torch.equal(out.mask, patterns)
    terms = pol.losses(out, logp(out.mask), early.expand(B, T), torch.ones(B, T, dtype=torch.bool), reduce=reduce)
    return [-(T - 1) * g for g in torch.autograd.grad(terms["loss/policy"], params)]


def _log_pi(pol, x) -> torch.Tensor:
    """(8,) log-probability of each pattern under the policy, with gradient."""
    pats = _patterns()
    out = pol.propose(x.expand(len(pats), T, D), torch.zeros(len(pats), T, dtype=torch.long), noise=_forcing(pats),
                      generator=None)
    return out.log_prob[:, 1:].sum(1)


def _exact_gradient(pol, x, logp, early, params) -> list[torch.Tensor]:
    """grad of J = sum_a pi(a) sum_t r_t(a), by enumeration."""
    pats = _patterns()
    j = (_log_pi(pol, x).exp() * (logp(pats) - early).sum(1)).sum()
    return list(torch.autograd.grad(j, params))


def _expected_update(pol, x, logp, early, B: int, params, reduce=None) -> list[torch.Tensor]:
    """E over batches of B independent rows of `_batch_update`: every B-tuple of patterns, weighted."""
    pats = _patterns()
    pi = _log_pi(pol, x).detach().exp()  # (8,)
    total = [torch.zeros_like(p) for p in params]
    for combo in itertools.product(range(len(pats)), repeat=B):
        w = float(torch.prod(pi[list(combo)]))
        for acc, g in zip(total, _batch_update(pol, x, logp, early, pats[list(combo)], params, reduce)):
            acc += w * g
    return total


def _flat(gs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in gs])


def test_patterns_have_probabilities_that_sum_to_one():
    pol, x, _, _ = _setup()
    assert float(_log_pi(pol, x).detach().exp().sum()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("B", [1, 2, 3])
def test_centred_estimator_is_the_gradient_shrunk_by_one_minus_one_over_b(B):
    """gamma = 1 through the real losses: with B = 1 the centring removes everything (A = 0); otherwise the
    expected update is exactly (1 - 1/B) grad J: unbiased in direction, shrunk in size."""
    pol, x, logp, early = _setup()
    params = [pol.proj.weight]
    exact = _flat(_exact_gradient(pol, x, logp, early, params))
    expected = _flat(_expected_update(pol, x, logp, early, B, params))
    torch.testing.assert_close(expected, (1 - 1 / B) * exact, rtol=1e-4, atol=1e-6)
    if B > 1:  # the check can fail: the uncentred gradient itself is not what the centred estimator gives
        assert (expected - exact).norm() > 0.2 * exact.norm()


def test_discounting_is_the_expectation_of_its_own_estimator_not_the_gradient():
    """gamma < 1 credits a decision less for later rewards: its expected update (through the real losses) is a
    biased estimate of grad J, measurably so on this problem, and still exactly (1 - 1/B) times the expectation
    of the uncentred discounted estimator."""
    pol, x, logp, early = _setup(gamma=0.5)
    params = [pol.proj.weight]
    exact = _flat(_exact_gradient(pol, x, logp, early, params))
    expected = _flat(_expected_update(pol, x, logp, early, 2, params))
    pats = _patterns()
    pi = _log_pi(pol, x)
    r = logp(pats) - early  # (8,T)
    g = torch.stack([sum(0.5 ** j * r[:, t + j] for j in range(T - t)) for t in range(T)], 1)  # (8,T) returns
    out = pol.propose(x.expand(8, T, D), torch.zeros(8, T, dtype=torch.long), noise=_forcing(pats), generator=None)
    surrogate = (pi.detach().exp()[:, None] * out.log_prob[:, 1:] * g[:, 1:].detach()).sum()
    own = _flat(torch.autograd.grad(surrogate, params))
    torch.testing.assert_close(expected, 0.5 * own, rtol=1e-4, atol=1e-6)
    assert (own - exact).norm() > 0.1 * exact.norm()  # the bias: mostly in size on this problem


def test_normalisation_bends_the_direction_less_in_larger_batches():
    """Advantages divided by their batch standard deviation: the expected update's direction differs from
    grad J's, and the difference shrinks as the batch grows (exactly, B = 2, 3, 4)."""
    pol, x, logp, early = _setup(normalize_advantage=True)
    params = [pol.proj.weight]
    exact = _flat(_exact_gradient(pol, x, logp, early, params))
    cos = [float(torch.nn.functional.cosine_similarity(_flat(_expected_update(pol, x, logp, early, B, params)),
                                                       exact, dim=0)) for B in (2, 3, 4)]
    assert cos[0] < cos[1] < cos[2] < 1.0 - 1e-4, cos


def test_normalised_advantages_have_unit_spread():
    pol, x, logp, early = _setup(normalize_advantage=True)
    pats = _patterns()
    out = pol.propose(x.expand(8, T, D), torch.zeros(8, T, dtype=torch.long), noise=_forcing(pats), generator=None)
    terms = pol.losses(out, logp(pats), early.expand(8, T), torch.ones(8, T, dtype=torch.bool))
    n = 8 * (T - 1)
    assert float(terms["reinforce/adv_std"]) == pytest.approx((n / (n - 1)) ** 0.5, rel=0.05)


@pytest.mark.parametrize("detach", [True, False])
def test_a_detached_encoder_gets_no_policy_gradient(detach):
    pol, x, logp, early = _setup(detach_encoder=detach)
    xg = x.clone().requires_grad_()
    pats = _patterns()[[1, 6]]
    out = pol.propose(xg.expand(2, T, D), torch.zeros(2, T, dtype=torch.long), noise=_forcing(pats), generator=None)
    terms = pol.losses(out, logp(pats), early.expand(2, T), torch.ones(2, T, dtype=torch.bool))
    g_x, g_w = torch.autograd.grad(terms["loss/policy"], [xg, pol.proj.weight], allow_unused=True)
    assert g_w.abs().sum() > 0
    assert (g_x is None or not g_x.abs().sum()) == detach


@pytest.mark.parametrize("K", [2, 3])
def test_leave_one_out_over_samples_of_one_text_is_the_exact_gradient(K):
    """--policy-samples K: all K rows are samples of one text, each row's baseline the mean return of the other
    K - 1. Through the real losses the expected update is exactly grad J: no (1 - 1/B) shrinkage, no bias."""
    pol, x, logp, early = _setup(policy_samples=K)
    params = [pol.proj.weight]
    exact = _flat(_exact_gradient(pol, x, logp, early, params))
    torch.testing.assert_close(_flat(_expected_update(pol, x, logp, early, K, params)), exact, rtol=1e-4, atol=1e-6)
    pol1, *rest = _setup()  # the same policy (same seed) with the batch-mean baseline of eq. 17
    batch_mean = _flat(_expected_update(pol1, *rest, K, [pol1.proj.weight]))
    torch.testing.assert_close(batch_mean, (1 - 1 / K) * exact, rtol=1e-4, atol=1e-6)  # it shrinks


@pytest.mark.parametrize("B", [1, 2])
def test_a_lagged_batch_mean_is_an_unbiased_baseline(B):
    """--batch-stats lagged: every row's baseline is an earlier batch's per-position mean return, which does not
    depend on this batch's draws. Through the real losses the expected update is exactly grad J (no (1 - 1/B)
    shrinkage, even at B = 1), whatever the earlier batch was."""
    from learntok.train.parallel import FixedStats

    pol, x, logp, early = _setup()
    params = [pol.proj.weight]
    exact = _flat(_exact_gradient(pol, x, logp, early, params))
    pats = _patterns()[[2, 5, 7]]  # an earlier batch of the same policy: its statistics, as the loop keeps them
    out = pol.propose(x.expand(3, T, D), torch.zeros(3, T, dtype=torch.long), noise=_forcing(pats), generator=None)
    earlier = pol.losses(out, logp(pats), early.expand(3, T), torch.ones(3, T, dtype=torch.bool))["batch_stats"]
    assert float(earlier.g_sum.abs().sum()) > 0
    lagged = _flat(_expected_update(pol, x, logp, early, B, params, reduce=FixedStats(earlier)))
    torch.testing.assert_close(lagged, exact, rtol=1e-4, atol=1e-6)


def _value_policies(gamma: float):
    """The `_setup` policy without and with --value-baseline, sharing the policy weights; the value head's
    weights are random, so V(X_t) varies with the text and the position."""
    pol, *_ = _setup(gamma=gamma)
    pol_v, *_ = _setup(gamma=gamma, value_baseline=True)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        pol_v.proj.weight.copy_(pol.proj.weight)
        for p in pol_v.value.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return pol, pol_v


def _rows_update(pol, texts, patterns: torch.Tensor, params, tamper=None) -> list[torch.Tensor]:
    """`_batch_update` for a batch whose row b is text b of `texts` with boundaries patterns[b]. `tamper(out,
    logp)` may replace out.value first (the negative controls)."""
    B = len(patterns)
    x = torch.cat([t[0] for t in texts])  # (B,T,D)
    out = pol.propose(x, torch.zeros(B, T, dtype=torch.long), noise=_forcing(patterns), generator=None)
    assert torch.equal(out.mask, patterns)
    logp = torch.cat([t[1](patterns[b:b + 1]) for b, t in enumerate(texts)])  # (B,T)
    early = torch.stack([t[2] for t in texts])  # (B,T)
    if tamper is not None:
        out.value = tamper(out, logp - early)
    terms = pol.losses(out, logp, early, torch.ones(B, T, dtype=torch.bool))
    if out.value is not None:  # the value head's regression term reaches the value head only
        assert all(g is None for g in torch.autograd.grad(terms["loss/value"], params, retain_graph=True,
                                                          allow_unused=True))
    return [-(T - 1) * g for g in torch.autograd.grad(terms["loss/policy"], params)]


def _rows_expected(pol, texts, params, tamper=None) -> tuple[list[torch.Tensor], dict]:
    """E over independent rows (row b drawn from the policy on text b) of `_rows_update`, and every batch's
    update keyed by its patterns."""
    pats = _patterns()
    pis = [_log_pi(pol, t[0]).detach().exp() for t in texts]  # (8,) per text
    total, each = [torch.zeros_like(p) for p in params], {}
    for combo in itertools.product(range(len(pats)), repeat=len(texts)):
        w = float(torch.prod(torch.stack([pi[i] for pi, i in zip(pis, combo)])))
        each[combo] = _rows_update(pol, texts, pats[list(combo)], params, tamper)
        for acc, g in zip(total, each[combo]):
            acc += w * g
    return total, each


@pytest.mark.parametrize("B,gamma", [(2, 1.0), (3, 1.0), (2, 0.5)])
def test_a_learned_value_baseline_leaves_the_expected_update_unchanged(B, gamma):
    """--value-baseline through the real losses, with B different texts in the batch (on copies of one text
    the batch-relative centring would cancel V(X_t) in every batch): G_t - V(X_t) replaces G_t before the
    centring. V depends on the text and the position, not on a_t, so the expected policy update is exactly the
    one without the baseline: at gamma = 1, (1 - 1/B) times the mean over the texts of grad J (the centring's
    shrinkage), and at gamma < 1 the expectation of the discounted estimator (biased, but not by V). Each
    batch's update does change. Only the policy weights' gradient is compared: the value loss's gradient
    reaches the value head alone (asserted in `_rows_update`)."""
    texts = [_text(1 + b) for b in range(B)]
    pol, pol_v = _value_policies(gamma)
    value = pol_v.propose(torch.cat([t[0] for t in texts]), torch.zeros(B, T, dtype=torch.long), noise=None,
                          generator=torch.Generator().manual_seed(0)).value.detach()  # (B,T)
    assert float((value.amax(0) - value.amin(0))[1:].min()) > 0.2  # it varies across rows at every position
    without, each0 = _rows_expected(pol, texts, [pol.proj.weight])
    with_v, each_v = _rows_expected(pol_v, texts, [pol_v.proj.weight])
    without, with_v = _flat(without), _flat(with_v)
    torch.testing.assert_close(with_v, without, rtol=1e-4, atol=1e-6)
    if gamma == 1.0:
        exact = sum(_flat(_exact_gradient(pol, *t, [pol.proj.weight])) for t in texts) / B
        torch.testing.assert_close(with_v, (1 - 1 / B) * exact, rtol=1e-4, atol=1e-6)
    moved = max(float((_flat(each_v[c]) - _flat(each0[c])).norm()) for c in each0)
    assert moved > 0.5 * float(without.norm())  # the baseline is not a no-op batch by batch


def test_a_baseline_that_sees_the_decision_or_the_future_changes_the_expectation():
    """Negative controls for the test above, through the same enumeration: a "baseline" that depends on the
    decision a_t (V + 2 a_t), or on the rewards it is meant to predict (V + G_t / 2, computed from this row's
    own draws), moves the expected update away from (1 - 1/B) grad J."""
    B = 2
    texts = [_text(1 + b) for b in range(B)]
    _, pol_v = _value_policies(1.0)
    params = [pol_v.proj.weight]
    target = (1 - 1 / B) * sum(_flat(_exact_gradient(pol_v, *t, params)) for t in texts) / B
    honest = _flat(_rows_expected(pol_v, texts, params)[0])
    torch.testing.assert_close(honest, target, rtol=1e-4, atol=1e-6)
    controls = {
        "decision": lambda out, r: out.value + 2.0 * out.mask.float(),
        "future": lambda out, r: out.value + 0.5 * r.flip(1).cumsum(1).flip(1),  # half of G_t at gamma = 1
    }
    for name, tamper in controls.items():
        biased = _flat(_rows_expected(pol_v, texts, params, tamper)[0])
        assert (biased - target).norm() > 0.2 * target.norm(), name
