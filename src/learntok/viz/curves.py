"""Training curves from `metrics.jsonl`, several runs per chart.

Figures (each run one colour throughout, legends name the run directory, strategy and model shape):
    bpb         validation bits per byte against training FLOPs (log x; the paper's Figure 3 layout) and
                against bytes seen
    boundaries  boundary rate (training draws, and validation) against bytes, with the target rate; mean
                -log pi(a_t | a_<t) over training (the paper's Figure 13): high while the policy explores,
                falling as boundaries settle
    losses      every `loss/*` term against step (L_auto, L_early, L_pi, L_target of eq. 27)
    throughput  training bytes per second against step

metrics.jsonl has one JSON object per line: training lines (step, bytes, flops, loss/..., train/bpb, ...) and
evaluation lines (step, bytes, flops, val/bpb, val/rate, val/early_bpb). A torn last line of a run that is
still writing is skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from learntok.viz.mpl import pyplot, save

FIGURES = ("bpb", "boundaries", "losses", "throughput")
RENAMED = {"stats/p_mean": "boundary/p_mean", "stats/neg_log_pi": "boundary/neg_log_pi",
           "stats/adv_std": "reinforce/adv_std", "stats/reward_mean": "reinforce/reward_mean",
           "stats/ratio_loss": "boundary/ratio_loss", "lr": "train/lr", "bytes_per_s": "train/bytes_per_s",
           "flops_per_byte": "train/flops_per_byte"}
"""Metric names of learntok 0.1 runs and their current names (old runs still plot)."""


@dataclass
class RunMetrics:
    """The logged metrics and config of one run directory."""

    path: Path
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    skipped: int = 0
    """Lines that were not valid JSON objects (e.g. a line still being written)."""

    @property
    def strategy(self) -> str:
        return str(self.config.get("boundary", {}).get("boundaries", "?"))

    @property
    def label(self) -> str:
        """`dir: strategy, d_model, layers down-mid-up, target rate` for legends."""
        m, b = self.config.get("model", {}), self.config.get("boundary", {})
        parts = [self.strategy]
        if m:
            parts.append(f"d{m.get('d_model', '?')} L{m.get('n_down', '?')}-{m.get('n_mid', '?')}-{m.get('n_up', '?')}")
        if "target_rate" in b and self.strategy != "whitespace":
            parts.append(f"\u03c0\u0304={b['target_rate']:g}")
        return f"{self.path.name}: {', '.join(parts)}"

    def series(self, key: str, x: str = "bytes", evals: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of the lines that have both keys, in logged order."""
        rows = [r for r in (self.evals if evals else self.train) if key in r and x in r]
        return (np.array([float(r[x]) for r in rows], dtype=np.float64),
                np.array([float(r[key]) for r in rows], dtype=np.float64))


def load_metrics(run_dir: str | Path) -> RunMetrics:
    """Read RUN_DIR/metrics.jsonl (and config.json if present). Raises FileNotFoundError / ValueError."""
    path = Path(run_dir)
    f = path / "metrics.jsonl"
    if not f.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (not a learntok run directory, or it has not logged yet)")
    run = RunMetrics(path=path)
    for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            run.skipped += 1
            continue
        if not isinstance(rec, dict):
            run.skipped += 1
            continue
        rec = {RENAMED.get(k, k): v for k, v in rec.items()}
        if "val/bpb" in rec:
            run.evals.append(rec)
        else:
            run.train.append(rec)
    if not run.train and not run.evals:
        raise ValueError(f"{f}: no metrics logged yet")
    cfg = path / "config.json"
    if cfg.is_file():
        try:
            run.config = json.loads(cfg.read_text())
        except json.JSONDecodeError:
            run.config = {}
    return run


def _smooth(y: np.ndarray, n: int) -> np.ndarray:
    """Exponential moving average with span ~ n points, debiased at the start (as TensorBoard does)."""
    a = 2.0 / (n + 1)
    out, acc, w = np.empty_like(y), 0.0, 0.0
    for i, v in enumerate(y):
        acc, w = (1 - a) * acc + a * v, (1 - a) * w + a
        out[i] = acc / w
    return out


