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

With --rate-range LOW HIGH (one model for any rate; not in the paper) each row b has its own target r_b: the
bias logit(pi_target) becomes logit(r_b) (+ a fitted calibration offset at evaluation), the policy's input is
modulated by a rate embedding, h' = h (1 + gamma(r_b)) + beta(r_b), V gets a rate term, and the batch statistics
(the baseline of eq. 17 and mean(p) of eq. 24) are kept per stratum of rows that share a target
(learntok.boundaries.rates; docs/method.md "Variable rate").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
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
from learntok.boundaries.rates import RATE_CALIBRATION, Calibration, RateController, RateEmbedding, Rates, draw_rates
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
    rate_range: tuple[float, float] | None = None
    """Train one model for any target rate in [LOW, HIGH] (not in the paper: its open problem). Every step draws
    targets (--rate-distribution, --rate-strata) and the policy is conditioned on its row's target; target_rate
    becomes the rate asked when none is. None: one fixed rate."""
    rate_strata: int = 1
    """With --rate-range: targets per step. The global batch is cut into this many blocks of rows, each with its
    own target, and the estimator's batch statistics (the baseline of eq. 17, mean(p) of eq. 24) are kept per
    block, so each block is an exact fixed-rate batch. 1: one target for the whole step."""
    rate_distribution: Literal["log-uniform", "uniform"] = "log-uniform"
    """With --rate-range: how targets are drawn (log-uniform: equal weight per factor of rate)."""
    rate_tokens: bool = False
    """With --rate-range: also add a rate embedding to every token-level input (the token stack knows the rate)."""
    rate_film: bool = True
    """With --rate-range: modulate the policy's input by a rate embedding (FiLM), so which bytes become boundaries
    can change with the rate; --no-rate-film moves only the bias, logit(r)."""
    rate_controller: bool = False
    """With --rate-range: a learned logit offset per target (piecewise linear in logit(r)), trained by the rate loss
    alone: an integral controller per target, so training realises the targets it draws."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rate_range is not None:
            object.__setattr__(self, "rate_range", tuple(float(r) for r in self.rate_range))  # JSON gives a list
            lo, hi = self.rate_range
            if not 0 < lo < hi < 1:
                raise ValueError(f"rate_range must be LOW HIGH with 0 < LOW < HIGH < 1, got {lo:g} {hi:g}")
            if not lo <= self.target_rate <= hi:
                raise ValueError(f"target_rate {self.target_rate:g} (the rate asked by default) must lie in "
                                 f"rate_range [{lo:g}, {hi:g}]")
        elif self.rate_strata != 1 or self.rate_tokens or self.rate_controller or not self.rate_film:
            raise ValueError("rate_strata, rate_tokens, rate_controller and rate_film need rate_range (a variable-rate "
                             "model)")
        if self.rate_strata < 1:
            raise ValueError(f"rate_strata must be >= 1, got {self.rate_strata}")
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
    rate: torch.Tensor | None = None
    """(B,) each row's target rate when rates were given or asked (variable-rate models: always), else None."""
    group: torch.Tensor | None = None
    """(B,) long stratum of each row in variable-rate training, else None (one group)."""
    control: torch.Tensor | None = None
    """(B,) the rate controller's c(r_b) with gradient (--rate-controller), else None."""


@dataclass(kw_only=True)
class LearnedState(StepState):
    prev: torch.Tensor
    """(B,w) the last w boundaries, prev[:, j] = a_{t-1-j}."""
    bias: torch.Tensor | float
    """The logit bias of every row: logit(pi_target), or (B,) for asked rates."""
    film: tuple[torch.Tensor, torch.Tensor] | None = None
    """(gamma, beta) (B,D) of the rate embedding (variable-rate models), else None."""
    token_rate: torch.Tensor | None = None
    """(B,D) added to every token-level input (--rate-tokens), else None."""


