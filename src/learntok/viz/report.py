"""`learntok report RUN_DIR`: one self-contained HTML page per run, shareable as a single file.

Sections: summary, training curves (PNG embedded as base64 data: URIs), boundary maps of a few held-out
validation sequences (drawn from the run's own data config, as validation draws them), the final evaluation
(RUN_DIR/eval.json, rendered generically) if present, the configuration and the environment (run_info).
Whatever is missing (no checkpoint yet, data not on this machine, no metrics) is said on the page instead.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from pathlib import Path

from learntok import atomic
from learntok.draw import EVAL_SEED
from learntok.viz.curves import FIGURES, PLOTTERS, RunMetrics, load_metrics
from learntok.viz.mpl import figure_png
from learntok.viz.render import html_legend, html_map, html_page

MAX_ROWS = 400
"""Rows shown per flattened table (an eval.json with per-example entries could be huge)."""


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return json.dumps(v) if len(json.dumps(v)) < 200 else json.dumps(v)[:200] + "..."
    return "null" if v is None else str(v)


def flatten(d, prefix: str = "") -> list[tuple[str, str]]:
    """Nested dicts as (dotted key, formatted value) rows, in insertion order."""
    rows: list[tuple[str, str]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            rows.extend(flatten(v, key) if isinstance(v, dict) else [(key, _fmt(v))])
    else:
        rows.append((prefix or "value", _fmt(d)))
    return rows


def table(rows: list[tuple[str, str]], head: tuple[str, str] = ("key", "value")) -> str:
    more = len(rows) - MAX_ROWS
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows[:MAX_ROWS])
    note = f'<p class="note">{more} more rows not shown</p>' if more > 0 else ""
    return (f"<table><thead><tr><th>{html.escape(head[0])}</th><th>{html.escape(head[1])}</th></tr></thead>"
            f"<tbody>{body}</tbody></table>{note}")


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _summary(run: RunMetrics | None) -> list[tuple[str, str]]:
    if run is None:
        return []
    rows = []
    last = run.train[-1] if run.train else {}
    for key, name in (("step", "steps"), ("bytes", "training bytes"), ("flops", "training FLOPs"),
                      ("time", "training seconds"), ("train/bytes_per_s", "last throughput (bytes/s)")):
        if key in last:
            rows.append((name, _fmt(float(last[key]))))
    if run.evals:
        bpbs = [float(r["val/bpb"]) for r in run.evals]
        finite = [b for b in bpbs if math.isfinite(b)]
        rows += [("last validation bits per byte", f"{bpbs[-1]:.4f}"), ("best validation bits per byte",
                                                                       f"{min(finite):.4f}" if finite else "n/a")]
        if "val/rate" in run.evals[-1]:
            rows.append(("last validation boundary rate", f"{float(run.evals[-1]['val/rate']):.4f}"))
    return rows


def _curves(run: RunMetrics) -> str:
    out = []
    for name in FIGURES:
        png = base64.b64encode(figure_png(PLOTTERS[name]([run]))).decode("ascii")
        out.append(f'<figure><img alt="{name} curves" src="data:image/png;base64,{png}"></figure>')
    return "\n".join(out)


def _boundary_maps(run_dir: Path, n_samples: int, sample_bytes: int, seed: int) -> str:
    from learntok.checkpoint import load_run
    from learntok.data import DataError
    from learntok.errors import LearntokError
    from learntok.viz.boundary_map import validation_maps

    try:
        cfg, model = load_run(run_dir)
    except (FileNotFoundError, ValueError, OSError, LearntokError) as e:  # LearntokError: no checkpoint yet
        return _note(f"no boundary maps: could not load a checkpoint ({e})")
    try:
        maps = validation_maps(cfg, model, n=n_samples, n_bytes=sample_bytes, seed=seed)
    except (DataError, OSError, ValueError) as e:
        return _note(f"no boundary maps: the run's validation data ({cfg.data.source}) is not available "
                     f"here: {e}")
    return html_legend() + "\n" + "\n".join(html_map(m) for m in maps)


def build_report(run_dir: str | Path, n_samples: int = 3, sample_bytes: int = 600, seed: int = EVAL_SEED) -> str:
    """The report page of a run directory as an HTML string."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a learntok run directory (no config.json)")
    config = json.loads(cfg_path.read_text())
    run_info = config.pop("run_info", {}) or {}
    metrics_note = ""
    try:
        run = load_metrics(run_dir)
    except (FileNotFoundError, ValueError) as e:
        run, metrics_note = None, str(e)
    strategy = config.get("boundary", {}).get("boundaries", "?")
    title = f"learntok run {run_dir.name} ({strategy})"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p class="caption">{html.escape(str(run_dir.resolve()))} \u00b7 report written '
             f"{time.strftime('%Y-%m-%d %H:%M')}</p>",
             '<h2 id="summary">Summary</h2>', table(_summary(run)) if run else _note(metrics_note),
             '<h2 id="curves">Training curves</h2>']
    if run is not None:
        if run.skipped:
            parts.append(_note(f"{run.skipped} malformed metrics line(s) skipped"))
        parts.append(_curves(run))
    else:
        parts.append(_note(metrics_note))
    parts += ['<h2 id="boundaries">Boundary maps of held-out samples</h2>',
              _boundary_maps(run_dir, n_samples, sample_bytes, seed)]
    parts.append('<h2 id="eval">Final evaluation</h2>')
    eval_path = run_dir / "eval.json"
    if eval_path.is_file():
        try:
            parts.append(table(flatten(json.loads(eval_path.read_text())), ("metric", "value")))
        except json.JSONDecodeError as e:
            parts.append(_note(f"eval.json is not valid JSON: {e}"))
    else:
        parts.append(_note("no eval.json in the run directory (run `learntok eval RUN_DIR` to add one)"))
    parts += ['<h2 id="config">Configuration</h2>', table(flatten(config), ("field", "value")),
              '<h2 id="environment">Environment</h2>',
              table(flatten(run_info)) if run_info else _note("config.json has no run_info")]
    return html_page(title, "\n".join(parts))


def write_report(run_dir: str | Path, out: str | Path | None = None, **kw) -> Path:
    """Write the report (default RUN_DIR/report.html); returns its path."""
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    text = build_report(run_dir, **kw)
    return atomic.write_text(path, text)