def _line(ax, x: np.ndarray, y: np.ndarray, colour, label: str | None, noisy: bool = True, ls: str = "-") -> None:
    """Noisy training series: faint raw points plus a smoothed line once there are enough of them."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        return
    if noisy and len(x) > 20:
        ax.plot(x, y, color=colour, alpha=0.25, lw=0.8)
        ax.plot(x, _smooth(y, max(5, len(x) // 10)), color=colour, lw=1.6, ls=ls, label=label)
    else:
        ax.plot(x, y, color=colour, lw=1.6, ls=ls, marker="o" if len(x) < 30 else None, ms=3, label=label)


def _colours(n: int) -> list:
    plt = pyplot()
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", transform=ax.transAxes, ha="center", va="center", color="grey")


def _finish(fig, axes, title: str):
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(2, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 1) // 2), 1, 1))
    return fig


def plot_bpb(runs: list[RunMetrics]):
    """Validation BPB against training FLOPs (log x) and bytes; training BPB (dotted) where no evaluation ran."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for run, c in zip(runs, _colours(len(runs))):
        for ax, x in zip(axes, ("flops", "bytes")):
            xs, ys = run.series("val/bpb", x, evals=True)
            if np.isfinite(ys).any():  # evaluations that all diverged (nan) fall back like none
                _line(ax, xs, ys, c, run.label, noisy=False)
            else:
                xs, ys = run.series("train/bpb", x)
                _line(ax, xs, ys, c, run.label + " (train BPB, no evaluation)", ls=":")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("training FLOPs (6 x matrix params per byte / token)")
    axes[1].set_xlabel("training bytes")
    for ax in axes:
        ax.set_ylabel("validation bits per byte")
        ax.grid(alpha=0.3, which="both")
    return _finish(fig, axes, "Validation bits per byte")


def plot_boundaries(runs: list[RunMetrics]):
    """Boundary rate over training with the target rate; mean -log pi over training (Figure 13)."""
    plt = pyplot()
    fig, (ax_rate, ax_pi) = plt.subplots(1, 2, figsize=(11, 4.4))
    any_pi = False
    for run, c in zip(runs, _colours(len(runs))):
        _line(ax_rate, *run.series("boundary/rate"), c, run.label)
        xs, ys = run.series("val/rate", evals=True)
        if len(xs):
            ax_rate.plot(xs, ys, color=c, ls="--", lw=1.2, marker="s", ms=3,
                         label="validation rate (dashed)" if run is runs[0] else None)
        target = run.config.get("boundary", {}).get("target_rate")
        if target is not None:
            ax_rate.axhline(float(target), color=c, ls=":", lw=1)
        xs, ys = run.series("boundary/neg_log_pi")
        any_pi |= len(xs) > 0
        _line(ax_pi, xs, ys, c, run.label)
    ax_rate.set_ylabel("boundaries per byte (dotted: --target-rate)")
    ax_pi.set_ylabel("mean -log \u03c0(a_t | a_<t)  [nats]")
    if not any_pi:
        _no_data(ax_pi, "policy -log \u03c0 (only the learned strategy has one)")
    for ax in (ax_rate, ax_pi):
        ax.set_xlabel("training bytes")
        ax.grid(alpha=0.3)
    return _finish(fig, (ax_rate, ax_pi), "Boundaries over training")


def plot_losses(runs: list[RunMetrics]):
    """One panel per `loss/*` key any run logged, against step."""
    plt = pyplot()
    keys = sorted({k for run in runs for r in run.train for k in r if k.startswith("loss/")})
    keys = keys or ["loss/auto"]
    ncol = min(2, len(keys))
    nrow = (len(keys) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.5 * ncol, 3.0 * nrow + 0.8), squeeze=False)
    flat = axes.ravel().tolist()
    for ax, key in zip(flat, keys):
        found = False
        for run, c in zip(runs, _colours(len(runs))):
            xs, ys = run.series(key, "step")
            found |= len(xs) > 0
            _line(ax, xs, ys, c, run.label)
        if not found:
            _no_data(ax, key)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in flat[len(keys):]:
        ax.axis("off")
    title = "Loss terms (nats per byte; strategy terms include their \u03bb weight, eq. 27)"
    return _finish(fig, flat[:len(keys)], title)


def plot_throughput(runs: list[RunMetrics]):
    """Training bytes per second against step."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    found = False
    for run, c in zip(runs, _colours(len(runs))):
        xs, ys = run.series("train/bytes_per_s", "step")
        found |= len(xs) > 0
        _line(ax, xs, ys, c, run.label)
    if not found:
        _no_data(ax, "throughput")
    ax.set_xlabel("step")
    ax.set_ylabel("training bytes / s")
    ax.grid(alpha=0.3)
    return _finish(fig, [ax], "Throughput")


PLOTTERS = {"bpb": plot_bpb, "boundaries": plot_boundaries, "losses": plot_losses, "throughput": plot_throughput}


def save_figures(runs: list[RunMetrics], out_dir: str | Path, fmt: str = "png") -> list[Path]:
    """Write every figure as OUT_DIR/NAME.FMT (png or svg); returns the paths."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"--format must be png or svg, got {fmt!r}")
    if not runs:
        raise ValueError("no runs to plot")
    return [save(PLOTTERS[name](runs), Path(out_dir) / f"{name}.{fmt}", dpi=120, format=fmt) for name in FIGURES]
