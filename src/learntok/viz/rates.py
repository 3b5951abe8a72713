"""Bits per byte against realised boundary rate (the authors' rate-sweep plot): one line per model swept over
asked rates (`learntok eval --rate-sweep`), one marker per model evaluated at one rate (a dedicated model).

`learntok plot --rate-sweep RUN...` reads each run's eval*.json; experiments/rates draws the study's figure from
its records with the same function.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from learntok.viz.mpl import pyplot, save


@dataclass
class Series:
    """One model's points: (realised rate, BPB, BPB standard error), sorted by rate."""

    label: str
    points: list[tuple[float, float, float]] = field(default_factory=list)
    swept: bool = False
    """True for a sweep over asked rates (drawn as a line), False for single evaluations (markers)."""


def read_series(run: str | Path) -> Series:
    """A run's evaluations: the rate sweep of its eval*.json files if any, else each file's held-out BPB at its
    realised rate."""
    run = Path(run)
    files = sorted(run.glob("eval*.json")) if run.is_dir() else [run]
    if not files:
        raise FileNotFoundError(f"{run}: no eval*.json (run `learntok eval` first)")
    sweep, single = [], []
    for f in files:
        rep = json.loads(f.read_text())
        if rep.get("rate_sweep"):
            sweep += [(p["realised"], p["bpb"], p["bpb_se"]) for p in rep["rate_sweep"]["points"]]
        if rep.get("heldout") and rep.get("boundary_stats"):
            single.append((rep["boundary_stats"]["rate"], rep["heldout"]["bpb"], rep["heldout"]["bpb_se"]))
    label = run.name if run.is_dir() else run.parent.name
    return Series(label, sorted(sweep), swept=True) if sweep else Series(label, sorted(single))


def plot_rate_sweeps(series: list[Series], title: str = "bits per byte against realised boundary rate"):
    """The figure: x realised rate (log), y BPB; sweeps as lines with their standard-error band, single
    evaluations as markers with error bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colours = plt.get_cmap("tab10")
    for i, s in enumerate(series):
        if not s.points:
            continue
        x, y, e = (list(v) for v in zip(*s.points))
        c = colours(i % 10)
        if s.swept:
            ax.plot(x, y, "-", color=c, lw=1.4, label=s.label)
            ax.fill_between(x, [a - b for a, b in zip(y, e)], [a + b for a, b in zip(y, e)], color=c, alpha=0.15, lw=0)
        else:
            ax.errorbar(x, y, yerr=e, fmt="o", color=c, ms=6, capsize=3, label=s.label)
    ax.set_xscale("log")
    ax.set_xlabel("realised boundary rate (tokens per byte, log scale)")
    ax.set_ylabel("bits per byte (held-out, ± s.e. over sequences)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save_rate_plot(series: list[Series], path: str | Path, title: str | None = None) -> Path:
    return save(plot_rate_sweeps(series, **({"title": title} if title else {})), path)
