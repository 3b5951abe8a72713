"""How noisy is the policy gradient? The paper's variance reductions measured on a model (`learntok diagnose
variance`).

On one fixed batch of held-out sequences the boundaries are sampled again and again (the model in training mode,
as the estimator sees it); each sample gives one estimate of the policy gradient per variant below, from the same
forward pass, so the variants are compared on the same draws:

    naive        A_t = sum_k log p_k                     whole-sequence log-likelihood as every decision's reward
    relative     A_t = sum_k r_k                         early-exit relative reward r_k = log p_k - log p_early_k
    to-go        A_t = sum_{k>=t} r_k                    a decision is credited only with what it can reach
    gamma=G      A_t = sum_j G^j r_{t+j}                 discounted (biased for G < 1)
    centred      A_t - mean over the batch's rows        batch-relative advantage (eq. 17), with gamma 1 and with
                                                         the run's gamma ("centred"); `gammas` adds "gamma=G" and
                                                         "centred, gamma=G" for other discounts
    value        (G_t - V(X_t)) centred                  the learned state baseline, --value-baseline (only for a
                                                         model that has one; the run's gamma)
    normalised   ... / batch standard deviation          --normalize-advantage

Each estimate is (1/B) sum_{b,t} grad log pi(a_{b,t}) A_{b,t} over the trained decisions. Reported per parameter
group: the total variance of one batch's estimate (trace of its covariance), the signal-to-noise ratio
||E g||^2 / E||g - E g||^2 (bias-corrected: `noise_and_signal`), and the cosine of the mean estimate to a
reference direction: the batch-centred estimator with gamma = 1 averaged over `reference_factor` times as many
draws (its expectation is exactly
(1 - 1/B) times the gradient of E[sum_k r_k], and it is far less noisy than the uncentred ones). naive, relative
and to-go are unbiased estimates of that gradient; centring scales it by (1 - 1/B); subtracting V(X_t), a function
of the bytes up to t and not of the decision a_t, leaves the expectation of the estimator it is subtracted in
as it is, so "value" has the expectation of "centred" (the run's gamma: biased when that is < 1, like
"centred"), while each batch's estimate changes; gamma < 1 and normalisation change the expectation.
tests/test_estimator_exact.py shows these exactly on a small policy through `LearnedBoundaries.losses`: the
centring's (1 - 1/B) (test_centred_estimator_is_the_gradient_shrunk_by_one_minus_one_over_b), the value baseline
(test_a_learned_value_baseline_leaves_the_expected_update_unchanged, on B different texts, with negative
controls in test_a_baseline_that_sees_the_decision_or_the_future_changes_the_expectation), gamma < 1
(test_discounting_is_the_expectation_of_its_own_estimator_not_the_gradient) and normalisation
(test_normalisation_bends_the_direction_less_in_larger_batches); to-go minus a fixed baseline is exactly the
gradient there (test_a_lagged_batch_mean_is_an_unbiased_baseline); naive and relative are not in `losses`.

A two-level model's second level (`level=2`, --inner-layers) is measured the same way over its decisions per
token: R_j, the sum of log p - log p_early2 over the bytes that read token j back (the reward its training loss
uses, the second early exit reading the hierarchy without its second level), discounted per token; "naive" is the
row's log-likelihood, "encoder" the inner layers below its policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learntok.boundaries.reinforce import batch_relative_advantage, discounted_returns
from learntok.draw import check_level

GAMMAS = (0.99, 0.9)
"""Discounts measured besides the run's own."""
REFERENCE = "centred, gamma=1"
"""The estimator whose many-draw mean is the reference direction."""


@dataclass
class VariantStats:
    name: str
    group: str
    variance: float
    """Trace of the covariance of one batch's estimate."""
    snr: float
    """||mean||^2 / variance."""
    cosine: float
    """Cosine of the mean estimate to the reference gradient."""
    scale: float
    """||mean|| / ||reference||."""


