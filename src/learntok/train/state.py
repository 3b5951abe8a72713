"""A run on disk: its directory, config.json with provenance, and the training state in its checkpoints.

A checkpoint holds the full (unsharded) weights, the optimizer, the data position, the torch RNG and the
counters of `TrainState`; resuming from it continues bit for bit (tests/test_train.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as tdist

from learntok import atomic
from learntok.checkpoint import clean_stale, find_checkpoint, load_checkpoint, save_checkpoint
from learntok.config import TrainConfig, to_dict
from learntok.data import BatchIterator
from learntok.records import provenance
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
    """Training FLOPs by the paper's 6 x matrix-parameters accounting (learntok.train.flops)."""
    flops_padded: float = 0.0
    """The same with the token level counted at its padded slots (0 in checkpoints written before it existed)."""
    flops_total: float = 0.0
    """6N plus attention's products (0 in checkpoints written before it existed)."""
    elapsed: float = 0.0
    """Training seconds (evaluation and checkpoint pauses excluded)."""
    skipped_steps: int = 0
    """Updates skipped because the loss or the gradient norm was not finite."""


def open_run_dir(out: Path, resume: bool, overwrite: bool, d: Dist, log=print,
                 artifacts: Sequence[str] = ()) -> Path | None:
    """Check `out` before training: an existing run is never replaced silently (clear it with `overwrite`, which
    also removes the strategy's files named in `artifacts` and an old eval.json, so that a replaced BPE or entropy
    run trains its tokenizer or entropy model again for its new settings). Call it before the strategy is
    prepared. Returns the checkpoint to resume from (None for a fresh run).

    Resuming takes the newest intact checkpoint (a damaged newer one is skipped with a warning, see
    `learntok.checkpoint.find_checkpoint`), removes temporary files of interrupted checkpoint writes, and drops
    the metric lines logged after that checkpoint (the resumed run logs them again, identically). A run with no
    intact checkpoint yet starts again from step 0 with a warning. Rank 0 decides; the others follow."""
    if not resume and (out / "metrics.jsonl").exists():
        if not overwrite:
            raise ValueError(f"{out} already holds a run: continue it with resume='{out}' (--resume), replace it "
                             "with overwrite=True (--overwrite), or choose another out (--out)")
        if d.is_main:
            for p in [*out.glob("step_*"), out / "latest", out / "metrics.jsonl", out / "eval.json",
                      *(out / name for name in artifacts)]:
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        if d.active:
            tdist.barrier()
    if not resume:
        return None
    name = [None]
    if d.is_main:
        stale = clean_stale(out)
        if stale:
            log(f"removed {len(stale)} temporary file(s) of an interrupted checkpoint write: {', '.join(stale)}")
        ckpt, notes = find_checkpoint(out)
        for note in notes:
            log(f"warning: {note}")
        if ckpt is None:
            log(f"warning: --resume {out}: no intact checkpoint yet; starting again from step 0")
        dropped = truncate_metrics(out, ckpt_step(ckpt) if ckpt is not None else 0)
        if dropped:
            log(f"dropped {dropped} metric line(s) logged after the checkpoint (the resumed run logs them again)")
        name = [ckpt.name if ckpt is not None else None]
    if d.active:
        tdist.broadcast_object_list(name, src=0)
    return out / name[0] if name[0] is not None else None


def ckpt_step(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])


def truncate_metrics(out: Path, step: int) -> int:
    """Drop metrics.jsonl lines of steps after `step` (atomically); returns how many were dropped."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    keep = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by the kill: drop it too
        if not isinstance(row, dict) or not isinstance(row.get("step", 0), (int, float)):
            continue  # not a metrics line (hand-edited, damaged): dropped as well
        row_step = row.get("step", 0)
        if row_step <= step:
            keep.append(line if line.endswith("\n") else line + "\n")
    if len(keep) == len(lines):
        return 0
    atomic.write_text(path, "".join(keep))
    return len(lines) - len(keep)


def run_info() -> dict:
    """Code version (git SHA, dirty flag), library versions and hardware, recorded in config.json."""
    return {**provenance(), "torch_threads": torch.get_num_threads()}


def write_config(out: Path, cfg: TrainConfig, world: int, step: int = 0, log=print) -> None:
    """RUN/config.json: the full config plus `run_info` provenance (written atomically). `run_info["sessions"]`
    keeps one entry per start of training (fresh or resumed: the step it started from, the data source, git SHA
    and dirty flag, time), so a run continued on other code or other data says so; a resume whose data source
    differs from the previous session's is also logged as a warning."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    sessions = []
    if cfg.resume and path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        info = old.get("run_info", {})
        sessions = info.get("sessions") or [{"step": 0, "data": old.get("data", {}).get("source"),
                                             "git_sha": info.get("git_sha"), "time": info.get("time")}]
        if sessions[-1].get("data") != cfg.data.source:
            log(f"warning: --resume {out}: the run trained on {sessions[-1].get('data')!r} until step {step} and "
                f"continues on {cfg.data.source!r} (recorded in config.json's run_info.sessions)")
    info = {**run_info(), "world_size": world}
    sessions.append({"step": step, "data": cfg.data.source, "git_sha": info["git_sha"], "git_dirty": info["git_dirty"],
                     "time": info["time"]})
    atomic.write_text(path, json.dumps({**to_dict(cfg), "run_info": {**info, "sessions": sessions}}, indent=2) + "\n")


def save_state(out: Path, model, wrapped, opt, batches: BatchIterator, state: TrainState, d: Dist, *, sharded: bool,
               window: dict | None = None, batch_stats: dict | None = None, barrier: bool = True) -> None:
    """Write a checkpoint of `state.step`, with the log window's accumulators (`window`, already agreed over
    ranks) so that the first metric line after a resume is the uninterrupted run's, and the estimator's lagged
    statistics (`batch_stats`, --batch-stats lagged). Gathering FSDP2 shards is collective, so every rank calls
    this; rank 0 writes."""
    tensors, optim = full_state(model, wrapped, opt, sharded)
    data, ranks = batches.state_dict(), None
    if d.active and d.world > 1 and barrier:  # a stream's position is each rank's own (collective: not after Ctrl-C)
        ranks = [None] * d.world
        tdist.all_gather_object(ranks, data)
    if d.is_main:
        save_checkpoint(out, state.step, tensors, {
            "optimizer": optim, "data": data, "data_ranks": ranks, "torch_rng": torch.get_rng_state(),
            **dataclasses.asdict(state), "world_size": d.world, "window": window, "batch_stats": batch_stats})
    if barrier and d.active:
        tdist.barrier()


def restore_state(ckpt: Path, model, batches: BatchIterator, d: Dist | None = None) -> tuple[TrainState, dict, dict]:
    """Load a checkpoint's weights into `model` (before any sharding), the data position into `batches` (this
    rank's own when the checkpoint has one per rank and the world size is the same; else rank 0's) and the
    torch RNG; returns the counters, the (full) optimizer state dict and what else `save_state` stored:
    `window` (the log window's accumulators) and `batch_stats` (the estimator's lagged statistics), each None
    when absent (older checkpoints)."""
    raw = load_checkpoint(ckpt, model)
    d = d or Dist()
    ranks = raw.get("data_ranks")
    batches.load_state_dict(ranks[d.rank] if ranks and len(ranks) == d.world else raw["data"])
    torch.set_rng_state(raw["torch_rng"])
    counters = {f.name: raw[f.name] for f in dataclasses.fields(TrainState) if f.name in raw}
    return TrainState(**counters), raw["optimizer"], {k: raw.get(k) for k in ("window", "batch_stats")}
