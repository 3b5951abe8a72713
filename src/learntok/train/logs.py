"""What a run reports: per-step figures averaged over a log window, written to every sink.

Sinks: RUN/metrics.jsonl (always, on rank 0), TensorBoard (`--tensorboard`), and a progress bar or log lines
for people. metrics.jsonl holds training lines (`step`, `bytes`, `flops`, `time`, `loss/*`, `boundary/*`,
`reinforce/*`, `train/*`) and evaluation lines (`step`, `bytes`, `flops`, `time`, `val/*`).
"""

from __future__ import annotations

import json
import math
import numbers
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from learntok.bpb import LN2
from learntok.train.parallel import Dist, reduce_means

MAX_KEYS = ("boundary/max_tokens",)
"""Logged as the maximum over the window and the ranks, not the mean."""


class StepMetrics:
    """Sums of one log window's per-step figures (each step's own figures averaged over its micro-batches)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.steps = 0

    def add_micro(self, out, accum: int) -> None:
        """Add one micro-batch's `ModelOutput`, weighted 1/accum."""
        for k, v in out.terms.items():
            self.sums[k] += float(v.detach()) / accum
        for k, v in out.boundaries.stats.items():
            self.sums[k] += float(v) / accum
        self.sums["boundary/rate"] += float(out.boundaries.mask.float().mean()) / accum
        self.sums["boundary/max_tokens"] = max(self.sums["boundary/max_tokens"], float(out.n_tokens.max()))

    def end_step(self, grad_norm: float) -> None:
        self.sums["train/grad_norm"] += grad_norm
        self.steps += 1

    def window(self, d: Dist) -> dict[str, float]:
        """The window's means (maxima for MAX_KEYS), over all ranks; then start a new window."""
        rec = {k: v if k in MAX_KEYS else v / max(self.steps, 1) for k, v in self.sums.items()}
        rec = reduce_means(rec, d, MAX_KEYS)
        rec["train/bpb"] = rec["loss/auto"] / LN2
        self.sums.clear()
        self.steps = 0
        return rec


class TensorBoardLogger:
    """TensorBoard event files under RUN_DIR/tensorboard: every numeric figure, and boundary-map images.
    Needs the `tensorboard` package (pip install 'learntok[tensorboard]'), imported when a logger is made."""

    def __init__(self, run_dir: str | Path, subdir: str = "tensorboard") -> None:
        try:
            import tensorboard  # noqa: F401  (torch's module imports it lazily and fails later otherwise)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError(f"--tensorboard needs the tensorboard package: pip install 'learntok[tensorboard]' "
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


class Sinks:
    """metrics.jsonl, TensorBoard and the progress display of one run; only rank 0 writes anything."""

    def __init__(self, out: Path, d: Dist, *, progress: bool, tensorboard: bool, total: int | None, initial: int,
                 log: Callable[[str], None]):
        self.log = log
        self.file = open(out / "metrics.jsonl", "a") if d.is_main else None  # noqa: SIM115 (closed in close())
        self.tb = TensorBoardLogger(out) if tensorboard and d.is_main else None
        self.bar = None
        if progress and d.is_main:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)

    def write(self, rec: dict) -> None:
        """One line of metrics.jsonl (and the same scalars in TensorBoard)."""
        if self.file is not None:
            self.file.write(json.dumps(rec) + "\n")
            self.file.flush()
        if self.tb is not None:
            self.tb.scalars(rec["step"], rec)

    def training(self, rec: dict) -> None:
        """A training window's line, also summarised on the progress bar."""
        self.write(rec)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rec['train/bytes_per_s'] / 1e3:.1f}kB/s loss={rec['loss/auto']:.3f} "
                                     f"bpb={rec['train/bpb']:.3f} rate={rec['boundary/rate']:.3f}")

    def stepped(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def note(self, line: str) -> None:
        """A line for people (kept clear of the progress bar)."""
        (self.bar.write if self.bar is not None else self.log)(line)

    def image(self, step: int, img: np.ndarray | None) -> None:
        if self.tb is not None and img is not None:
            self.tb.image(step, img)

    @property
    def wants_images(self) -> bool:
        return self.tb is not None

    def close(self) -> None:
        for closer in (self.bar, self.file, self.tb):
            if closer is not None:
                closer.close()
