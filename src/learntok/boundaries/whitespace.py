"""SpaceByte's rule (Slagle 2024): a boundary at a spacelike byte that follows a non-spacelike one.

Spacelike bytes: ASCII whitespace and punctuation/symbols; letters, digits and every byte >= 0x80 are word
bytes (SpaceByte's own code counts UTF-8 lead bytes as spacelike, which splits non-Latin text more finely;
docs/baselines.md). Runs of spaces or punctuation give one boundary at their start. a_t depends on x_t and x_{t-1}
only: causal by construction. The rate is whatever the text gives (reported, not set)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learntok.boundaries.base import BoundaryConfig, BoundaryOutput, BoundaryStrategy, StepState
from learntok.nn import shape_cache


@dataclass(frozen=True, kw_only=True)
class WhitespaceConfig(BoundaryConfig):
    """Options of `--boundaries whitespace` (no rate: the text sets it)."""

    boundaries: str = "whitespace"


@shape_cache(maxsize=8)
def spacelike_table(device: torch.device | None = None) -> torch.Tensor:
    """(512,) bool over ids: True for spacelike bytes (and for the special ids, which separate documents).
    Built once per device (not copied to a GPU at every forward pass); read it, never write to it. Slices, not
    a loop over bytes: under torch.compile the graph builds it."""
    table = torch.ones(512, dtype=torch.bool, device=device)
    for lo, hi in ((ord("0"), ord("9")), (ord("A"), ord("Z")), (ord("a"), ord("z")), (0x80, 0xFF)):
        table[lo:hi + 1] = False  # ASCII letters and digits (exactly str.isalnum below 0x80), and bytes >= 0x80
    return table


def spacebyte_boundaries(ids: torch.Tensor) -> torch.Tensor:
    """(B,T) ids -> (B,T) bool: spacelike(x_t) and not spacelike(x_{t-1}); position 0 (BOS) is True."""
    space = spacelike_table(ids.device)[ids]  # (B,T)
    prev = torch.nn.functional.pad(space[:, :-1], (1, 0), value=True)
    mask = space & ~prev
    mask[:, 0] = True
    return mask


@dataclass(kw_only=True)
class WhitespaceState(StepState):
    prev_space: torch.Tensor
    """(B,) whether the previous byte was spacelike."""


class WhitespaceBoundaries(BoundaryStrategy):
    config = WhitespaceConfig
    learns_by = "prescribed"
    has_step = True

    def init_step_state(self, batch, noise):
        return WhitespaceState(noise=noise, prev_space=torch.ones(batch, dtype=torch.bool, device=noise.device))

    def step(self, x_t, ids_t, t, state):
        space = spacelike_table(ids_t.device)[ids_t]  # (B,)
        a = space & ~state.prev_space if t > 0 else torch.ones_like(space)
        state.prev_space = space
        return a, a.float()

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        mask = spacebyte_boundaries(ids)
        return BoundaryOutput(mask=mask, probs=mask.float())
