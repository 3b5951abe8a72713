"""The paper's boundary policy, trained with the score-function estimator (paper §2-3, docs/method.md).

    h_t      = X_t, or RMSNorm(X_t) with --policy-norm (not in the paper)
    l_raw_t  = W_0 h_t + sum_{j=1..w} a_{t-j} W_j h_t                      (eq. 21)
    l_t      = softcap(l_raw_t / D + logit(pi_target))   (softcap in training only)
    a_t      ~ Bernoulli(sigmoid(l_t)),   a_0 = 1

Losses (per-byte means over decided, non-padding positions):
    L_pi     = - mean_t log pi(a_t) * sg(A_t),  A = batch-relative discounted early-exit-relative reward
               (divided by the batch std with --normalize-advantage)
    L_target = mean(l) * sg(mean(p) - pi_target)                         (eq. 24)
With --value-baseline, G_t - sg(V(X_t)) replaces G_t in the advantage and lambda_pi mean (V(X_t) - G_t)^2 trains V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from learntok.boundaries.base import (
    BATCH_STATS,
    BoundaryOutput,
    BoundaryStrategy,
    SampledConfig,
    StepState,
    boundary_uniforms,
    forced_positions,
)
from learntok.boundaries.reinforce import (
    SCAN_MAX_WINDOW,
    BatchStatistics,
    batch_relative_advantage,
    discounted_returns,
    leave_one_out_advantage,
    masked_std,
    sample_window_policy,
    window_logits,
)
from learntok.nn.attention import softcap
from learntok.nn.layers import RMSNorm


@dataclass(frozen=True, kw_only=True)
class LearnedConfig(SampledConfig):
    """Options of the paper's policy (`--boundaries learned`); the defaults are the paper's."""

    boundaries: str = "learned"
    policy_window: int = 8
    """Previous boundaries the policy conditions on (w in eq. 21); 0 = independent Bernoulli per byte.
    The authors' code 'window 8' corresponds to 7 here, its 'w = 1' to 0 (docs/method.md)."""
    logit_scale: float = 16.0
    """D in l_scaled = l_raw / D + logit(pi_target)."""
    policy_norm: bool = False
    """RMSNorm the encoder state before the policy projection (not in eq. 21). At initialisation the state's RMS
    is 1.65 (`small`) to 3.0 (`paper-147m`), so the norm divides l_raw by that much: it interacts with D."""
    logit_softcap: float = 6.0
    """Soft-cap of the boundary logits in training (c*tanh(l/c)); 0 disables it. None at evaluation."""
    gamma: float = 0.99
    """Time discount of the returns G_t = sum_j gamma^j r_{t+j}, with r_t the paper's R_{t+1} (eq. 16).
    gamma < 1 biases the gradient of the undiscounted objective in exchange for lower variance."""
    normalize_advantage: bool = False
    """Divide advantages by their batch standard deviation (not in the paper; a data-dependent rescaling that
    biases the gradient)."""
    value_baseline: bool = False
    """Subtract a learned baseline V(X_t) ~ E[G_t | bytes <= t] (a linear head on the detached encoder state,
    trained by squared error) from the returns before the batch-relative centring. It does not depend on a_t,
    so it adds no bias; it is meant to remove the content-driven part of the returns' spread, but with batch
    centring a measurement found no variance reduction (not in the paper)."""
    policy_samples: int = 1
    """K boundary samples per training sequence (not in the paper; 1 = the paper). Each sequence fills K
    consecutive rows of the batch (--batch-size counts rows, so K times fewer distinct sequences per update),
    and a row's baseline is the mean return of the other K - 1 samples of the same text at the same position
    (leave-one-out) instead of the batch mean of eq. 17: unbiased, and matched to the content, which the
    batch mean over different texts is not. The LM loss averages over the K samples."""
    lambda_policy: float = 1e-2
    """Weight of the policy (REINFORCE) loss."""
    lambda_target: float = 1e-2
    """Weight of the rate-targeting loss mean(l) * sg(mean(p) - pi_target) (eq. 24)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy_window < 0:
            raise ValueError(f"policy_window must be >= 0, got {self.policy_window}")
        if self.logit_scale <= 0:
            raise ValueError(f"logit_scale must be > 0, got {self.logit_scale}")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.policy_samples < 1:
            raise ValueError(f"policy_samples must be >= 1, got {self.policy_samples}")


@dataclass
class LearnedOutput(BoundaryOutput):
    value: torch.Tensor | None = None
    """(B,T) fp32 V(X_t), the learned baseline of the returns (with grad into the value head only), or None."""


@dataclass(kw_only=True)
class LearnedState(StepState):
    prev: torch.Tensor
    """(B,w) the last w boundaries, prev[:, j] = a_{t-1-j}."""


class LearnedBoundaries(BoundaryStrategy):
    config = LearnedConfig
    learns_by = "score_function"
    uses_rewards = True
    has_step = True

    def __init__(self, cfg: LearnedConfig, dim: int):
        super().__init__(cfg, dim)
        self.norm = RMSNorm(dim) if cfg.policy_norm else nn.Identity()
        # One matmul gives W_0 X_t (content) and W_j X_t (j = 1..w, previous-boundary terms) for every t.
        self.proj = nn.Linear(dim, cfg.policy_window + 1, bias=False)
        self.bias = math.log(cfg.target_rate / (1 - cfg.target_rate))  # logit(pi_target)
        self.value = nn.Sequential(RMSNorm(dim), nn.Linear(dim, 1)) if cfg.value_baseline else None

    @property
    def samples_per_sequence(self) -> int:
        return self.cfg.policy_samples

    @property
    def traces_whole(self) -> bool:
        """A window wider than the scan's keeps the Jacobi sampler, whose loop length depends on the data."""
        return self.cfg.policy_window <= SCAN_MAX_WINDOW

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        cfg = self.cfg
        B, T, _ = x.shape
        h = x.detach() if cfg.detach_encoder else x
        c = self.proj(self.norm(h)).float() / cfg.logit_scale  # (B,T,w+1)
        base, coef = c[..., 0] + self.bias, c[..., 1:]  # (B,T), (B,T,w)
        cap = cfg.logit_softcap if self.training else 0.0
        forced = forced_positions(B, T, cfg.force_last, x.device)
        noise = boundary_uniforms(noise, (B, T), greedy=not self.training and cfg.eval_boundaries == "greedy",
                                  generator=generator, device=x.device)
        mask, rounds = sample_window_policy(base.detach(), coef.detach(), noise, forced, cap)
        logits = softcap(window_logits(base, coef, mask), cap)  # (B,T), with grad
        logits = logits.masked_fill(forced, 100.0)  # forced: p = 1, no gradient
        af = mask.float()
        log_prob = af * nn.functional.logsigmoid(logits) + (1 - af) * nn.functional.logsigmoid(-logits)
        value = None
        if self.value is not None and self.training:
            value = self.value(x.detach()).squeeze(-1).float()  # (B,T)
        return LearnedOutput(mask=mask, probs=torch.sigmoid(logits), logits=logits, log_prob=log_prob,
                             free=~forced, stats={"boundary/sample_rounds": rounds}, value=value)

    def init_step_state(self, batch, noise):
        return LearnedState(noise=noise, prev=torch.zeros(batch, self.cfg.policy_window, device=noise.device))

    def step(self, x_t, ids_t, t, state):
        cfg = self.cfg
        c = self.proj(self.norm(x_t)).float() / cfg.logit_scale  # (B,w+1)
        logit = c[:, 0] + self.bias
        if cfg.policy_window:
            logit = logit + (state.prev * c[:, 1:]).sum(-1)  # prev[:, j] = a_{t-1-j}
        p = torch.sigmoid(softcap(logit, cfg.logit_softcap if self.training else 0.0))  # (B,)
        a = state.noise[:, t] < p
        if t == 0:
            a, p = torch.ones_like(a), torch.ones_like(p)
        if cfg.policy_window:
            state.prev = torch.cat([a.float()[:, None], state.prev[:, :-1]], dim=1)
        return a, p

    def losses(self, out, logp, logp_early, valid, reduce=None):
        cfg = self.cfg
        keep = valid & out.free  # (B,T) positions whose decision is trained
        vf, kf = valid.float(), keep.float()
        n = kf.sum().clamp(min=1)
        # Reward of the prediction made at position t (of byte t+1): how much the full model beats the
        # early-exit head. Decision a_t affects predictions at t, t+1, ..., so its return starts at r_t.
        r = ((logp - logp_early) * vf).float()  # (B,T)
        g = discounted_returns(r, cfg.gamma)  # (B,T)
        extra = {}
        if getattr(out, "value", None) is not None:
            # Weighted like the policy loss: at weight 1 its gradient dominated the global norm, and clipping
            # then slowed the language model (screening run Lc: grad norm 1.7 vs 0.6, val BPB +0.16).
            extra["loss/value"] = cfg.lambda_policy * ((out.value - g) ** 2 * vf).sum() / vf.sum().clamp(min=1)
            g = g - out.value.detach()  # a state-only baseline: unbiased
        # Training rows are in the `repeat_samples` layout (leave-one-out over each text's K samples); evaluation
        # rows are distinct texts, in batches of any size, so they get the batch-relative advantage.
        loo = cfg.policy_samples > 1 and self.training
        if loo:
            g = leave_one_out_advantage(g, keep, cfg.policy_samples)  # (B,T), centred per text
        # Batch statistics of the *global* batch (all ranks and micro-steps) when a reducer is given.
        # Over the decisions the loss trains (keep): a forced column's return, whose advantage is never used,
        # must not enter the spread that --normalize-advantage divides by.
        local = BatchStatistics(g_sum=(g * kf).sum(0), g_cnt=kf.sum(0), g2_sum=(g * g * kf).sum(0),
                                p_sum=(out.probs.detach() * kf).sum(), n=kf.sum())
        stats = reduce(local) if reduce is not None else local
        mean_g = stats.g_sum / stats.g_cnt.clamp(min=1)  # (T,)
        if loo:
            adv = g * vf  # already centred; the batch mean above serves only the normaliser's spread
        else:
            adv = batch_relative_advantage(g, valid, mean=mean_g)  # (B,T)
        if cfg.normalize_advantage:
            var = (stats.g2_sum - stats.g_cnt * mean_g**2).sum() / stats.g_cnt.sum().clamp(min=1)
            adv = adv / (var.clamp(min=0).sqrt() + 1e-6)
        policy = -(out.log_prob * adv.detach() * kf).sum() / n
        p_mean = stats.p_sum / stats.n.clamp(min=1)
        l_mean = (out.logits * kf).sum() / n
        target = l_mean * (p_mean - cfg.target_rate).detach()
        return {
            "loss/policy": cfg.lambda_policy * policy,
            "loss/target": cfg.lambda_target * target,
            "boundary/p_mean": p_mean.detach(),
            "boundary/neg_log_pi": (-(out.log_prob.detach() * kf).sum() / n),
            "reinforce/adv_std": masked_std(adv.detach(), kf),
            "reinforce/reward_mean": (r * kf).sum() / n,
            **extra,
            BATCH_STATS: local,
        }
