"""Seeing what a model learned: `learntok show`, `learntok plot`, `learntok report`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from learntok.cli import UsageError, parse
from learntok.cli.use import ask_rate, read_input
from learntok.draw import EVAL_SEED

SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces;\n"
               "def tokenize(text: str) -> list[str]:\n    return text.split()\n"
               "Grüße aus München! 東京は日本の首都です。 🙂\n")
"""What `learntok show` maps when given no --text or --file: prose, code and multi-byte characters."""

SHOW_DESCRIPTION = """The boundary map of a text: each character coloured by the model's boundary probability p (of
its last byte), drawn boundaries marked. Texts longer than the model's input (seq_len - 1 bytes) are read in
windows that each re-read the last quarter of the one before as context (a window start is no forced boundary).

examples:
  learntok show runs/tiny                                   # a built-in sample, coloured in the terminal
  learntok show runs/tiny --text "Hello, world!" --greedy
  learntok show runs/tiny/step_000200 --file notes.txt --html map.html --png map.png
  cat notes.txt | learntok show runs/tiny --file -"""


@dataclass(frozen=True, kw_only=True)
class ShowArgs:
    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="[MODEL]")] = "enwiki-small"
    """Run directory (its newest intact checkpoint), checkpoint directory run/step_N, exported model directory,
    Hugging Face Hub id user/name, or a bundled model (enwiki-small ships with learntok)."""
    text: str | None = None
    """The text to map (default: a built-in sample of prose, code and multi-byte characters)."""
    file: str | None = None
    """A file to map (its bytes as they are); - reads standard input."""
    html: str | None = None
    """Also write a self-contained HTML page here."""
    png: str | None = None
    """Also write a PNG image here (needs matplotlib)."""
    seed: int = EVAL_SEED
    """Seed of the boundary draws (default: validation's seed)."""
    greedy: bool = False
    """Draw boundaries greedily (a = [p > 0.5]) instead."""
    max_bytes: int = 16384
    """Map at most this many bytes of the text (0 = all)."""
    width: int = 100
    """Characters per PNG line."""
    color: Literal["auto", "always", "never"] = "auto"
    """Terminal colours (auto: when stdout is a terminal; never: '|' before each boundary)."""
    quiet: bool = False
    """Do not print the map to the terminal."""
    rate: float | None = None
    """Ask a learned policy for this boundary rate (calibrated if `learntok calibrate` ran)."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto."""
    level: int = 1
    """Boundary level: 2 maps a two-level model's (trained with --inner-layers) super-token boundaries."""

    def __post_init__(self) -> None:
        for name in ("seed", "max_bytes", "width"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(self, name)}")


def cmd_show(argv: list[str]) -> int:
    a = parse(ShowArgs, argv, "learntok show", SHOW_DESCRIPTION)
    data = read_input(a.text, a.file, default=SAMPLE_TEXT.encode("utf-8"))
    if not data:
        raise UsageError("nothing to show: the text is empty")
    if a.png and Path(a.png).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise UsageError(f"--png {a.png}: the image type follows the suffix: .png, .pdf or .svg")
    from learntok.device import resolve_device
    from learntok.pretrained import load
    from learntok.viz.boundary_map import compute_map
    from learntok.viz.render import ansi_legend, render_ansi, render_html

    if a.max_bytes and len(data) > a.max_bytes:
        print(f"note: mapping the first {a.max_bytes} of {len(data)} bytes (--max-bytes)", file=sys.stderr)
        data = data[:a.max_bytes]
    loaded = load(a.checkpoint, device=resolve_device(a.device))
    if a.rate is not None:
        ask_rate(loaded.model, a.rate)
    bmap = compute_map(loaded.model, data, window=max(1, loaded.seq_len - 1), seed=a.seed, greedy=a.greedy,
                       level=a.level)
    if not a.quiet:
        color = None if a.color == "auto" else a.color == "always"
        print(render_ansi(bmap, color=color).rstrip("\n"))
        print(ansi_legend(color))
        print(f"{bmap.label}; {len(bmap.ids)} bytes, {int(bmap.mask.sum())} boundaries (rate {bmap.rate:.3f})")
    if a.html:
        Path(a.html).parent.mkdir(parents=True, exist_ok=True)
        Path(a.html).write_text(render_html(bmap, f"learntok boundary map: {Path(a.checkpoint).name}"),
                                encoding="utf-8")
        print(f"wrote {a.html}")
    if a.png:
        from learntok.viz.mpl import save_map_png

        Path(a.png).parent.mkdir(parents=True, exist_ok=True)
        for notice in save_map_png(bmap, a.png, width=max(20, a.width)):
            print(f"note: {notice}", file=sys.stderr)
        print(f"wrote {a.png}")
    return 0


@dataclass(frozen=True, kw_only=True)
class PlotArgs:
    """Training curves of one or more runs from their metrics.jsonl: validation bits per byte against FLOPs and
    bytes, boundary rate and -log pi, loss terms, throughput.

    With --rate-sweep, instead: bits per byte against realised boundary rate from each run's eval*.json, a line
    for a run evaluated with `learntok eval --rate-sweep`, a point for one evaluated at one rate.

    examples:
      learntok plot runs/learned runs/uniform --out figs
      learntok plot runs/tiny --format svg              # writes runs/tiny/plots/*.svg
      learntok plot --rate-sweep runs/variable runs/fixed-0.1 runs/fixed-0.2 --out figs   # figs/rate_sweep.png"""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN [RUN ...]")]
    """Run directories (each with metrics.jsonl; with --rate-sweep, with eval*.json)."""
    out: str | None = None
    """Output directory (default: RUN_DIR/plots for one run, ./plots for several)."""
    format: Literal["png", "svg"] = "png"
    """Image format."""
    rate_sweep: bool = False
    """Plot BPB against realised rate from the runs' evaluations instead of training curves."""


def cmd_plot(argv: list[str]) -> int:
    a = parse(PlotArgs, argv, "learntok plot", PlotArgs.__doc__ or "")
    if not a.runs:
        raise UsageError("learntok plot: give at least one run directory")
    out = a.out or (Path(a.runs[0]) / "plots" if len(a.runs) == 1 else Path("plots"))
    if a.rate_sweep:
        from learntok.viz.rates import read_series, save_rate_plot

        print(f"wrote {save_rate_plot([read_series(r) for r in a.runs], Path(out) / f'rate_sweep.{a.format}')}")
        return 0
    from learntok.viz.curves import load_metrics, save_figures

    runs = [load_metrics(r) for r in a.runs]
    for run in runs:
        if run.skipped:
            print(f"note: {run.path}/metrics.jsonl: skipped {run.skipped} malformed line(s)", file=sys.stderr)
    for path in save_figures(runs, out, a.format):
        print(f"wrote {path}")
    return 0


@dataclass(frozen=True, kw_only=True)
class ReportArgs:
    """One self-contained HTML page for a run: summary, curves, boundary maps of held-out samples, final
    evaluation (eval.json), configuration and environment.

    examples:
      learntok report runs/tiny                  # writes runs/tiny/report.html
      learntok report runs/tiny --out tiny.html --samples 5"""

    run: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]
    """Run directory."""
    out: str | None = None
    """Output file (default: RUN_DIR/report.html)."""
    samples: int = 3
    """Held-out sequences to map."""
    sample_bytes: int = 600
    """Bytes shown per sample."""
    seed: int = EVAL_SEED
    """Seed of the boundary draws."""

    def __post_init__(self) -> None:
        for name in ("samples", "sample_bytes", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(self, name)}")


def cmd_report(argv: list[str]) -> int:
    a = parse(ReportArgs, argv, "learntok report", ReportArgs.__doc__ or "")
    from learntok.viz.report import write_report

    if not Path(a.run).is_dir():
        raise FileNotFoundError(f"{a.run}: no such run directory")
    path = write_report(a.run, a.out, n_samples=a.samples, sample_bytes=max(1, a.sample_bytes), seed=a.seed)
    print(f"wrote {path}")
    return 0
