"""Content-free baselines: `uniform`, a boundary every round(1/pi_target) bytes (the paper's evenly spaced
"Uniform"), and `uniform-random`, exactly round(T * pi_target) boundaries at random positions (the authors'
code's "Uniform random"). No parameters, no loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy, RateConfig, StepState


@dataclass(frozen=True, kw_only=True)
class UniformConfig(RateConfig):
    """Options of `--boundaries uniform`: a_t = [t mod round(1/target_rate) = 0]."""

    boundaries: str = "uniform"


@dataclass(frozen=True, kw_only=True)
class UniformRandomConfig(RateConfig):
    """Options of `--boundaries uniform-random`: exactly round(T * target_rate) boundaries per sequence."""

    boundaries: str = "uniform-random"


class UniformBoundaries(BoundaryStrategy):
    config = UniformConfig
    learns_by = "prescribed"
    has_step = True

    def __init__(self, cfg: UniformConfig, dim: int):
        super().__init__(cfg, dim)
        self.stride = max(1, round(1 / cfg.target_rate))

    def step(self, x_t, ids_t, t, state):
        a = torch.full(ids_t.shape, t % self.stride == 0, dtype=torch.bool, device=ids_t.device)
        return a, a.float()

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        B, T = ids.shape
        t = torch.arange(T, device=ids.device)
        mask = (t % self.stride == 0).expand(B, T).clone()  # (B,T)
        if self.cfg.force_last:
            mask[:, -1] = True
        return BoundaryOutput(mask=mask, probs=mask.float())


@dataclass(kw_only=True)
class FixedMaskState(StepState):
    mask: torch.Tensor
    """(B, T_total) every boundary of the generation, drawn in advance."""


class UniformRandomBoundaries(BoundaryStrategy):
    """Exactly K = round(T * pi_target) boundaries per sequence at uniformly random positions, redrawn every
    forward pass (the authors' code's `ExactRandomGater`, "Uniform random" in the paper's Figure 3): the top-K
    of per-byte uniforms with position 0 (and the last byte with --force-last) forced. Content-free, so causal
    in content. The top-K depends on the row's length, so a prefix's boundaries are not the whole row's; cached
    generation fixes the positions for the planned length instead (docs/baselines.md)."""

    config = UniformRandomConfig
    learns_by = "random"
    has_step = True

    def init_step_state(self, batch, noise):
        # The top-K of the noise over the whole generation length: positions are fixed in advance.
        ids = torch.zeros(noise.shape, dtype=torch.long, device=noise.device)
        return FixedMaskState(noise=noise, mask=self.propose(None, ids, noise=noise, generator=None).mask)

    def step(self, x_t, ids_t, t, state):
        a = state.mask[:, t]
        return a, torch.full(a.shape, self.cfg.target_rate, device=a.device)

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        B, T = ids.shape
        u = noise if noise is not None else torch.rand(B, T, generator=generator, device=ids.device)
        u = u.clone()
        u[:, 0] = 2.0  # forced: above every uniform
        if self.cfg.force_last:
            u[:, -1] = 2.0
        k = min(T, max(1, round(T * self.cfg.target_rate)))
        top = u.topk(k, dim=1).indices  # (B,K)
        mask = torch.zeros(B, T, dtype=torch.bool, device=ids.device).scatter_(1, top, True)
        return BoundaryOutput(mask=mask, probs=torch.full((B, T), self.cfg.target_rate, device=ids.device))
