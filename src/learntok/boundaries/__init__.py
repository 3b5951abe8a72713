"""Boundary strategies. A new strategy is one module plus one entry in REGISTRY (docs/extending.md).

Entries are "module:Class" strings imported on first use, so a strategy's optional dependencies are only
needed when it is selected. Each class names the dataclass of its options in `config`.
"""

from __future__ import annotations

import importlib
import importlib.util

from learntok.boundaries.base import BoundaryConfig, BoundaryOutput, BoundaryStrategy
from learntok.boundaries.pooling import Tokens

REGISTRY: dict[str, str] = {
    "learned": "learntok.boundaries.learned:LearnedBoundaries",
    "uniform": "learntok.boundaries.uniform:UniformBoundaries",
    "uniform-random": "learntok.boundaries.uniform:UniformRandomBoundaries",
    "whitespace": "learntok.boundaries.whitespace:WhitespaceBoundaries",
    "bpe": "learntok.boundaries.bpe:BPEBoundaries",
    "dynamic": "learntok.boundaries.dynamic:DynamicPooling",
    "hnet": "learntok.boundaries.hnet:HNetChunking",
    "entropy": "learntok.boundaries.entropy:EntropyBoundaries",
    "flat": "learntok.boundaries.flat:FlatBoundaries",
}


def strategy_class(name: str) -> type[BoundaryStrategy]:
    """The class registered under `name`."""
    if name not in REGISTRY:
        raise ValueError(f"unknown boundary strategy {name!r}; choose one of: {', '.join(REGISTRY)}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def config_class(name: str) -> type[BoundaryConfig]:
    """The dataclass of the options of strategy `name`."""
    return strategy_class(name).config


def boundary_config(name: str, **options) -> BoundaryConfig:
    """The options of strategy `name` (defaults, overridden by `options`)."""
    return config_class(name)(boundaries=name, **options)


def available() -> list[str]:
    """Registered strategies whose module exists in this installation."""
    return [name for name, target in REGISTRY.items() if importlib.util.find_spec(target.split(":")[0]) is not None]


def build_strategy(cfg: BoundaryConfig, dim: int) -> BoundaryStrategy:
    """Instantiate the strategy that `cfg` configures, for encoder width `dim`."""
    return strategy_class(cfg.boundaries)(cfg, dim)


__all__ = ["REGISTRY", "BoundaryConfig", "BoundaryOutput", "BoundaryStrategy", "Tokens", "available",
           "boundary_config", "build_strategy", "config_class", "strategy_class"]
