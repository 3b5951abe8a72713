"""Boundary strategies. A new strategy is one module plus one entry in REGISTRY."""

from __future__ import annotations

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy, Tokens
from learntok.boundaries.learned import LearnedBoundaries
from learntok.boundaries.uniform import UniformBoundaries
from learntok.config import BoundaryConfig

REGISTRY: dict[str, type[BoundaryStrategy]] = {
    "learned": LearnedBoundaries,
    "uniform": UniformBoundaries,
}


def build_strategy(cfg: BoundaryConfig, dim: int) -> BoundaryStrategy:
    """Instantiate the strategy named by `cfg.boundaries`."""
    if cfg.boundaries not in REGISTRY:
        raise ValueError(f"unknown boundary strategy {cfg.boundaries!r}; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[cfg.boundaries](cfg, dim)


__all__ = ["REGISTRY", "BoundaryOutput", "BoundaryStrategy", "Tokens", "build_strategy"]
