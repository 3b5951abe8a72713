"""Presets: plain functions returning a TrainConfig. The command line overrides any field.

| preset          | what it is                                                                  |
|-----------------|-----------------------------------------------------------------------------|
| tiny            | the CPU demo: a few minutes on 2 cores, on the built-in data                |
| small           | 20 minutes on 2 CPU cores where learned boundaries matter (docs/results.md) |
| paper-147m      | paper Table 2, FineWeb column (d 768, 4/12/4, 128 x 4096 B, 6e9 bytes)      |
| paper-90m-code  | paper Table 2, CodeParrot column (d 768, 4/6/4, 3.4e9 bytes)                |
| paper-aspect-N  | paper Table 2, aspect-ratio column: d 512, 4/N/4, rate 1/N (default N = 5)  |
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from learntok.boundaries.learned import LearnedConfig
from learntok.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

SMALL_SCALE_POLICY = LearnedConfig(gamma=0.9, normalize_advantage=True, detach_encoder=True, policy_window=0,
                                   logit_scale=2.0, pooling="mean")
"""The settings that make the policy learn within minutes on a CPU (experiments/small_scale/SCREENING.md): a
shorter return horizon, advantages in units of their spread, no policy gradient into the encoder (dynamic's
predictor is detached too), independent decisions, logits that move 8x faster than the paper's D = 16, and
tokens that are the mean of their bytes (for every select-based strategy, baselines included). No RMSNorm on
the policy's input (a re-screen found it a tie, so the paper's form). gamma < 1, normalised advantages
and the detached encoder each bias the policy gradient (docs/method.md)."""

SMALL_SCALE_MODEL = ModelConfig(d_model=128, n_heads=2, n_down=1, n_mid=3, n_up=1, byte_window=8)
"""A byte window of 8 with 3 token-level layers: context beyond 8 bytes has to pass through the tokens."""


def tiny() -> TrainConfig:
    """About 4 minutes of training on 2 CPU cores (1,000 steps of 8 x 512 bytes), with the small-scale model
    shape and estimator settings so that the boundaries it learns mean something."""
    return TrainConfig(
        preset="tiny", out="runs/tiny",
        model=SMALL_SCALE_MODEL,
        boundary=SMALL_SCALE_POLICY,
        data=DataConfig(seq_len=512),
        optim=OptimConfig(warmup_bytes=2e5, lr=3e-3),
        batch_size=8, max_bytes=1000 * 8 * 512,
        eval_every=250, ckpt_every=250, log_every=10,
    )


def small() -> TrainConfig:
    """The small-scale study's configuration (docs/results.md): `tiny`'s model and settings for 2.4e7 bytes,
    about 20 minutes on 2 CPU cores. For equal-time comparisons add --schedule time --time-budget 1200."""
    return replace(tiny(), preset="small", out="runs/small", max_bytes=2.4e7, eval_every=500, ckpt_every=500,
                   log_every=10)


def _paper(name: str, *, d: int, heads: int, mid: int, lr: float, batch: int, warmup: float, total: float,
           rate: float = 0.2) -> TrainConfig:
    """Shared shape of the paper's recipes (Table 2): byte window 64, 4096-byte sequences, AdamW(0.9, 0.999),
    cosine after warm-up, the paper's document rule (keep >= N bytes, truncate)."""
    return TrainConfig(
        preset=name, out=f"runs/{name}",
        model=ModelConfig(d_model=d, n_heads=heads, n_down=4, n_mid=mid, n_up=4, byte_window=64),
        boundary=LearnedConfig(target_rate=rate),
        data=DataConfig(seq_len=4096, pack=False, val_bytes=4096 * 256),
        optim=OptimConfig(warmup_bytes=warmup, lr=lr, min_lr_ratio=0.0),
        batch_size=batch, micro_batch_size=PAPER_MICRO_BATCH, max_bytes=total,
        eval_every=500, ckpt_every=500, log_every=10,
    )


PAPER_MICRO_BATCH = 8
"""Sequences of 4096 bytes per forward pass in the paper presets: the whole per-process batch (128 sequences in
one process) would need hundreds of GiB of activations; 8 fits an 80 GB GPU with room to spare (estimate:
bench/estimate_memory.py, docs/gpu.md). The batch is accumulated to the paper's size (same update); on N
GPUs each process accumulates 128 / N / 8 micro-batches."""


def paper_147m() -> TrainConfig:
    return _paper("paper-147m", d=768, heads=12, mid=12, lr=1.5e-3, batch=128, warmup=4.5e8, total=6e9)


def paper_90m_code() -> TrainConfig:
    return _paper("paper-90m-code", d=768, heads=12, mid=6, lr=2e-3, batch=128, warmup=2.5e8, total=3.4e9)


def paper_aspect(n: int = 5) -> TrainConfig:
    """Aspect-ratio study: n token-level layers and target rate 1/n."""
    return _paper(f"paper-aspect-{n}", d=512, heads=8, mid=n, lr=3e-3, batch=64, warmup=1.1e8, total=1.5e9,
                  rate=1.0 / n)


PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "tiny": tiny,
    "small": small,
    "paper-147m": paper_147m,
    "paper-90m-code": paper_90m_code,
    "paper-aspect": paper_aspect,
}


def get_preset(name: str) -> TrainConfig:
    """Look up a preset by name; `paper-aspect-N` selects N token-level layers."""
    m = re.fullmatch(r"paper-aspect-(\d+)", name)
    if m:
        return paper_aspect(int(m.group(1)))
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}, paper-aspect-N")
    return PRESETS[name]()
