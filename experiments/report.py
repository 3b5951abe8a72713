"""Regenerate every result table in the docs from the committed experiment records (learntok.records).

    python experiments/report.py            # rewrite the generated blocks of README.md and docs/*.md
    python experiments/report.py --check    # exit 1, naming the blocks, if a rewrite would change anything
    python experiments/report.py --plots    # also redraw docs/images/ figures drawn from records (needs matplotlib)

A generated block is the text between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; NAME is a key of
BLOCKS below, whose function reads the records and returns the block's markdown. Text outside the blocks is prose
and is not touched. tests/test_records.py runs the check, so a table typed by hand, or a record changed without
regenerating the docs, fails the tests.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import statistics
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
from learntok import records  # noqa: E402
from learntok.evaluation.stats import interval_text, paired_interval  # noqa: E402

DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md")
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)


@functools.cache
def _script(study: str):
    """experiments/STUDY/run.py as a module (the study scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{study}_run", HERE / study / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _leaderboard() -> tuple[dict, ...]:
    """The English Wikipedia records, read once (every block that needs them reads these)."""
    return tuple(records.load(HERE / "leaderboard" / "records.jsonl"))


def _ci(d: list[float], level: float = 0.95) -> str:
    return interval_text(paired_interval(d, level))


def _shift(r: dict) -> str:
    """Where a learned arm's test boundaries agree best with SpaceByte's word starts (records with F1 only)."""
    if "f1_by_shift" not in r.get("test", {}):
        return "— (transcribed: no F1)"
    k = r["test"]["best_shift"]
    # shift k compares the model's boundary at t with the reference's at t + k: k > 0 means k bytes early
    where = {0: "at them", 1: "one byte earlier", -1: "one byte later", 2: "two bytes earlier", -2: "two bytes later"}
    return f"{where.get(k, f'shift {k:+d}')} (F1 {r['test']['f1_by_shift'][str(k)]:.2f})"


def headline() -> str:
    """The headline pair per seed and over each declared seed set."""
    lb = _script("leaderboard")
    results = {"arms": _leaderboard()}
    pairs = lb.headline_pairs(results)
    arm, base, _ = lb.HEADLINE
    by = lb.headline_rows(results)
    lines = [f"| seed | `{arm}` test BPB | `{base}` test BPB | difference (test) | difference (val) | rate | "
             "FLOPs vs uniform | learned's boundaries vs SpaceByte's word starts | record |",
             "|---|---|---|---|---|---|---|---|---|"]
    for seed, (t, v) in pairs.items():
        a, b = by[arm, seed], by[base, seed]
        rate = f"{a['test']['rate']:.3f}" if "rate" in a["test"] else "—"
        flops = f"{a['flops'] / b['flops']:.3f}×" if "flops" in a and "flops" in b else "—"
        lines.append(f"| {seed} | {a['test']['bpb']:.4f} | {b['test']['bpb']:.4f} | {t:+.4f} | {v:+.4f} | {rate} | "
                     f"{flops} | {_shift(a)} | {a['source']} |")
    lines.append("")
    first, extended = lb.DECLARED.values()
    for name, seeds in lb.DECLARED.items():
        if not all(s in pairs for s in seeds):
            lines.append(f"- {name} (seeds {seeds[0]}–{seeds[-1]}): incomplete, not reported")
            continue
        test, val = [pairs[s][0] for s in seeds], [pairs[s][1] for s in seeds]
        p = paired_interval(test)
        lines.append(f"- {name} (seeds {seeds[0]}–{seeds[-1]}, {len(seeds)} seeds): test **{_ci(test)}** "
                     f"({'tie' if p['tie'] else 'learned better' if p['mean'] < 0 else 'uniform better'}, "
                     f"t = {p['t']:.2f} at {len(seeds) - 1} degrees of freedom); validation {_ci(val)}")
        if seeds is extended:
            new = [s for s in seeds if s not in first]
            lines.append(f"- the same set at 97.5 % (a 95 % error split over two looks): test {_ci(test, 0.975)}")
            lines.append(f"- its new seeds alone ({new[0]}–{new[-1]}, a replication): test "
                         f"{_ci([pairs[s][0] for s in new])}; validation {_ci([pairs[s][1] for s in new])}")
    return "\n".join(lines) + "\n"


def rate_control() -> str:
    """The FLOPs-matched control of the headline pair, per seed."""
    rows = {(r["arm"], r["seed"]): r for r in _leaderboard() if r.get("budget_bytes") == 2.4e7}
    lines = ["| seed | control test BPB | control rate (test) | FLOPs vs uniform | control − uniform (test / val) | "
             "control − `learned-w1-vb` (test / val) | boundaries |", "|---|---|---|---|---|---|---|"]
    for (arm, seed), c in sorted(rows.items(), key=lambda kv: kv[0][1]):
        if arm != "learned-w1-vb-rate188":
            continue
        u, w = rows["uniform", seed], rows["learned-w1-vb", seed]
        lines.append(f"| {seed} | {c['test']['bpb']:.4f} | {c['test']['rate']:.3f} | {c['flops'] / u['flops']:.3f}× | "
                     f"{c['test']['bpb'] - u['test']['bpb']:+.4f} / {c['val']['bpb'] - u['val']['bpb']:+.4f} | "
                     f"{c['test']['bpb'] - w['test']['bpb']:+.4f} / {c['val']['bpb'] - w['val']['bpb']:+.4f} | "
                     f"{_shift(c)} |")
    return "\n".join(lines) + "\n"


def headline_controls() -> str:
    """The headline pair's two confound controls (leaderboard CONTROLS), per seed and over their declared seeds."""
    lb = _script("leaderboard")
    found = lb.control_rows({"arms": _leaderboard()})
    lines = ["| control | seed | test BPB | rate (test) | 6N / padded 6N FLOPs vs uniform | control − uniform | "
             "`learned-w1-vb` − control |", "|---|---|---|---|---|---|---|"]
    for control, by in found.items():
        for seed, (c, u, w) in by.items():
            flops = (f"{c['flops'] / u['flops']:.3f}× / {c.get('flops_padded', c['flops']) / u['flops']:.3f}×"
                     if c.get("flops") and u.get("flops") else "—")
            lines.append(f"| `{control}` | {seed} | {c['test']['bpb']:.4f} | {c['test'].get('rate', 0):.3f} | {flops} "
                         f"| {c['test']['bpb'] - u['test']['bpb']:+.4f} | {w['test']['bpb'] - c['test']['bpb']:+.4f} |")
    lines = lines + [""] if len(lines) > 2 else []
    for control, seeds in lb.CONTROLS.items():
        by = found[control]
        head = f"- `{control}`, {len(by)} of its {len(seeds)} declared seeds ({seeds[0]}–{seeds[-1]})"
        if len(by) < 2:
            lines.append(head + ": not yet two seeds")
            continue
        vs_uniform, vs_learned = _control_differences(by)
        lines.append(head + f"{'' if len(by) == len(seeds) else ', incomplete'}: test, control − uniform "
                     f"{interval_text(paired_interval(vs_uniform), tie=True)}; `learned-w1-vb` − control "
                     f"{interval_text(paired_interval(vs_learned), tie=True)}")
    return "\n".join(lines) + "\n"


def _control_differences(by: dict) -> tuple[list[float], list[float]]:
    """A control's test differences over its seeds (leaderboard control_rows' {seed: (control, uniform,
    learned-w1-vb)}): control − uniform, and learned-w1-vb − control."""
    return ([c["test"]["bpb"] - u["test"]["bpb"] for c, u, _ in by.values()],
            [w["test"]["bpb"] - c["test"]["bpb"] for c, _, w in by.values()])


def _each(rs: list[dict], f, digits: int) -> str:
    return " / ".join(f"{f(r):.{digits}f}" for r in rs)


def matched_time() -> str:
    """The 600-second arms: per seed, mean, and paired differences against uniform."""
    rows = [r for r in _leaderboard() if r.get("match") == "time"]
    names = sorted({r["arm"] for r in rows}, key=lambda a: statistics.mean(
        r["test"]["bpb"] for r in rows if r["arm"] == a))
    by = {(r["arm"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    sl = " / ".join(str(s) for s in seeds)
    lines = [f"| arm | test BPB seed {sl} | mean | val BPB (mean) | MB trained seed {sl} | kB/s seed {sl} | "
             "F1 vs SpaceByte (test) | − uniform, test (95 % CI) |", "|---|---|---|---|---|---|---|---|"]
    for a in names:
        rs = [by[a, s] for s in seeds if (a, s) in by]
        d = [by[a, s]["test"]["bpb"] - by["uniform", s]["test"]["bpb"] for s in seeds
             if (a, s) in by and ("uniform", s) in by]
        diff = "" if a == "uniform" else (_ci(d) + (" tie" if paired_interval(d)["tie"] else "")) if len(d) > 1 else ""
        lines.append(f"| `{a}` | {_each(rs, lambda r: r['test']['bpb'], 4)} | "
                     f"{statistics.mean(r['test']['bpb'] for r in rs):.4f} | "
                     f"{statistics.mean(r['val']['bpb'] for r in rs):.4f} | "
                     f"{_each(rs, lambda r: r['bytes'] / 1e6, 2)} | "
                     f"{_each(rs, lambda r: r['bytes'] / r['train_seconds'] / 1e3, 1)} | "
                     f"{_each(rs, lambda r: r['test']['f1'], 3)} | {diff} |")
    return "\n".join(lines) + "\n"


def planted(which: str) -> callable:
    """The planted benchmark's table for one language (sep / nosep: experiments/planted/records-WHICH.jsonl)."""
    def block() -> str:
        rows = records.load(HERE / "planted" / f"records-{which}.jsonl")
        if not rows:
            return "(no records yet)\n"
        return _script("planted").table({"arms": rows}, speed=False) + "\n"
    return block


def gpu_path() -> str:
    return _script("gpu_path").table() + "\n"


def _snr(x: float) -> str:
    return f"{x:.3g}" if x > 0 else "none"


def variance() -> str:
    """The policy gradient's variance and SNR per estimator, at initialisation and trained (default-run records)."""
    recs = sorted((r for r in records.load(HERE / "default_run" / "records.jsonl") if "variance" in r),
                  key=lambda r: r["seed"])
    if not recs:
        return "(no records yet)\n"
    info = recs[0]["variance"]["trained"]
    group = info["rows"][0]["group"]

    def col(state: str, name: str, key: str, fmt) -> str:
        rows = [next(x for x in r["variance"][state]["rows"] if x["name"] == name and x["group"] == group)
                for r in recs]
        return " / ".join(fmt(x[key]) for x in rows)

    def num(x: float) -> str:
        return f"{x:.3g}"

    def need(x: float) -> str:
        return f"{1 / x:.3g}" if x > 0 else "no signal"

    lines = [f"Seeds {' / '.join(str(r['seed']) for r in recs)} (values per seed); parameters: {group}; "
             f"{info['samples']} boundary draws on one batch of {info['batch']} × {info['seq_len']} validation bytes; "
             f"reference: centred, γ = 1, {info['reference_samples']} draws. SNR ≤ 0: no signal detectable.", "",
             "| estimator | init: variance | init: SNR | trained: variance | trained: SNR | trained: batches for SNR 1 "
             "| trained: cosine to reference |", "|---|---|---|---|---|---|---|"]
    for n in [x["name"] for x in info["rows"] if x["group"] == group]:
        lines.append(f"| {n} | {col('init', n, 'variance', num)} | {col('init', n, 'snr', _snr)} | "
                     f"{col('trained', n, 'variance', num)} | {col('trained', n, 'snr', _snr)} | "
                     f"{col('trained', n, 'snr', need)} | {col('trained', n, 'cosine', lambda x: f'{x:.2f}')} |")
    return "\n".join(lines) + "\n"


def default_run() -> str:
    return _script("default_run").table() + "\n"


def readme_summary() -> str:
    """The README's results, one claim per line, each with its interval and the conventions it holds under."""
    out = []
    runs = sorted(records.load(HERE / "default_run" / "records.jsonl"), key=lambda r: r["seed"])
    if runs:
        r = runs[0]
        others = "; ".join(f"seed {x['seed']}: {x['val']['bpb']:.3f}" for x in runs[1:])
        out.append(f"- The first command: validation **{r['val']['bpb']:.3f} bits per byte** at boundary rate "
                   f"{r['val']['rate']:.3f} (target 0.2) after {r['bytes'] / 1e6:.1f} MB (seed {r['seed']}, "
                   f"{r['provenance'].get('torch_threads', '?')} CPU thread"
                   f"{'' if r['provenance'].get('torch_threads') == 1 else 's'}"
                   f"{'; ' + others if others else ''}); without its boundaries the same model is "
                   f"{r['diagnostics']['sensitivity']:.2f} BPB worse.")
        trained = [x for x in r.get("variance", {}).get("trained", {}).get("rows", []) if x["group"] == "policy"]
        snr = {x["name"]: x["snr"] for x in trained}
        if snr:
            run_est = next(n for n in snr if "normalised" in n or "the run" in n)
            naive = (f"SNR {snr['naive']:.3g}" if snr["naive"] > 0 else
                     f"no signal detectable in {r['variance']['trained']['samples']} draws")
            out.append(f"- After that run one batch's policy gradient has SNR {_snr(snr[run_est])} with the run's "
                       f"estimator (naive REINFORCE: {naive}): the paper's variance reductions buy signal, partly "
                       "with bias (γ < 1), and one update is still mostly noise "
                       "([variance](docs/results.md#the-policy-gradients-variance)).")
    planted = records.load(HERE / "planted" / "records-sep.jsonl")
    by = {(r["arm"], r["seed"]): r for r in planted}

    def vs(base: str) -> str:
        seeds = sorted(s for (a, s) in by if a == "learned" and (base, s) in by)
        d = [by["learned", s]["test"]["bpb"] - by[base, s]["test"]["bpb"] for s in seeds]
        p = paired_interval(d)
        return f"{_ci(d)} ({len(d)} seeds; {'tie' if p['tie'] else 'learned better' if p['mean'] < 0 else 'worse'})"

    if sum(1 for a, _ in by if a == "learned") > 1:
        f1 = statistics.mean(r["test"]["f1"] for (a, _), r in by.items() if a == "learned")
        out.append(f"- On a planted language with spaces between words, at matched FLOPs, the learned policy finds the "
                   f"words (test F1 {f1:.2f}); test BPB, learned − random boundaries at its rate: "
                   f"{vs('uniform-random')}; learned − fixed 5-byte patches: {vs('uniform')}. Without spaces it "
                   "finds nothing (F1 at chance); "
                   "how the seeds were added: docs/results.md.")
    lb = _script("leaderboard")
    pairs = lb.headline_pairs({"arms": _leaderboard()})
    seeds = lb.DECLARED["with the declared extension"]
    test = [pairs[s][0] for s in seeds]
    over = [r["flops"] for r in _leaderboard() if r["arm"] == "learned-w1-vb" and r.get("budget_bytes") == 2.4e7
            and "flops" in r]
    base = [r["flops"] for r in _leaderboard() if r["arm"] == "uniform" and r.get("budget_bytes") == 2.4e7
            and "flops" in r]
    out.append("- English Wikipedia in the `small` preset's shape, matched training FLOPs (6N, 6.5e13), test split: "
               f"`learned-w1-vb` − fixed 5-byte patches = **{_ci(test)}** BPB over 9 declared seeds "
               f"({seeds[0]}–{seeds[-1]}; 4 of them transcribed; the first 5 alone were a tie), while its rate drift "
               f"spends {100 * (min(over) / statistics.mean(base) - 1):.0f}–"
               f"{100 * (max(over) / statistics.mean(base) - 1):.0f} % more training FLOPs. `learned-w1-vb` is the "
               "`small` preset's policy (an estimator biased for lower "
               "variance) with a one-boundary window and a learned baseline, not the paper's settings."
               + _controls_said(lb))
    alloc = _script("allocation")
    study = alloc.study_table()
    if study is None:  # before the study has paired seeds: the first screen's line, and the preset's at 600 s
        timed = [r for r in _leaderboard() if r.get("match") == "time"]
        t = {(r["arm"], r["seed"]): r["test"]["bpb"] for r in timed}

        def diff(arm: str, base: str) -> str:
            d = [t[arm, s] - t[base, s] for (a, s) in t if a == arm and (base, s) in t]
            return _ci(d) + (" (tie)" if paired_interval(d)["tie"] else "")

        out += [x for x in (alloc.summary(), "- Without n-grams, in the `small` preset's shape at matched time "
                            f"(600 s, 2 seeds, test BPB), `learned-w1-vb` beats none of the three: − patches "
                            f"{diff('learned-w1-vb', 'uniform')}, − flat {diff('learned-w1-vb', 'flat')}, − BPE "
                            f"transformer {diff('learned-w1-vb', 'bpe-lm')}.") if x]
    out.append(_script("rates").summary())
    out.append(_script("hierarchy").summary())
    text = "\n".join(_fill(x) for x in out if x) + "\n"
    if study is not None:  # last: its table ends the list
        intro, table = study.split("\n\n", 1)
        text += _fill(intro) + "\n\n" + table + "\n"
    return text


def _fill(item: str) -> str:
    """A README bullet wrapped at 115 columns, each of its lines under its own marker (a nested bullet's
    indented)."""
    return "\n".join(textwrap.fill(line, 115, subsequent_indent=" " * (len(line) - len(line.lstrip()) + 2),
                                    break_on_hyphens=False) for line in item.split("\n"))


def _controls_said(lb) -> str:
    """The headline line's clause on its confound controls, each once all its declared seeds have run: the pair
    with the early-exit loss given to both (learned-w1-vb − uniform-ee) and matched in padded 6N
    (learned-w1-vb-padded − uniform); "" before either is complete."""
    found = lb.control_rows({"arms": _leaderboard()})
    said = []
    for control, what in (("uniform-ee", "with the early-exit loss given to the patches too"),
                          ("learned-w1-vb-padded", "with learned's padded token slots counted")):
        by = found[control]
        if len(by) == len(lb.CONTROLS[control]):
            vs_uniform, vs_learned = _control_differences(by)
            d = vs_learned if control == "uniform-ee" else vs_uniform
            p = paired_interval(d)
            said.append(f"{what} (`{control}`, {len(d)} seeds): {interval_text(p)}{' tie' if p['tie'] else ''}")
    return f" The difference {'; '.join(said)}." if said else ""


def segment_speed() -> str:
    """bench/bench_segment.py's records: MB/s of the learned tokenizer and a tokenizers BPE, same text and run."""
    lines = ["| model | boundaries | precision | threads | batch | text | tokenizers BPE (4096) | learned | "
             "BPE faster by | bytes/token (BPE; learned) | code | machine |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records.load(ROOT / "bench" / "records-segment.jsonl"):
        mb = r["bytes"] / 1e6
        lines.append(f"| {r['arm']} | {'greedy' if r['greedy'] else 'sampled'} | {r.get('precision', 'fp32')} | "
                     f"{r['threads']} | {r['batch_size']} | "
                     f"{mb:.1f} MB, {r['documents']} docs | {mb / r['bpe']['seconds']:.2f} MB/s | "
                     f"{mb / r['learned']['seconds']:.3f} MB/s | "
                     f"{r['learned']['seconds'] / r['bpe']['seconds']:.1f}× | "
                     f"{r['bytes'] / r['bpe']['tokens']:.2f}; {r['bytes'] / r['learned']['tokens']:.2f} | "
                     f"`{(r['provenance'].get('git_sha') or '?')[:9]}` | {r['provenance'].get('cpu', '?')} |")
    return "\n".join(lines) + "\n"


def embeddings_speed() -> str:
    """bench/bench_embeddings.py's records: a training step with hashed embeddings against the plain model."""
    lines = ["| variant | parameters | s / step | × plain (median of pairs) | threads | table rows | code | machine |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records.load(ROOT / "bench" / "records-embeddings.jsonl"):
        for name, v in r["variants"].items():
            lines.append(f"| {name} | {v['params']:,} | {v['seconds']:.3f} | {v['ratio']:.3f} | {r['threads']} | "
                         f"{r['table']:,} | `{(r['provenance'].get('git_sha') or '?')[:9]}` | "
                         f"{r['provenance'].get('cpu', '?')} |")
    return "\n".join(lines) + "\n"


def segment_stats() -> str:
    """The bundled model's segmentation statistics by domain (experiments/bundled, arm enwiki-small-stats)."""
    (rec,) = [r for r in records.load(HERE / "bundled" / "records.jsonl") if r["arm"] == "enwiki-small-stats"]

    def pair(x: dict) -> str:
        return f"{x['flip_rate']:.4f} / {x['f1']:.3f}"

    lines = ["| text | boundaries | bytes/token (CV) | vs whitespace P / R / F1 | shift: flip rate / F1 | "
             "bf16 | int8 |", "|---|---|---|---|---|---|---|"]
    for name, d in rec["domains"].items():
        st = d["stability"]
        for mode in ("sampled", "greedy"):
            c = d[mode]
            lines.append(f"| {name}, {d['bytes'] // 1024} KB | {mode} | {c['bytes_per_token']:.2f} "
                         f"({c['bytes_per_token_cv']:.2f}) | {c['whitespace_precision']:.2f} / "
                         f"{c['whitespace_recall']:.2f} / {c['whitespace_f1']:.2f} | "
                         + (f"{pair(st['shift'])} | {pair(st['bf16'])} | {pair(st['int8'])} |" if mode == "greedy"
                            else "— | — | — |"))
    return "\n".join(lines) + f"\n\nRecord: experiments/bundled/records.jsonl (`{rec['command']}`); stability on " \
        f"the first {rec['domains'][next(iter(rec['domains']))]['stability']['bytes']:,} bytes of each.\n"


def robustness_table() -> str:
    return _script("robustness").table() + "\n"


def rates(which: str) -> callable:
    def block() -> str:
        script = _script("rates")
        return {"table": script.table, "calibration": script.calibration_table, "screen": script.screen_table,
                "planted": script.planted_table, "levers": script.levers_table,
                "swap": script.swap_table}[which]()
    return block


def study_cost() -> str:
    """Issue 30's training time so far, per part of the study, summed from its records' training seconds (retired
    runs and cells included): what the issue's 10-12 hours bought, and where they went."""
    alloc, lb = _script("allocation"), _script("leaderboard")
    parts: dict[str, list[dict]] = {}
    for r in records.load(alloc.PRESET_RECORDS):
        parts.setdefault("first screen (every method in the preset's shape)", []).append(r)
    for r in sorted(records.load(alloc.SWEEP_RECORDS), key=lambda r: (r.get("clock", False), r["stage"])):
        _, stage, clock, ngrams = alloc._sweep_key(r)
        part = "matched seconds" if clock else f"stage {stage}{' with the n-gram tables' if ngrams else ''}"
        parts.setdefault(f"sweep cells, {part}", []).append(r)
    for r in sorted(records.load(alloc.RECORDS), key=lambda r: alloc._view_order(alloc._budget_key(r))):
        scale, match, _, _ = alloc._budget_key(r)
        parts.setdefault(f"final runs, x{scale:g}, {alloc.VIEWS[match]}", []).append(r)
    parts[f"the headline's confound controls ({lb.HEADLINE[2]:.2g} bytes)".replace("e+0", "e")] = [
        r for (arm, _), r in lb.headline_rows({"arms": _leaderboard()}).items() if arm in lb.CONTROLS]
    lines = ["| part | runs | of them retired | training hours |", "|---|---|---|---|"]
    for part, rs in [*parts.items(), ("**all**", [r for part_rows in parts.values() for r in part_rows])]:
        lines.append(f"| {part} | {len(rs)} | {sum(1 for r in rs if r.get('retired'))} | "
                     f"{sum(r['train_seconds'] for r in rs) / 3600:.1f} |")
    return "\n".join(lines) + "\n"


def allocation(records_file: str) -> callable:
    def block() -> str:
        script = _script("allocation")
        return script.report(script.HERE / records_file)
    return block


BLOCKS = {"allocation": allocation("records.jsonl"), "allocation-preset": allocation("records-preset.jsonl"),
          "allocation-sweep": lambda: _script("allocation").sweep_table(),
          "allocation-levers": lambda: _script("allocation").levers_table(), "allocation-cost": study_cost,
          "allocation-classes": lambda: _script("allocation").classes_table(),
          "rates": rates("table"), "rates-calibration": rates("calibration"), "rates-screen": rates("screen"),
          "rates-planted": rates("planted"), "rates-levers": rates("levers"), "rates-swap": rates("swap"),
          "embeddings-speed": embeddings_speed,
          "segment-speed": segment_speed, "segment-stats": segment_stats, "robustness": robustness_table,
          "default-run": default_run, "headline": headline, "rate-control": rate_control,
          "headline-controls": headline_controls,
          "matched-time": matched_time, "gpu-path": gpu_path, "variance": variance,
          "readme-summary": readme_summary, "planted-sep": planted("sep"),
          "planted-nosep": planted("nosep"), "hierarchy": lambda: _script("hierarchy").report()}
"""Block name -> the function that renders it from records."""


def render(text: str, cache: dict | None = None) -> str:
    """`text` with every generated block's body replaced by its function's output."""
    cache = {} if cache is None else cache

    def fill(m: re.Match) -> str:
        name = m["name"]
        if name not in BLOCKS:
            raise ValueError(f"unknown generated block {name!r} (known: {', '.join(BLOCKS)})")
        if name not in cache:
            cache[name] = BLOCKS[name]()
        return m.group(1) + cache[name] + m.group(4)

    return BLOCK.sub(fill, text)


def stale(paths=DOCS) -> list[str]:
    """'FILE: BLOCK' for every generated block whose text differs from what the records give."""
    out, cache = [], {}
    for path in paths:
        text = path.read_text()
        new = render(text, cache)
        old_blocks = {m["name"]: m["body"] for m in BLOCK.finditer(text)}
        out += [f"{path.relative_to(ROOT)}: {m['name']}" for m in BLOCK.finditer(new)
                if old_blocks.get(m["name"]) != m["body"]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    ap.add_argument("--plots", action="store_true", help="also redraw the figures drawn from records")
    args = ap.parse_args()
    if args.check:
        bad = stale()
        if bad:
            sys.exit("out of date (run python experiments/report.py): " + ", ".join(bad))
        print("every generated block matches the records")
        return
    cache: dict = {}
    for path in DOCS:
        text = path.read_text()
        new = render(text, cache)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}")
    if args.plots:
        lb = _script("leaderboard")
        lb.plot({"arms": [r for r in _leaderboard() if r["source"] != "transcribed"]},
                ROOT / "docs" / "images" / "headline.png",
                title="The headline pair at 6.5e13 FLOPs: the seeds with curves (bands: min–max over seeds)")
        print("drew docs/images/headline.png")
        print(f"drew {_script('rates').plot().relative_to(ROOT)}")
        print(f"drew {_script('allocation').plot().relative_to(ROOT)}")


if __name__ == "__main__":
    main()