def _advantages(name: str, r: torch.Tensor, total: torch.Tensor, keep: torch.Tensor, gamma: float,
                value: torch.Tensor | None = None) -> torch.Tensor:
    """(B,N) advantages of variant `name` for N decisions per row from their relative rewards r (B,N) (zero
    where nothing is scored), each row's log-likelihood `total` (B,) (naive's reward) and, for "value", the
    baseline V (B,N); the decisions trained are `keep`."""
    if name == "naive":
        return total[:, None].expand_as(r)
    if name == "relative":
        return r.sum(1, keepdim=True).expand_as(r)
    if name == "to-go":
        return discounted_returns(r, 1.0)
    if name.startswith("gamma="):
        return discounted_returns(r, float(name[6:]))
    g = discounted_returns(r, float(name[15:]) if name.startswith("centred, gamma=") else gamma)
    if name == "value":
        g = g - value
    adv = batch_relative_advantage(g, keep)
    if name == "normalised":
        adv = adv / (adv[keep].std() + 1e-6)
    return adv


def discount_key(g: float) -> float:
    """A discount as its estimator's name gives it: discounts that print alike are one estimator."""
    return float(f"{g:g}")


def variant_names(gamma: float, value: bool = False, extra: tuple[float, ...] = ()) -> list[str]:
    """The estimators measured, in chain order; "value" only for a model with a learned baseline; each discount in
    `extra` (other than the run's and 1) adds its uncentred and its centred estimator."""
    other = sorted({discount_key(g) for g in extra} - {discount_key(gamma), 1.0}, reverse=True)
    gammas = sorted({*GAMMAS, gamma, *other} - {1.0}, reverse=True)
    return ["naive", "relative", "to-go", *(f"gamma={g:g}" for g in gammas), "centred, gamma=1",
            *(f"centred, gamma={g:g}" for g in other), "centred", *(["value"] if value else []), "normalised"]


def _decisions(out, targets: torch.Tensor, level: int):
    """One draw's decisions at boundary level `level`: (their output: log_prob and value, relative rewards r,
    each row's log-likelihood, keep), all (B,N) but the row totals (B,). Level 1: per byte, r_t = log p - log
    p_early. Level 2 (a two-level model, learntok.model.hier): per token j, R_j = the sum of log p - log p_early2
    over the bytes that read token j back, the return the model's own loss credits to its decision."""
    valid = targets != -100
    logp = -out.nll.detach().float()
    bo = out.boundaries
    if level == 1:  # rewards at every scored byte, as the training loss has them (a forced last byte's too)
        keep = valid & bo.free
        return bo, (logp + out.nll_early.float()) * valid, (logp * keep).sum(1), keep
    total = (logp * valid).sum(1)
    out2 = out.inner_boundaries
    M = out2.mask.shape[1]
    per_byte = ((out.nll_early2.detach().float() - out.nll.detach().float()) * valid)  # log p - log p_early2
    index = bo.mask.long().cumsum(1) - 1  # c(t): the token each byte reads back
    r = per_byte.new_zeros(per_byte.shape[0], M).scatter_add_(1, index, per_byte)
    real = torch.arange(M, device=r.device)[None] < out.n_tokens[:, None]
    return out2, r * real, total, real & out2.free


