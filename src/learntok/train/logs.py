"""What a run reports: per-step figures averaged over a log window, written to every sink.

Sinks: RUN/metrics.jsonl (always, on rank 0), TensorBoard (`--tensorboard`), Weights & Biases (`--wandb`), and
for people either a progress bar (on a terminal) or one plain line per log window (in a file, e.g. a SLURM or
Kubernetes log, where a bar's carriage-return frames are unreadable). Every sink gets the same window figures.
metrics.jsonl holds training lines (`step`, `bytes`, `flops`, `time`, `loss/*`, `boundary/*`, `reinforce/*`,
`train/*`) and evaluation lines (`step`, `bytes`, `flops`, `time`, `val/*`).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import secrets
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from learntok.bpb import LN2
from learntok.errors import MissingDependency
from learntok.train.parallel import Dist, reduce_means

MAX_KEYS = ("boundary/max_tokens",)
"""Logged as the maximum over the window and the ranks, not the mean."""


def _maximum(a: float | torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max(a, b) on b's device, without reading b back or copying a host number to the device (a: a running
    maximum, 0.0 before the first)."""
    return b.clamp(min=a) if isinstance(a, float) else torch.maximum(a, b)


class StepMetrics:
    """Sums of one log window's per-step figures (each step's own figures averaged over its micro-batches).

    A step whose update was skipped (non-finite loss or gradient norm) is counted, not averaged in. The window's
    sums are part of a checkpoint (`state_dict`), so the first line after a resume averages the same steps as
    the uninterrupted run's."""

    def __init__(self, start: tuple[float, int] = (0.0, 0)) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.skipped = 0
        self.start = start
        """(training seconds, bytes seen) when the window began, for its throughput."""
        self._step: dict[str, float] = defaultdict(float)

    def add_micro(self, out, accum: int) -> None:
        """Add one micro-batch's `ModelOutput`, weighted 1/accum, to the current step. The figures stay on the
        device (no synchronisation per step); `window` and `state_dict` read them."""
        for k, v in {**out.terms, **out.boundaries.stats}.items():
            self._step[k] = self._step[k] + (v.detach().float() if torch.is_tensor(v) else v) / accum
        self._step["boundary/rate"] = self._step["boundary/rate"] + out.boundaries.mask.float().mean() / accum
        self._step["boundary/max_tokens"] = _maximum(self._step["boundary/max_tokens"], out.n_tokens.max().float())
        if out.pad_share is not None:  # --token-bucket / --compile: the price of static shapes
            self._step["train/token_pad_share"] = self._step["train/token_pad_share"] + out.pad_share / accum
        if out.super_pad_share is not None:
            self._step["train/super_pad_share"] = self._step["train/super_pad_share"] + out.super_pad_share / accum

    def end_step(self, grad_norm: float, applied: bool = True) -> None:
        """Close the current step: add its figures to the window, or only count it when its update was skipped."""
        if applied:
            for k, v in self._step.items():
                self.sums[k] = _maximum(self.sums[k], v) if k in MAX_KEYS else self.sums[k] + v
            self.sums["train/grad_norm"] += grad_norm
            self.steps += 1
        else:
            self.skipped += 1
        self._step.clear()

    def _sums(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.sums.items()}

    def window(self, d: Dist, now: tuple[float, int]) -> dict[str, float]:
        """The window's means (maxima for MAX_KEYS) over all ranks, and its throughput up to `now` (training
        seconds, bytes seen); then start a new window."""
        rec = {k: v if k in MAX_KEYS else v / max(self.steps, 1) for k, v in self._sums().items()}
        rec = reduce_means(rec, d, MAX_KEYS)
        if "loss/auto" in rec:
            rec["train/bpb"] = rec["loss/auto"] / LN2
        if self.skipped:
            rec["train/skipped_steps"] = self.skipped
        rec["train/bytes_per_s"] = (now[1] - self.start[1]) / max(now[0] - self.start[0], 1e-9)
        self.sums.clear()
        self.steps = self.skipped = 0
        self.start = now
        return rec

    def state_dict(self, d: Dist) -> dict:
        """The open window, agreed over ranks (collective: every rank calls it; rank means of the sums, which
        the ranks' later sums add to linearly)."""
        sums = reduce_means(self._sums(), d, MAX_KEYS) if self.sums else {}
        return {"sums": sums, "steps": self.steps, "skipped": self.skipped, "start": list(self.start)}

    def load_state_dict(self, sd: dict) -> None:
        self.sums = defaultdict(float, sd["sums"])
        self.steps, self.skipped, self.start = sd["steps"], sd["skipped"], tuple(sd["start"])


