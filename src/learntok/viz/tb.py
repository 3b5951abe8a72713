"""Optional TensorBoard logging beside the always-on metrics.jsonl: scalars and boundary-map images.

    tb = TensorBoardLogger(run_dir)                   # event files in RUN_DIR/tensorboard
    tb.scalars(step, rec)                             # every numeric entry of a metrics line
    tb.boundary_image(step, data, probs, mask)        # at each evaluation; probs / mask aligned with data
    tb.close()

`torch.utils.tensorboard` (which needs the `tensorboard` package) is imported when a logger is created, so
importing this module costs nothing and a missing package is reported with the extra to install.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

INSTALL_HINT = "TensorBoard logging needs the tensorboard package: pip install 'learntok[tensorboard]'"


def summary_writer_class():
    """torch.utils.tensorboard.SummaryWriter, or ImportError naming the extra to install."""
    try:
        import tensorboard  # noqa: F401  (torch's module imports it lazily and fails later otherwise)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return SummaryWriter


class TensorBoardLogger:
    """Writes TensorBoard event files under RUN_DIR/tensorboard (or `subdir`)."""

    def __init__(self, run_dir: str | Path, subdir: str = "tensorboard") -> None:
        writer_cls = summary_writer_class()
        self.log_dir = Path(run_dir) / subdir
        self.writer = writer_cls(log_dir=str(self.log_dir))

    def scalars(self, step: int, values: dict) -> int:
        """Log every finite real number of `values` under its key (`loss/auto`, `val/bpb`, ...); the
        x-axis bookkeeping keys (step) are skipped. Returns how many scalars were written."""
        n = 0
        for key, v in values.items():
            if key == "step" or isinstance(v, bool) or not isinstance(v, numbers.Real):
                continue
            v = float(v)
            if math.isfinite(v):
                self.writer.add_scalar(key, v, global_step=step)
                n += 1
        return n

    def boundary_image(self, step: int, text_bytes: bytes, probs, mask, tag: str = "boundaries/map",
                       width: int = 80, max_chars: int = 800) -> None:
        """The boundary map of a snippet as an image (HWC uint8, rendered by matplotlib). probs / mask are per
        byte, aligned with text_bytes (tensors or arrays)."""
        from learntok.viz.cells import from_arrays
        from learntok.viz.mpl import map_image

        img = map_image(from_arrays(text_bytes, probs, mask, label=f"step {step}"), width=width,
                        max_chars=max_chars)  # (H,W,3)
        self.writer.add_image(tag, img, global_step=step, dataformats="HWC")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
