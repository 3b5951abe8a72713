"""`learntok compare`: runs side by side in the layout of the paper's Table 1 (downstream bits per byte of the
gold continuation, accuracy, held-out BPB, each +- standard error) and Table 3 (downsampling rates), from each
run's eval.json and config.json.

Best per column is bold in Markdown (lowest BPB, highest accuracy; ties at the printed precision are all bold)
and listed per run in the CSV's `best_in` column. Table 3 marks nothing: a rate or a FLOPs count has no better
direction on its own (the paper uses it to show that comparisons are fair).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from learntok.evaluation.byteclass import class_difference
from learntok.evaluation.report import read_eval
from learntok.evaluation.stats import interval_text
from learntok.evaluation.tasks import TASKS

DIGITS = 3


def load_run_eval(path: str | Path) -> dict:
    """{"run", "boundaries", "report"} of a run directory (or an eval.json path); the strategy name comes from
    the run's config.json when present."""
    path = Path(path)
    eval_path = path if path.suffix == ".json" else path / "eval.json"
    run_dir = eval_path.parent
    report = read_eval(eval_path)
    label = report.get("boundaries") or "?"
    cfg_path = run_dir / "config.json"
    if cfg_path.is_file():
        b = json.loads(cfg_path.read_text()).get("boundary", {})
        label = b.get("boundaries", label)
        if label == "learned":
            label += f" (w={b.get('policy_window')})"
    return {"run": run_dir.name or str(run_dir), "boundaries": label, "report": report}


def _columns() -> list[tuple[str, str, str, str]]:
    """(key, title, direction, where) of Table 1's numeric columns."""
    cols = [(f"{t}_bpb", f"{s.title} BPB", "min", t) for t, s in TASKS.items()]
    cols.append(("heldout_bpb", "Held-out BPB", "min", "heldout"))
    cols += [(f"{t}_acc", f"{s.title} acc", "max", t) for t, s in TASKS.items()]
    return cols


def _value(report: dict, key: str, where: str) -> tuple[float | None, float | None]:
    """(mean, se) of one Table 1 cell, or (None, None)."""
    src = report.get("heldout") if where == "heldout" else report.get("tasks", {}).get(where)
    if not src:
        return None, None
    metric = key.rsplit("_", 1)[1]
    mean = src.get(metric)
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return None, None
    return float(mean), src.get(metric + "_se")


def _best(values: list[float | None], direction: str) -> set[int]:
    """Rows holding the best value at the printed precision."""
    shown = [round(v, DIGITS) if v is not None else None for v in values]
    real = [v for v in shown if v is not None]
    if not real:
        return set()
    best = min(real) if direction == "min" else max(real)
    return {i for i, v in enumerate(shown) if v == best}


def table1(runs: list[dict]) -> tuple[str, list[dict]]:
    """(Markdown, CSV rows) of Table 1."""
    cols = _columns()
    cells = [[_value(r["report"], key, where) for key, _, _, where in cols] for r in runs]
    best = [_best([cells[i][j][0] for i in range(len(runs))], cols[j][2]) for j in range(len(cols))]
    head = "| Run | Boundaries | " + " | ".join(title for _, title, _, _ in cols) + " |"
    md = [head, "|" + "---|" * (len(cols) + 2)]
    rows = []
    for i, r in enumerate(runs):
        shown = []
        row = {"run": r["run"], "boundaries": r["boundaries"]}
        for j, (key, _, _, _) in enumerate(cols):
            mean, se = cells[i][j]
            row[key], row[key + "_se"] = mean, se
            if mean is None:
                shown.append("–")
                continue
            text = f"{mean:.{DIGITS}f}" + (f" ± {se:.{DIGITS}f}" if se is not None else "")
            shown.append(f"**{text}**" if i in best[j] else text)
        row["best_in"] = ";".join(key for j, (key, _, _, _) in enumerate(cols) if i in best[j])
        md.append(f"| {r['run']} | {r['boundaries']} | " + " | ".join(shown) + " |")
        rows.append(row)
    return "\n".join(md), rows