def policy_gradient_variance(model, batch: torch.Tensor, *, samples: int = 64, reference_factor: int = 16,
                             seed: int = 0, level: int = 1, gammas: tuple[float, ...] = ()
                             ) -> tuple[list[VariantStats], dict]:
    """Variance, SNR and cosine to a reference of the policy-gradient estimators on `batch` (B, T+1) (BOS
    first), for a model whose strategy learns by the score function; level 2: a two-level model's second level
    (its decisions per token, gamma per token). `gammas`: discounts to measure besides the run's (0 to 1), each
    uncentred and centred. Returns (rows, info)."""
    check_level(model, level)
    strategy = model.boundary if level == 1 else model.inner
    if strategy.learns_by != "score_function":
        raise ValueError(f"diagnose variance: the {model.bcfg.boundaries} strategy has no policy gradient")
    if any(not 0 <= g <= 1 for g in gammas):
        raise ValueError(f"diagnose variance: discounts must be in [0, 1], got {list(gammas)}")
    was_training = model.training
    model.train()
    gamma = float(strategy.cfg.gamma)  # the level's own (a second level may have its own discount)
    names = variant_names(gamma, value=getattr(strategy, "value", None) is not None, extra=gammas)
    groups = {"policy": [p for p in strategy.parameters() if p.requires_grad]}
    if not model.bcfg.detach_encoder:  # what the policy reads: the byte encoder, or the inner layers below it
        groups["encoder"] = ([p for n, p in model.named_parameters() if n.startswith(("embed", "down"))]
                             if level == 1 else [p for p in model.inner_down.parameters()])
    ids, targets = batch[:, :-1], batch[:, 1:]
    B, T = ids.shape
    gen = torch.Generator().manual_seed(seed)
    grads: dict[str, dict[str, list[torch.Tensor]]] = {n: {g: [] for g in groups} for n in names}
    ref: dict[str, list[torch.Tensor]] = {g: [] for g in groups}
    params = [p for ps in groups.values() for p in ps]
    sizes = [len(ps) for ps in groups.values()]
    try:
        for k in range(samples * reference_factor):
            noise = torch.rand(B, T, generator=gen).to(ids.device)
            out = model(ids, targets, noise=noise)
            bo, r, total, keep = _decisions(out, targets, level)
            value = bo.value.detach() if "value" in names else None
            todo = names if k < samples else [REFERENCE]
            for n in todo:
                adv = _advantages(n, r, total, keep, gamma, value).detach()
                surrogate = (bo.log_prob * adv * keep.float()).sum() / B
                g = torch.autograd.grad(surrogate, params, retain_graph=True, allow_unused=True)
                flat, i = [], 0
                for size in sizes:
                    flat.append(torch.cat([(x if x is not None else torch.zeros_like(p)).flatten()
                                           for x, p in zip(g[i:i + size], params[i:i + size])]))
                    i += size
                for gname, vec in zip(groups, flat):
                    if k < samples:
                        grads[n][gname].append(vec)
                    if n == REFERENCE:
                        ref[gname].append(vec)
    finally:
        model.train(was_training)
    rows = []
    for gname in groups:
        reference = torch.stack(ref[gname]).mean(0)
        for n in names:
            g = torch.stack(grads[n][gname])  # (samples, P)
            mean = g.mean(0)
            var, snr = noise_and_signal(g)
            rows.append(VariantStats(n, gname, var, snr,
                                     float(torch.nn.functional.cosine_similarity(mean, reference, dim=0)),
                                     float(mean.norm() / reference.norm().clamp(min=1e-30))))
    info = {"batch": B, "seq_len": T, "level": level, "samples": samples,
            "reference_samples": samples * reference_factor, "gamma": gamma,
            "gammas": sorted({discount_key(g) for g in gammas}),
            "groups": {g: sum(p.numel() for p in ps) for g, ps in groups.items()}}
    return rows, info


def noise_and_signal(g: torch.Tensor) -> tuple[float, float]:
    """From n draws (n, P) of an estimator: the trace of its covariance (unbiased, divisor n - 1) and its
    signal-to-noise ratio ||E g||^2 / tr(Cov), with ||E g||^2 estimated without bias as ||mean||^2 - tr/n (the
    mean of n draws carries tr/n of noise, so the plain ratio would read about 1/n for an estimator with no
    signal at all). A ratio <= 0 means no signal is detectable in n draws."""
    n = g.shape[0]
    mean = g.mean(0)
    var = float(((g - mean) ** 2).sum() / (n - 1))
    return var, (float(mean.square().sum()) - var / n) / max(var, 1e-30)


def format_table(rows: list[VariantStats], info: dict) -> str:
    """A Markdown table: variance, reduction against naive, SNR (and the batches it takes to reach 1), cosine and
    scale to the reference."""
    level = "second-level (per-token) " if info.get("level", 1) == 2 else ""
    lines = [f"{info['samples']} {level}boundary draws on one batch of {info['batch']} x {info['seq_len']} bytes; "
             f"reference: centred, gamma 1, over {info['reference_samples']} draws; run gamma {info['gamma']:g}. "
             f"SNR is bias-corrected (<= 0: no signal detectable in {info['samples']} draws); the cosine of a mean "
             "whose own SNR (draws x SNR) is below 1 is mostly noise.", "",
             "| group | estimator | variance | vs naive | SNR | batches for SNR 1 | cosine to reference | scale |",
             "|---|---|---|---|---|---|---|---|"]
    naive = {r.group: r.variance for r in rows if r.name == "naive"}
    for r in rows:
        need = f"{1 / r.snr:.3g}" if r.snr > 0 else "no signal"
        lines.append(f"| {r.group} | {r.name} | {r.variance:.4g} | {naive[r.group] / max(r.variance, 1e-30):.1f}x | "
                     f"{r.snr:.3g} | {need} | {r.cosine:.3f} | {r.scale:.3f} |")
    return "\n".join(lines)
