"""Boundary strategies. A new strategy is one module plus one entry in REGISTRY.

Entries are "module:Class" strings imported on first use, so a strategy's optional dependencies (e.g. the
`tokenizers` library for BPE) are only needed when it is selected.
"""

from __future__ import annotations

import importlib

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy, Tokens
from learntok.config import BoundaryConfig

REGISTRY: dict[str, str] = {
    "learned": "learntok.boundaries.learned:LearnedBoundaries",
    "uniform": "learntok.boundaries.uniform:UniformBoundaries",
    "uniform-random": "learntok.boundaries.uniform:UniformRandomBoundaries",
    "whitespace": "learntok.boundaries.whitespace:WhitespaceBoundaries",
    "bpe": "learntok.boundaries.bpe:BPEBoundaries",
    "dynamic": "learntok.boundaries.dynamic:DynamicPooling",
    "hnet": "learntok.boundaries.hnet:HNetChunking",
    "entropy": "learntok.boundaries.entropy:EntropyBoundaries",
}


def strategy_class(name: str) -> type[BoundaryStrategy]:
    """The class registered under `name`."""
    if name not in REGISTRY:
        raise ValueError(f"unknown boundary strategy {name!r}; choose one of: {', '.join(REGISTRY)}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def available() -> list[str]:
    """Registered strategies whose module exists in this installation."""
    names = []
    for name, target in REGISTRY.items():
        if importlib.util.find_spec(target.split(":")[0]) is not None:
            names.append(name)
    return names


def build_strategy(cfg: BoundaryConfig, dim: int) -> BoundaryStrategy:
    """Instantiate the strategy named by `cfg.boundaries`. `cfg.pooling == "mean"` switches strategies that use
    the default select pooling to mean pooling; strategies with their own pooling (dynamic, hnet) keep it."""
    cls = strategy_class(cfg.boundaries)
    strategy = cls(cfg, dim)
    own = cls.downsample is not BoundaryStrategy.downsample or cls.upsample is not BoundaryStrategy.upsample
    strategy.mean_pooling = cfg.pooling == "mean" and not own
    return strategy


__all__ = ["REGISTRY", "BoundaryOutput", "BoundaryStrategy", "Tokens", "available", "build_strategy",
           "strategy_class"]
