"""Prescribed boundaries every round(1/pi_target) bytes: a_t = [t mod s = 0] (the paper's evenly spaced
"Uniform"; method.md §5). No parameters, no loss."""

from __future__ import annotations

import torch

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy
from learntok.config import BoundaryConfig


class UniformBoundaries(BoundaryStrategy):
    learns_by = "prescribed"

    def __init__(self, cfg: BoundaryConfig, dim: int):
        super().__init__()
        self.stride = max(1, round(1 / cfg.target_rate))
        self.force_last = cfg.force_last

    def propose(self, x, ids, *, noise, generator):
        B, T = ids.shape
        t = torch.arange(T, device=ids.device)
        mask = (t % self.stride == 0).expand(B, T).clone()  # (B,T)
        if self.force_last:
            mask[:, -1] = True
        return BoundaryOutput(mask=mask, probs=mask.float())
