"""A run on disk: its directory, config.json with provenance, and the training state in its checkpoints.

A checkpoint holds the full (unsharded) weights, the optimizer, the data position, the torch RNG and the
counters of `TrainState`; resuming from it continues bit for bit (tests/test_train.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as tdist

from learntok import __version__
from learntok.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from learntok.config import TrainConfig, to_dict
from learntok.data import BatchIterator
from learntok.train.parallel import Dist, full_state


@dataclass
class TrainState:
    """The counters a run carries across steps and checkpoints."""

    step: int = 0
    """Optimizer steps taken."""
    bytes_seen: int = 0
    """Training bytes consumed (all processes)."""
    tokens_seen: int = 0
    """Token-level positions processed (all processes)."""
    flops: float = 0.0
    """Training FLOPs by the paper's 6 x matrix-parameters accounting."""
    elapsed: float = 0.0
    """Training seconds (evaluation and checkpoint pauses excluded)."""


def open_run_dir(out: Path, resume: bool, overwrite: bool, d: Dist) -> Path | None:
    """Check `out` before training: an existing run is never replaced silently (clear it with `overwrite`).
    Returns the checkpoint to resume from (None for a fresh run)."""
    if not resume and (out / "metrics.jsonl").exists():
        if not overwrite:
            raise ValueError(f"{out} already holds a run; continue it with --resume {out}, replace it with "
                             "--overwrite, or choose another --out")
        if d.is_main:
            for p in [*out.glob("step_*"), out / "latest", out / "metrics.jsonl"]:
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        if d.active:
            tdist.barrier()
    ckpt = latest_checkpoint(out) if resume else None
    if resume and ckpt is None:
        raise ValueError(f"--resume {out}: no complete checkpoint found there")
    return ckpt


def run_info() -> dict:
    """Code version, library versions and hardware, recorded in config.json."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    import numpy

    return {"learntok": __version__, "git_sha": sha, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def write_config(out: Path, cfg: TrainConfig, world: int) -> None:
    """RUN/config.json: the full config plus `run_info` provenance (written atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps({**to_dict(cfg), "run_info": {**run_info(), "world_size": world}}, indent=2) + "\n")
    os.replace(tmp, out / "config.json")


def save_state(out: Path, model, wrapped, opt, batches: BatchIterator, state: TrainState, d: Dist, *, sharded: bool,
               barrier: bool = True) -> None:
    """Write a checkpoint of `state.step`. Gathering FSDP2 shards is collective, so every rank calls this;
    rank 0 writes."""
    tensors, optim = full_state(model, wrapped, opt, sharded)
    if d.is_main:
        save_checkpoint(out, state.step, tensors, {
            "optimizer": optim, "data": batches.state_dict(), "torch_rng": torch.get_rng_state(),
            **dataclasses.asdict(state), "world_size": d.world})
    if barrier and d.active:
        tdist.barrier()


def restore_state(ckpt: Path, model, batches: BatchIterator) -> tuple[TrainState, dict]:
    """Load a checkpoint's weights into `model` (before any sharding), the data position into `batches` and the
    torch RNG; returns the counters and the (full) optimizer state dict."""
    raw = load_checkpoint(ckpt, model)
    batches.load_state_dict(raw["data"])
    torch.set_rng_state(raw["torch_rng"])
    return TrainState(**{f.name: raw[f.name] for f in dataclasses.fields(TrainState)}), raw["optimizer"]