class TensorBoardLogger:
    """TensorBoard event files under RUN_DIR/tensorboard: every numeric figure, and boundary-map images.
    Needs the `tensorboard` package (pip install 'learntok[tensorboard]'), imported when a logger is made."""

    def __init__(self, run_dir: str | Path, subdir: str = "tensorboard") -> None:
        try:
            import tensorboard  # noqa: F401  (torch's module imports it lazily and fails later otherwise)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise MissingDependency(f"--tensorboard needs the tensorboard package: pip install 'learntok[tensorboard]' "
                              f"({e})") from e
        self.log_dir = Path(run_dir) / subdir
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def scalars(self, step: int, values: dict) -> int:
        """Log every finite real number of `values` under its key; `step` itself is the x-axis. Returns how
        many scalars were written."""
        n = 0
        for key, v in values.items():
            if key == "step" or isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                continue
            self.writer.add_scalar(key, float(v), global_step=step)
            n += 1
        return n

    def image(self, step: int, img: np.ndarray, tag: str = "boundaries/map") -> None:
        """An (H,W,3) uint8 image, e.g. a boundary map."""
        self.writer.add_image(tag, img, global_step=step, dataformats="HWC")

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run for a run directory: the config, every logged figure, a boundary-map image per
    evaluation. Needs the `wandb` package (pip install 'learntok[wandb]'); WANDB_MODE=offline writes the run
    under RUN_DIR/wandb (or under $WANDB_DIR when set) with no network (upload it later with `wandb sync`). A
    resumed run continues the same W&B run (its id is kept in RUN_DIR/wandb/run_id)."""

    def __init__(self, run_dir: str | Path, config: dict, project: str, entity: str = "") -> None:
        try:
            import wandb
        except ImportError as e:
            raise MissingDependency(f"--wandb needs the wandb package: pip install 'learntok[wandb]' ({e})") from e
        self.wandb = wandb
        root = Path(run_dir) / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        id_file = root / "run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=project, entity=entity or None, name=Path(run_dir).resolve().name,
                              id=run_id, resume="allow", dir=os.environ.get("WANDB_DIR") or str(run_dir),
                              config=config)

    def scalars(self, step: int, values: dict) -> None:
        self.run.log({k: v for k, v in values.items()
                      if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}, step=step)

    def image(self, step: int, img: np.ndarray, tag: str = "boundaries/map") -> None:
        self.run.log({tag: self.wandb.Image(img)}, step=step)

    def close(self) -> None:
        self.run.finish()


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def format_line(rec: dict, total: int | None) -> str:
    """A training window as one plain log line (the figures of its metrics.jsonl line)."""
    parts = [f"step {rec['step']}" + (f"/{total}" if total else ""), f"{rec['bytes'] / 1e6:.2f} MB"]
    for key, label, fmt in (("loss/auto", "loss", ".4f"), ("train/bpb", "bpb", ".4f"), ("boundary/rate", "rate", ".3f"),
                            ("train/grad_norm", "grad", ".3g"), ("train/lr", "lr", ".2e")):
        if key in rec:
            parts.append(f"{label} {rec[key]:{fmt}}")
    parts.append(f"{rec['train/bytes_per_s'] / 1e3:.1f} kB/s")
    if rec.get("train/skipped_steps"):
        parts.append(f"skipped {rec['train/skipped_steps']}")
    eta = ""
    if total and rec["step"] and rec.get("time"):
        eta = f", eta {_duration(rec['time'] / rec['step'] * (total - rec['step']))}"
    parts.append(f"time {_duration(rec.get('time', 0.0))}{eta}")
    return " | ".join(parts)


def resolve_style(style: str, stream=None) -> str:
    """auto -> bar when the stream (stderr, where the bar goes) is a terminal, else lines."""
    if style != "auto":
        return style
    stream = stream or sys.stderr
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "lines"


class Sinks:
    """metrics.jsonl, TensorBoard, W&B and the progress display of one run; only rank 0 writes anything.

    `style` (with `progress`): "bar" (tqdm on stderr), "lines" (one plain line per log window through `log`) or
    "auto" (bar on a terminal, lines otherwise)."""

    def __init__(self, out: Path, d: Dist, *, progress: bool, tensorboard: bool, total: int | None, initial: int,
                 log: Callable[[str], None], style: str = "auto", wandb: dict | None = None,
                 listener: Callable[[dict], None] | None = None):
        self.log = log
        self.listener = listener
        """Called with a copy of every metrics line, on every process (train's on_log)."""
        self.total = total
        self.file = open(out / "metrics.jsonl", "a") if d.is_main else None  # noqa: SIM115 (closed in close())
        self.tb = TensorBoardLogger(out) if tensorboard and d.is_main else None
        self.wb = WandbLogger(out, **wandb) if wandb is not None and d.is_main else None
        self.bar = None
        self.lines = progress and d.is_main and resolve_style(style) == "lines"
        if progress and d.is_main and not self.lines:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)

    def write(self, rec: dict) -> None:
        """One line of metrics.jsonl (and the same scalars in TensorBoard and W&B)."""
        if self.file is not None:
            self.file.write(json.dumps(rec) + "\n")
            self.file.flush()
        if self.tb is not None:
            self.tb.scalars(rec["step"], rec)
        if self.wb is not None:
            self.wb.scalars(rec["step"], rec)
        if self.listener is not None:
            self.listener(dict(rec))

    def training(self, rec: dict) -> None:
        """A training window's line, also shown on the progress bar or as a plain log line."""
        self.write(rec)
        if self.lines:
            self.log(format_line(rec, self.total))
        if self.bar is not None and "loss/auto" in rec:
            self.bar.set_postfix_str(f"{rec['train/bytes_per_s'] / 1e3:.1f}kB/s loss={rec['loss/auto']:.3f} "
                                     f"bpb={rec['train/bpb']:.3f} rate={rec['boundary/rate']:.3f}")

    def stepped(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def note(self, line: str) -> None:
        """A line for people (kept clear of the progress bar)."""
        (self.bar.write if self.bar is not None else self.log)(line)

    def image(self, step: int, img: np.ndarray | None) -> None:
        if img is None:
            return
        if self.tb is not None:
            self.tb.image(step, img)
        if self.wb is not None:
            self.wb.image(step, img)

    @property
    def wants_images(self) -> bool:
        return self.tb is not None or self.wb is not None

    def close(self) -> None:
        for closer in (self.bar, self.file, self.tb, self.wb):
            if closer is not None:
                closer.close()