def table3(runs: list[dict]) -> tuple[str, list[dict]]:
    """(Markdown, CSV rows) of Table 3: rates and boundary statistics on held-out text."""
    md = ["| Run | Boundaries | Rate | Bytes/token | −log π | F1 vs whitespace | F1 vs BPE | Sensitivity | Placement "
          "| Inference FLOPs/byte |", "|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for r in runs:
        s = r["report"].get("boundary_stats") or {}
        agree = s.get("agreement", {})
        row = {"run": r["run"], "boundaries": r["boundaries"], "rate": s.get("rate"),
               "bytes_per_token": s.get("bytes_per_token"), "neg_log_pi": s.get("neg_log_pi"),
               "f1_whitespace": agree.get("whitespace", {}).get("f1"), "f1_bpe": agree.get("bpe", {}).get("f1"),
               "sensitivity": (r["report"].get("diagnostics") or {}).get("sensitivity"),
               "placement": (r["report"].get("diagnostics") or {}).get("placement"),
               "inference_flops_per_byte": (r["report"].get("flops") or {}).get("per_byte")}
        fmt = ["{:.3f}", "{:.2f}", "{:.3f}", "{:.3f}", "{:.3f}", "{:+.3f}", "{:+.3f}", "{:.3g}"]
        vals = [row[k] for k in list(row)[2:]]
        shown = [f.format(v) if v is not None else "–" for f, v in zip(fmt, vals)]
        md.append(f"| {r['run']} | {r['boundaries']} | " + " | ".join(shown) + " |")
        rows.append(row)
    return "\n".join(md), rows


def _notes(runs: list[dict]) -> list[str]:
    """Warnings when the runs were not evaluated the same way."""
    notes = []
    modes = {r["report"]["mode"]["description"].split(":", 1)[1].strip() for r in runs
             if r["report"]["mode"].get("description") and "prescribed" not in r["report"]["mode"]["description"]}
    if len(modes) > 1:
        notes.append("runs used different boundary modes: " + "; ".join(sorted(modes)))
    limited = [r["run"] for r in runs if r["report"].get("limit")]
    if limited:
        notes.append(f"evaluated with --limit (partial): {', '.join(limited)}")
    data = {(r["report"].get("heldout") or {}).get("data") for r in runs} - {None}
    if len(data) > 1:
        notes.append("held-out BPB is on different texts: " + "; ".join(sorted(data)))
    span = {r["run"]: (h.get("bytes"), h.get("first_sequence")) for r in runs if (h := r["report"].get("heldout"))}
    if len(data) == 1 and len(set(span.values())) > 1:  # one text, other bytes of it (--max-bytes, --skip-bytes)
        notes.append("held-out BPB is on different bytes of the text: " + "; ".join(
            f"{run}: {n:,} bytes from sequence {first}" for run, (n, first) in span.items() if n is not None))
    rates = {(r["report"].get("asked_rate"), bool(r["report"].get("calibrated"))) for r in runs}
    if len(rates) > 1:
        notes.append("runs were asked for different boundary rates (--rate; calibrated or not): " + "; ".join(
            f"{r['run']}: {r['report'].get('asked_rate') or 'its own'}" for r in runs))
    for name in sorted({t for r in runs for t in r["report"].get("tasks") or {}}):
        ns = {r["run"]: r["report"]["tasks"][name].get("n") for r in runs if name in (r["report"].get("tasks") or {})}
        if len(set(ns.values())) > 1:
            notes.append(f"{name} was scored on different numbers of examples: "
                         + ", ".join(f"{run} {n}" for run, n in ns.items()))
    return notes


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def compare(paths: list[str | Path], out_dir: str | Path) -> tuple[str, list[Path]]:
    """Write comparison.md, table1.csv and table3.csv into out_dir; return (Markdown, written paths)."""
    if not paths:
        raise ValueError("compare: give at least one run directory")
    runs = [load_run_eval(p) for p in paths]
    md1, rows1 = table1(runs)
    md3, rows3 = table3(runs)
    parts = ["## Table 1: bits per byte of the gold continuation and held-out text (± standard error); accuracy",
             "", md1, "", "## Table 3: boundaries on held-out text", "", md3]
    notes = _notes(runs)
    if notes:
        parts += ["", *[f"Note: {n}." for n in notes]]
    md = "\n".join(parts) + "\n"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(md)
    _write_csv(out / "table1.csv", rows1)
    _write_csv(out / "table3.csv", rows3)
    return md, [out / "comparison.md", out / "table1.csv", out / "table3.csv"]


MIN_DOCUMENTS = 20
"""Fewer documents than this in the scored text (a corpus of a few long files): the bootstrap resamples
sequences (blocks of seq_len bytes) instead."""


def paired_bpb(path_a: str | Path, path_b: str | Path, *, resamples: int = 10_000, seed: int = 0) -> dict:
    """Held-out BPB of run A − run B with a paired bootstrap interval over documents (over sequences when the
    text has fewer than MIN_DOCUMENTS; `learntok.evaluation.stats.paired_bootstrap`), from two eval.json files
    written with --per-document on the same text. Raises ValueError if either lacks per-document scores or they
    scored different bytes."""
    from learntok.evaluation.stats import paired_bootstrap

    runs = [load_run_eval(p) for p in (path_a, path_b)]
    held = []
    for p, r in zip((path_a, path_b), runs, strict=True):
        h = r["report"].get("heldout") or {}
        if "per_document" not in h:
            raise ValueError(f"{p}: its eval.json has no per-document scores; run `learntok eval RUN "
                             f"--per-document` (with the same --split / --data / --skip-bytes / --max-bytes for both)")
        bits = h["per_document"].get("bits") or []
        if h.get("bpb") is None or not math.isfinite(h["bpb"]) or not all(x is not None and math.isfinite(x)
                                                                            for x in bits):
            raise ValueError(f"{p}: its held-out BPB is not finite ({h.get('bpb')}): the model diverged, so there "
                             "is nothing to compare")
        held.append(h)
    a, b = held
    same = ("data", "split", "first_sequence", "seq_len", "bytes")
    if any(a.get(k) != b.get(k) for k in same) or a["per_document"]["documents"] != b["per_document"]["documents"] \
            or a["per_document"]["bytes"] != b["per_document"]["bytes"]:
        diff = ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in same if a.get(k) != b.get(k))
        raise ValueError(f"{path_a} and {path_b} scored different held-out bytes ({diff or 'other documents'}): "
                         "a paired comparison needs the same text, sequence length and range")
    unit = "documents" if len(a["per_document"]["documents"]) >= MIN_DOCUMENTS else "sequences"
    key = "per_document" if unit == "documents" else "per_sequence"
    res = paired_bootstrap(a[key]["bits"], b[key]["bits"], a[key]["bytes"], resamples=resamples, seed=seed)
    classes = class_difference(a["by_class"], b["by_class"]) if "by_class" in a and "by_class" in b else None
    return {"a": str(path_a), "b": str(path_b), "bpb_a": a["bpb"], "bpb_b": b["bpb"], "data": a.get("data"),
            "split": a.get("split"), "bytes": a["bytes"], "unit": unit, **res,
            **({"by_class": classes} if classes else {})}


def format_paired(p: dict) -> str:
    """One line: the difference, its interval and the reading; then, when both runs were evaluated --by-class,
    a line per byte class: its share of the bytes, A − B in its bits per byte, and its part of the difference."""
    word = "tie" if p["tie"] else ("A better" if p["mean"] < 0 else "B better")
    line = (f"held-out BPB {p['a']} − {p['b']}: {interval_text(p)} {word} "
            f"({p['bpb_a']:.4f} vs {p['bpb_b']:.4f}; paired bootstrap over {p['units']} {p['unit']}, {p['bytes']:,} "
            f"bytes, {p['resamples']:,} resamples, {p['level']:.0%})")
    for c in p.get("by_class", []):
        line += (f"\n  {c['class']:<12} {c['share']:6.1%} of the bytes: A − B {c['diff']:+.4f} BPB there, "
                 f"{c['contribution']:+.4f} of the difference" if c["diff"] is not None else f"\n  {c['class']}: none")
        if c["diff"] is not None and ("first_a" in c or "first_b" in c):
            line += "; a token's first byte in " + " / ".join(
                f"{c[k]:.0%}" if k in c else "—" for k in ("first_a", "first_b")) + " of them (A / B)"
    return line