class LearnedBoundaries(BoundaryStrategy):
    config = LearnedConfig
    learns_by = "score_function"
    uses_rewards = True
    has_step = True
    rate_knob = True

    def __init__(self, cfg: LearnedConfig, dim: int):
        super().__init__(cfg, dim)
        self.norm = RMSNorm(dim) if cfg.policy_norm else nn.Identity()
        # One matmul gives W_0 X_t (content) and W_j X_t (j = 1..w, previous-boundary terms) for every t.
        self.proj = nn.Linear(dim, cfg.policy_window + 1, bias=False)
        self.bias = math.log(cfg.target_rate / (1 - cfg.target_rate))  # logit(pi_target)
        self.value = nn.Sequential(RMSNorm(dim), nn.Linear(dim, 1)) if cfg.value_baseline else None
        variable = cfg.rate_range is not None
        # The rate modules draw their initial weights from a forked generator, so a variable-rate model's shared
        # weights start exactly where the fixed-rate model of the same seed starts (paired comparisons).
        with torch.random.fork_rng(devices=[]):
            self.film = RateEmbedding(2 * dim, cfg.target_rate) if variable and cfg.rate_film else None
            self.value_rate = RateEmbedding(1, cfg.target_rate) if variable and cfg.value_baseline else None
            self.token_rate = RateEmbedding(dim, cfg.target_rate) if cfg.rate_tokens else None
            self.controller = RateController(cfg.rate_range) if cfg.rate_controller else None
        self.asked: float | None = None
        """The rate `set_rate` asked for (None: the trained default, cfg.target_rate)."""
        self.calibration: Calibration | None = None
        """Logit offsets per asked rate (`learntok calibrate`), applied at evaluation only."""

    def _embeddings(self) -> list[RateEmbedding]:
        return [e for e in (self.film, self.value_rate, self.token_rate) if e is not None]

    def reset_parameters(self, init_std: float) -> None:
        """The policy's and the value head's matrices ~ N(0, init_std^2), drawn as a fixed-rate model draws them;
        then, from a forked generator (the shared weights' draws unchanged), the rate embeddings: a unit-scale
        first layer (phi(r) is O(1)) and a zero output (no effect at initialisation), and a zero controller."""
        own = {id(m) for e in self._embeddings() for m in e.modules()}
        for m in self.modules():
            if isinstance(m, nn.Linear) and id(m) not in own:
                nn.init.normal_(m.weight, std=init_std)
        with torch.random.fork_rng(devices=[]):
            for e in self._embeddings():
                nn.init.normal_(e.inp.weight, std=1.0)
                e.zero_output()
        if self.controller is not None:
            nn.init.zeros_(self.controller.offset)

    def matrix_params(self) -> int:
        """Per-byte matrices only: a rate embedding runs once per row, not per byte."""
        own = {id(p) for e in self._embeddings() for p in e.parameters()}
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2 and id(p) not in own)

    # -- rates -----------------------------------------------------------------------------------------------

    def set_rate(self, rate: float | None) -> None:
        if rate is not None and not 0 < np.float32(rate) < 1:  # float32: the rate tensors' (1 - 1e-9 is 1.0)
            raise ValueError(f"rate must be in (0, 1) in float32, got {rate:g}")
        self.asked = rate

    def training_rates(self, seed, step, rows, total_rows, device):
        cfg = self.cfg
        if cfg.rate_range is None:
            return None
        r, s = draw_rates(seed, step, rows, total_rows, cfg.rate_range, cfg.rate_strata, cfg.rate_distribution)
        return Rates(torch.from_numpy(r).to(device), group=torch.from_numpy(s).to(device))

    def _rates(self, rates: Rates | None, B: int, device) -> Rates | None:
        """The rates of this call: those given, else the asked rate, else (a calibrated model in evaluation, or a
        variable-rate model) the default target; None for a fixed-rate model asked nothing (the paper's path)."""
        if rates is not None:
            return rates
        if self.asked is not None:
            return Rates.fill(self.asked, B, device)
        if self.cfg.rate_range is not None or (self.calibration is not None and not self.training):
            return Rates.fill(self.cfg.target_rate, B, device)
        return None

    def _bias(self, rates: Rates | None, control: torch.Tensor | None = None) -> torch.Tensor | float:
        """logit(pi_target), or per row (B,1) logit(r_b) + the controller's c(r_b) (its value: `control`, computed
        by the caller, which keeps its gradient for the rate loss) + an offset: given, or the calibration's
        (evaluation)."""
        if rates is None:
            return self.bias
        bias = torch.logit(rates.value.float())
        if control is not None:
            bias = bias + control.detach()
        if rates.offset is not None:
            bias = bias + rates.offset.float()
        elif self.calibration is not None and not self.training:
            bias = bias + self.calibration.offset(rates.value)
        return bias[:, None]

    def _condition(self, h: torch.Tensor, rates: Rates | None) -> torch.Tensor:
        """The policy's input h (B,T,D) modulated by the rate embedding (variable-rate models)."""
        if self.film is None:
            return h
        gamma, beta = self.film(rates.value).to(h.dtype).chunk(2, -1)  # (B,D) each
        return h * (1 + gamma[:, None]) + beta[:, None]

    def prepare(self, train_docs, val_docs, run_dir):
        """Loading a model (no documents): read its calibration table, if `learntok calibrate` wrote one. Training
        (documents): start uncalibrated, and remove a table left in the run directory, which more training
        would make stale."""
        if not train_docs:
            self.calibration = Calibration.load(run_dir)
            return
        self.calibration = None
        if run_dir is not None and (Path(run_dir) / RATE_CALIBRATION).exists():
            (Path(run_dir) / RATE_CALIBRATION).unlink()

    def artifacts(self):
        return [RATE_CALIBRATION]

    def downsample(self, x, out, size=None):
        tokens = super().downsample(x, out, size)
        if self.token_rate is not None:
            tokens.x = tokens.x + self.token_rate(out.rate).to(tokens.x.dtype)[:, None]
        return tokens

    @property
    def samples_per_sequence(self) -> int:
        return self.cfg.policy_samples

    @property
    def traces_whole(self) -> bool:
        """A window wider than the scan's keeps the Jacobi sampler, whose loop length depends on the data."""
        return self.cfg.policy_window <= SCAN_MAX_WINDOW

    def propose(self, x, ids, *, noise, generator, prescribed=None, rates=None):
        cfg = self.cfg
        B, T, _ = x.shape
        rates = self._rates(rates, B, x.device)
        h = x.detach() if cfg.detach_encoder else x
        c = self.proj(self._condition(self.norm(h), rates)).float() / cfg.logit_scale  # (B,T,w+1)
        control = self.controller(rates.value) if self.controller is not None else None  # (B,) with grad
        base, coef = c[..., 0] + self._bias(rates, control), c[..., 1:]  # (B,T), (B,T,w)
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
            if self.value_rate is not None:
                value = value + self.value_rate(rates.value).float()  # (B,1): V(X_t, r)
        return LearnedOutput(mask=mask, probs=torch.sigmoid(logits), logits=logits, log_prob=log_prob,
                             free=~forced, stats={"boundary/sample_rounds": rounds}, value=value,
                             rate=None if rates is None else rates.value,
                             group=None if rates is None else rates.group, control=control)

    def init_step_state(self, batch, noise):
        rates = self._rates(None, batch, noise.device)
        film = token = None
        if self.film is not None:
            film = self.film(rates.value).chunk(2, -1)
        if self.token_rate is not None:
            token = self.token_rate(rates.value)
        bias = self._bias(rates, self.controller(rates.value) if self.controller is not None else None)
        return LearnedState(noise=noise, prev=torch.zeros(batch, self.cfg.policy_window, device=noise.device),
                            bias=bias if isinstance(bias, float) else bias[:, 0], film=film, token_rate=token)

    def step_token_input(self, x_t, a_t, state):
        tok = super().step_token_input(x_t, a_t, state)
        return tok if state.token_rate is None else tok + state.token_rate.to(tok.dtype)

    def step(self, x_t, ids_t, t, state):
        cfg = self.cfg
        h = self.norm(x_t)
        if state.film is not None:
            gamma, beta = state.film
            h = h * (1 + gamma.to(h.dtype)) + beta.to(h.dtype)
        c = self.proj(h).float() / cfg.logit_scale  # (B,w+1)
        logit = c[:, 0] + state.bias
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
        # Batch statistics of the *global* batch (all ranks and micro-steps) when a reducer is given, per stratum of
        # rows sharing a target rate (one for a fixed-rate model or outside training).
        # Over the decisions the loss trains (keep): a forced column's return, whose advantage is never used,
        # must not enter the spread that --normalize-advantage divides by.
        group = getattr(out, "group", None) if cfg.rate_strata > 1 else None  # (B,) each row's stratum, or one
        pk = out.probs.detach() * kf
        if group is None:  # one stratum: exactly the fixed-rate sums
            local = BatchStatistics(g_sum=(g * kf).sum(0, keepdim=True), g_cnt=kf.sum(0, keepdim=True),
                                    g2_sum=(g * g * kf).sum(0, keepdim=True), p_sum=pk.sum().view(1),
                                    n=kf.sum().view(1))
        else:
            def per_stratum(v):  # (B,...) -> (S,...) sums over each stratum's rows (index_add: exact under autocast)
                return v.new_zeros(cfg.rate_strata, *v.shape[1:]).index_add(0, group, v)
            local = BatchStatistics(g_sum=per_stratum(g * kf), g_cnt=per_stratum(kf), g2_sum=per_stratum(g * g * kf),
                                    p_sum=per_stratum(pk.sum(1)), n=per_stratum(kf.sum(1)))
        stats = reduce(local) if reduce is not None else local
        mean_g = stats.g_sum / stats.g_cnt.clamp(min=1)  # (S,T)
        if loo:
            adv = g * vf  # already centred; the batch mean above serves only the normaliser's spread
        else:  # eq. 17 within each row's stratum
            adv = batch_relative_advantage(g, valid, mean=mean_g[0] if group is None else mean_g[group])  # (B,T)
        if cfg.normalize_advantage:  # the spread around each stratum's mean, pooled
            var = (stats.g2_sum - stats.g_cnt * mean_g**2).sum() / stats.g_cnt.sum().clamp(min=1)
            adv = adv / (var.clamp(min=0).sqrt() + 1e-6)
        policy = -(out.log_prob * adv.detach() * kf).sum() / n
        p_mean = stats.p_sum / stats.n.clamp(min=1)  # (S,)
        rate = getattr(out, "rate", None)
        if rate is None:  # eq. 24
            target = (out.logits * kf).sum() / n * (p_mean[0] - cfg.target_rate).detach()
        else:  # eq. 24 per stratum: each row's logits pushed by its stratum's mean(p) minus its target
            err = (p_mean[0] if group is None else p_mean[group]) - rate.float()  # (B,)
            target = ((out.logits * kf).sum(1) * err.detach()).sum() / n
            if getattr(out, "control", None) is not None:  # the controller: its value sits in every logit of its row
                target = target + (out.control * kf.sum(1) * err.detach()).sum() / n
            extra["boundary/target"] = (rate.float()[:, None] * kf).sum() / n
        return {
            "loss/policy": cfg.lambda_policy * policy,
            "loss/target": cfg.lambda_target * target,
            "boundary/p_mean": (stats.p_sum.sum() / stats.n.sum().clamp(min=1)).detach(),
            "boundary/neg_log_pi": (-(out.log_prob.detach() * kf).sum() / n),
            "reinforce/adv_std": masked_std(adv.detach(), kf),
            "reinforce/reward_mean": (r * kf).sum() / n,
            **extra,
            BATCH_STATS: local,
        }
