"""Dynamic token pooling (Nawrot, Chorowski, Łańcucki & Ponti 2023): a Gumbel-sigmoid straight-through
boundary predictor with mean pooling (docs/baselines.md).

    l_t  = W_2 ReLU(W_1 RMSNorm(X_t) + b_1) + b_2                    (the paper's port: d -> d -> 1, ReLU)
    s_t  = sigmoid((l_t + log u_t - log(1 - u_t)) / tau)             (Gumbel-sigmoid, u_t ~ U(0,1))
    b_t  = [s_t > 0.5],   b~_t = b_t + s_t - sg(s_t),   b_0 = 1      (straight-through)
    L_B  = -(1/n) mean_batch log Binomial(k = sum_t b~_t; n, alpha)  (the prior; alpha = target_rate)

Pooling (our convention = Nawrot's without the null group, since b_0 = 1): a boundary ends its group, byte t
belongs to group g(t) = sum_{i<t} b_i, token j is the mean of X over its group and sits at its boundary byte
(RoPE position); byte t reads back token c(t) = sum_{i<=t} b_i - 1, the latest group whose boundary is <= t.
Bytes after the last boundary form an unfinished group that no byte reads, so it is dropped (Nawrot drops it
too). Reading token sum_{i<=t} b_i instead (the paper port's first upsampler: the null group removed without
re-indexing) hands byte t the group after its own, which holds future bytes: a leak (tests/test_dynamic.py).

The LM loss reaches the predictor only through the pooling weights. Nawrot builds dense
B x T x M matrices with entry 1 - (s - g_t) at s = g_t, g_t from the cumsum of b~, normalised over the group.
The entry depends on (t, s) only through the one-hot of g(t), so it factorises into a hard slot g(t) and a
per-byte weight w_t = 1 + g_t - sg(g_t) (forward exactly 1); `mean_pool` is that scatter in O(B T D) memory
with the dense version's gradient (`nawrot_dense_weights` is the reference; the test compares both).
Nawrot's upsample weights are normalised over a single non-zero entry (v / (v + 1e-9)), so they carry no
gradient to b~; the upsample here is therefore the plain gather `distribute_add`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from learntok.boundaries.base import (
    BoundaryOutput,
    BoundaryStrategy,
    SampledConfig,
    boundary_uniforms,
    forced_positions,
)
from learntok.boundaries.pooling import Tokens, distribute_add, mean_pool, select
from learntok.nn.layers import RMSNorm


@dataclass(frozen=True, kw_only=True)
class DynamicConfig(SampledConfig):
    """Options of `--boundaries dynamic` (Nawrot et al.'s dynamic token pooling, as the paper ported it)."""

    boundaries: str = "dynamic"
    gumbel_temperature: float = 1.0
    """Temperature of the Gumbel-sigmoid relaxation (the paper's port: 1.0; Nawrot's code: 0.5)."""
    prior_weight: float = 1.0
    """Weight of the binomial prior pulling the boundary count toward target_rate (Nawrot: 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gumbel_temperature <= 0:
            raise ValueError(f"gumbel_temperature must be > 0, got {self.gumbel_temperature}")


@dataclass
class DynamicOutput(BoundaryOutput):
    """A `BoundaryOutput` that also carries the straight-through boundaries."""

    ste: torch.Tensor | None = None
    """(B,T) fp32 b~_t = b_t + s_t - sg(s_t): forward exactly the hard mask (1 at forced positions, without
    gradient), backward the Gumbel-sigmoid surrogate."""


def gumbel_sigmoid_boundaries(logits: torch.Tensor, noise: torch.Tensor, tau: float,
                              forced: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hard and straight-through boundaries from fp32 logits (B,T) and uniforms `noise` (B,T).

    b_t = [s_t > 0.5] is evaluated as [z_t > 0] (the same event; sigmoid(z) rounds to 0.5 for tiny z > 0),
    which makes b_t an exact Bernoulli(sigmoid(l_t)) sample: b_t = [u_t > 1 - p_t]. tau only scales the
    surrogate gradient ds/dl = s(1 - s)/tau. u is clamped to [1e-6, 1 - 1e-6] so log u stays finite."""
    z = (logits + torch.logit(noise.float(), eps=1e-6)) / tau  # (B,T) relaxed logit
    s = torch.sigmoid(z)  # (B,T)
    mask = (z > 0) | forced  # (B,T) bool
    # b + (s - sg(s)): the bracket is exactly 0 in the forward pass, so b~ equals the mask bit for bit.
    ste = torch.where(forced, torch.ones_like(s), mask.float() + (s - s.detach()))  # (B,T) fp32
    return mask, ste


def nawrot_dense_weights(ste: torch.Tensor, M: int, upsample: bool) -> torch.Tensor:
    """Reference: Nawrot's dense pooling matrices (`common` + `final` in the official `utils.py`), without
    the null group. ste (B,T) -> (B,T,M) fp32; down: pooled = einsum('btm,btd->bmd'), weights normalised
    over each group; up: out = einsum('btm,bmd->btd'), one-hot rows normalised over m. O(B T M) memory."""
    B, T = ste.shape
    c = ste.float().cumsum(1)  # (B,T) inclusive count
    c = c - ste.float() if not upsample else c - 1.0  # down: g(t) = sum_{i<t}; up: c(t) = sum_{i<=t} - 1
    dist = torch.arange(M, device=ste.device, dtype=torch.float32) - c.unsqueeze(-1)  # (B,T,M) s - count_t
    w = torch.where(dist == 0, 1.0 - dist, torch.zeros_like(dist))  # (B,T,M)
    return w / (w.sum(dim=2 if upsample else 1, keepdim=True) + 1e-9)


class DynamicPooling(BoundaryStrategy):
    """Nawrot et al.'s dynamic token pooling as the paper ported it.

    Training: one Gumbel-sigmoid sample per byte from `noise` (tests) or `generator`. Evaluation: the same
    hard rule with u drawn from the given generator (the evaluation's fixed seed), or u = 0.5, i.e.
    b_t = [p_t > 0.5], with eval_boundaries = "greedy". pooling = "select" keeps select / distribute-add:
    the predictor then learns from the prior alone (hard gathers pass no gradient to b~).

    Choices where the paper and the code are open: an RMSNorm precedes the MLP (our residual stream is not
    normalised; Nawrot's post-LN stream is); the biases start at 0 (Transformer-XL's init, p ~ 0.5 at the
    start, the prior pulls the rate down); no LayerNorm after pooling (our token blocks are pre-norm);
    forced positions (b_0, and b_{T-1} with force_last) and padding are excluded from both k and n of the
    prior, which is normalised per sequence by its n rather than by T.
    """

    config = DynamicConfig
    learns_by = "straight_through"
    own_pooling = True
    has_step = True

    def __init__(self, cfg: DynamicConfig, dim: int):
        super().__init__(cfg, dim)
        self.norm = RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def reset_parameters(self, init_std: float) -> None:
        """Weights ~ N(0, init_std^2) like the U-Net's, biases 0."""
        super().reset_parameters(init_std)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        cfg = self.cfg
        B, T, _ = x.shape
        h = x.detach() if cfg.detach_encoder else x
        logits = self.mlp(self.norm(h)).squeeze(-1).float()  # (B,T) fp32 even under autocast
        forced = forced_positions(B, T, cfg.force_last, x.device)
        noise = boundary_uniforms(noise, (B, T), greedy=not self.training and cfg.eval_boundaries == "greedy",
                                  generator=generator, device=x.device)
        mask, ste = gumbel_sigmoid_boundaries(logits, noise, cfg.gumbel_temperature, forced)
        probs = torch.sigmoid(logits).masked_fill(forced, 1.0)  # (B,T)
        return DynamicOutput(mask=mask, probs=probs, logits=logits.masked_fill(forced, 100.0), free=~forced,
                             ste=ste)

    def downsample(self, x: torch.Tensor, out: BoundaryOutput, size: int | None = None) -> Tokens:
        """Mean pooling with the straight-through gradient path (default), or select (pooling = "select")."""
        if self.cfg.pooling == "select":
            return select(x, out.mask, size)
        return mean_pool(x, out.mask, out.ste, size)

    def step(self, x_t, ids_t, t, state):
        logit = self.mlp(self.norm(x_t)).squeeze(-1).float()  # (B,)
        a = (logit + torch.logit(state.noise[:, t].float(), eps=1e-6)) > 0  # the hard Gumbel-sigmoid draw
        p = torch.sigmoid(logit)
        if t == 0:
            a, p = torch.ones_like(a), torch.ones_like(p)
        return a, p

    def step_token_input(self, x_t, a_t, state):
        """Running mean of the group that ends at this byte (bytes after the previous boundary up to t)."""
        if self.cfg.pooling == "select":
            return x_t
        return state.group.update(x_t, a_t)

    def upsample(self, y_tok: torch.Tensor, x: torch.Tensor, tokens: Tokens, out: BoundaryOutput) -> torch.Tensor:
        """Byte t gets X_t + Y'_{c(t)}, c(t) = sum_{i<=t} b_i - 1. A hard gather: Nawrot's normalised one-hot
        upsample weights equal it in the forward pass and pass zero gradient to b~ (test_dynamic.py)."""
        return distribute_add(y_tok, x, tokens)

    def losses(self, out, logp, logp_early, valid, reduce=None):
        """The binomial prior L_B on the free (non-forced, non-padding) positions, and p's mean. The prior is
        per sequence, so it needs no global-batch statistics (`reduce` is unused)."""
        cfg = self.cfg
        keep = (valid & out.free).float()  # (B,T)
        n = keep.sum(1)  # (B,)
        k = (out.ste * keep).sum(1)  # (B,) differentiable boundary count
        alpha = cfg.target_rate
        log_pmf = (torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
                   + k * math.log(alpha) + (n - k) * math.log1p(-alpha))  # (B,) log Binomial(k; n, alpha)
        has = (n > 0).float()
        prior = -(log_pmf / n.clamp(min=1) * has).sum() / has.sum().clamp(min=1)
        p_mean = (out.probs * keep).sum() / keep.sum().clamp(min=1)
        return {"loss/prior": cfg.prior_weight * prior, "boundary/p_mean": p_mean.detach()}
