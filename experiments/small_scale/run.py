"""Learned tokenization at small scale: does the learned policy make boundaries matter, find words, and
beat random boundaries within a fixed CPU budget on English Wikipedia?

Final comparison (strategies x seeds at one configuration, equal wall-clock per arm, one training at a time):

    python experiments/small_scale/run.py final --data DATA/enwiki --out runs/small_scale \\
        --budget 1200 --seeds 0 1 2

Screening (one arm; appends a line to OUT/screening.jsonl):

    python experiments/small_scale/run.py screen NAME --budget 300 -- --boundaries learned --gamma 0.9

Each arm is `learntok train --preset small --schedule time --time-budget BUDGET ...` (the cosine decay ends when
the budget does, so no arm is cut off at a high learning rate), then `boundary_diagnostics` on the held-out
split: BPB with the model's own boundaries, with rate-0 boundaries (sensitivity) and with iid random boundaries
at the model's rate (placement), and agreement with SpaceByte's word transitions. `final` also trains the
baselines for as many bytes as the learned arm saw in the budget (equal bytes) and writes OUT/results.json,
OUT/records.jsonl (learntok.records: one record per arm, with the run's provenance) and
OUT/results.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from learntok import records
from learntok.checkpoint import load_run
from learntok.data import ByteSequences, val_batches_with_flags
from learntok.evaluation.bpb import BoundaryMode, evaluating, heldout_bpb
from learntok.evaluation.diagnostics import boundary_diagnostics
from learntok.evaluation.report import DIAGNOSTIC_BYTES, heldout_documents
from learntok.viz.curves import load_metrics


def val_sequences(cfg, model) -> ByteSequences:
    """The run's validation split as `learntok eval` reads it, with the strategy's flags."""
    _, docs = heldout_documents(cfg, None, "val")
    return ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, name="validation data",
                         annotate=model.boundary.annotator)


def train_arm(run: Path, data: str, budget: float, flags: list[str], *, preset: str = "small",
              max_bytes: float = 0.0) -> dict:
    """Train one arm in a fresh process; returns its final metrics row plus wall time."""
    cmd = [sys.executable, "-m", "learntok", "train", "--preset", preset, "--data", data, "--out", str(run),
           "--overwrite", "--no-progress", "--ckpt-every", "0"]
    if max_bytes:  # equal bytes: the cosine runs over exactly these bytes
        cmd += ["--max-bytes", str(int(max_bytes))]
    else:  # equal wall-clock
        cmd += ["--schedule", "time", "--time-budget", str(budget)]
    cmd += flags
    (run.parent / f"{run.name}.cmd").parent.mkdir(parents=True, exist_ok=True)
    (run.parent / f"{run.name}.cmd").write_text(" ".join(cmd[3:]) + "\n")  # the command, for its record
    t0 = time.time()
    with open(run.parent / f"{run.name}.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    evals = load_metrics(run).evals
    final = evals[-1]
    return {"val_bpb": final["val/bpb"], "val_rate": final["val/rate"], "early_exit_bpb": final.get("val/early_bpb"),
            "bytes": final["bytes"], "train_seconds": final["time"], "bytes_per_s": final["bytes"] / final["time"],
            "wall_seconds": time.time() - t0,
            "curve": [(r["bytes"], r["val/bpb"]) for r in evals]}


def diagnose(run: Path) -> dict:
    """Boundary diagnostics on the first DIAGNOSTIC_BYTES held-out bytes, plus, for strategies whose boundaries
    have probabilities (learned, dynamic, hnet), validation BPB with greedy boundaries (p > 0.5) on the same
    bytes as val BPB (which uses one boundary sample, the paper's protocol)."""
    cfg, model = load_run(run)
    seqs = val_sequences(cfg, model)
    res = {f"diag/{k}": v for k, v in
           boundary_diagnostics(model, val_batches_with_flags(seqs, 8, DIAGNOSTIC_BYTES), "cpu").items()}
    res.update(greedy_bpb(cfg, model, seqs))
    return res


def greedy_bpb(cfg, model, seqs: ByteSequences) -> dict:
    if model.boundary.learns_by not in ("score_function", "straight_through"):
        return {}
    bm = BoundaryMode("greedy")
    with evaluating(model, bm):
        return {"val_bpb_greedy": heldout_bpb(model, seqs, bm, max_bytes=cfg.data.val_bytes)["bpb"]}


def arm(run: Path, data: str, budget: float, flags: list[str], **kw) -> dict:
    res = train_arm(run, data, budget, flags, **kw)
    res.update(diagnose(run))
    return res


def cmd_screen(args, flags: list[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = arm(out / args.name, args.data, args.budget, flags, preset=args.preset)
    res = {"name": args.name, "flags": flags, "budget": args.budget, "preset": args.preset, **res}
    res.pop("curve")
    with open(out / "screening.jsonl", "a") as f:
        f.write(json.dumps(res) + "\n")
    keys = ["val_bpb", "bytes", "bytes_per_s", "diag/rate", "diag/sensitivity", "diag/placement", "diag/spacebyte_f1",
            "diag/spacebyte_f1_chance"]
    print(args.name, " ".join(f"{k}={res[k]:.4g}" for k in keys), flush=True)


def config_command(run: Path) -> list[str]:
    """The `learntok` arguments that trained `run` (written beside it by train_arm)."""
    return (run.parent / f"{run.name}.cmd").read_text().split()


def mean_sd(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.4f}"
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f}"


def cmd_final(args, flags: list[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"budget": args.budget, "flags": flags,
                                                                  "preset": args.preset, "arms": []}
    done = {(r["strategy"], r["seed"], r["compare"]): r for r in results["arms"]}

    def record(strategy: str, seed: int, compare: str, **kw) -> dict:
        run = out / f"{strategy}-{compare}-seed{seed}"
        res = done.get((strategy, seed, compare))
        if res is not None:
            if "val_bpb_greedy" not in res and (run / "config.json").exists():  # results from before the column
                cfg, model = load_run(run)
                res.update(greedy_bpb(cfg, model, val_sequences(cfg, model)))
                path.write_text(json.dumps(results, indent=1))
            return res
        res = {"strategy": strategy, "seed": seed, "compare": compare,
               **arm(run, args.data, args.budget, [*flags, "--boundaries", strategy, "--seed", str(seed)],
                   preset=args.preset, **kw)}
        results["arms"].append(res)
        path.write_text(json.dumps(results, indent=1))
        config, prov = records.run_provenance(run)
        records.append(out / "records.jsonl", records.make(
            "small_scale", strategy, seed, command=" ".join(["learntok", *config_command(run)]), prov=prov,
            config=config, **{k: v for k, v in res.items() if k not in ("strategy", "seed")}))
        print(json.dumps({k: v for k, v in res.items() if k != "curve"}), flush=True)
        return res

    for seed in args.seeds:
        learned = record("learned", seed, "time")
        for s in args.strategies:
            if s != "learned":
                record(s, seed, "time")
        for s in args.equal_bytes:
            record(s, seed, "bytes", max_bytes=learned["bytes"])
    (out / "results.md").write_text(table(results))
    print(table(results))


def table(results: dict) -> str:
    cols = [("val_bpb", "val BPB"), ("val_bpb_greedy", "greedy BPB"), ("bytes", "bytes seen"),
            ("bytes_per_s", "bytes/s"), ("diag/rate", "rate"),
            ("diag/spacebyte_f1", "SpaceByte F1"), ("diag/sensitivity", "sensitivity"),
            ("diag/placement", "placement")]
    flags = " ".join(results["flags"]) or "none"
    lines = [f"`--preset {results.get('preset', 'small')}`, {results['budget']:.0f} s of training per arm, "
             f"extra flags: {flags}.",
             "", "| strategy | compare | seeds | " + " | ".join(c[1] for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results["arms"]:
        groups.setdefault((r["strategy"], r["compare"]), []).append(r)
    for (s, c), rs in groups.items():
        cells = []
        for key, _ in cols:
            xs = [float(r[key]) for r in rs if key in r]
            if not xs:
                cells.append("—")
                continue
            cells.append(f"{statistics.mean(xs) / 1e6:.1f} M" if key == "bytes" else
                         f"{statistics.mean(xs) / 1e3:.1f} k" if key == "bytes_per_s" else mean_sd(xs))
        lines.append(f"| {s} | equal {'time' if c == 'time' else 'bytes'} | {len(rs)} | " + " | ".join(cells) + " |")
    learned = {r["seed"]: r for r in results["arms"] if r["strategy"] == "learned"}
    diffs = ["", "| baseline − learned (val BPB, same seed) | compare | seeds | difference | learned greedy |",
             "|---|---|---|---|---|"]
    for (s, c), rs in groups.items():
        pairs = [(r["val_bpb"], learned[r["seed"]]) for r in rs if s != "learned" and r["seed"] in learned]
        if pairs:
            d = [b - lr["val_bpb"] for b, lr in pairs]
            g = [b - lr["val_bpb_greedy"] for b, lr in pairs if "val_bpb_greedy" in lr]
            diffs.append(f"| {s} | equal {'time' if c == 'time' else 'bytes'} | {len(d)} | {mean_sd(d)} | "
                         f"{mean_sd(g) if len(g) == len(d) else '—'} |")
    lines += diffs if len(diffs) > 3 else []
    lines += curve_table(results)
    lines += ["", "Mean ± standard deviation over seeds (positive difference: learned is better). val BPB uses one "
              "boundary sample (the paper's protocol); greedy BPB, on the same bytes, boundaries where p > 0.5. "
              "sensitivity = BPB with rate-0 boundaries − BPB with the "
              "model's own; placement = BPB with iid random boundaries at the model's rate − BPB with its own."]
    return "\n".join(lines) + "\n"


def curve_table(results: dict) -> list[str]:
    """Validation BPB along the way of the equal-time arms, at the same bytes (every arm takes the same bytes
    per step, so their periodic evaluations fall on the same byte counts); each baseline is paired with the
    learned arm of the same seed, over the seeds both have. A byte count is a row when every learned seed has
    it; a baseline whose seeds do not all reach it (a shorter or slower arm) shows a dash there."""
    curves: dict[str, dict[int, dict[int, float]]] = {}
    for r in results["arms"]:
        if r["compare"] == "time":
            curves.setdefault(r["strategy"], {})[r["seed"]] = dict(r["curve"])
    learned = curves.pop("learned", {})
    pairs = {o: sorted(set(c) & set(learned)) for o, c in curves.items()}
    pairs = {o: seeds for o, seeds in pairs.items() if seeds}
    if not pairs:
        return []
    used = sorted(set().union(*pairs.values()))
    lines = ["", "Learning curves of the equal-time arms at the same bytes (val BPB, mean ± sd over the seeds "
             "in brackets; `end` is each arm's final evaluation, after its own bytes):", "",
             f"| bytes | learned {used} | " + " | ".join(f"{o} {seeds} | {o} − learned" for o, seeds in pairs.items())
             + " |", "|---|---|" + "---|---|" * len(pairs)]

    def row(label: str, at) -> str:
        """One table row; `at(curve)` picks the value of a curve, or None where it has none."""
        cells = [label, mean_sd([at(learned[s]) for s in used])]
        for o, seeds in pairs.items():
            vals = [at(curves[o][s]) for s in seeds]
            cells += (["—", "—"] if None in vals else
                      [mean_sd(vals), mean_sd([v - at(learned[s]) for v, s in zip(vals, seeds)])])
        return "| " + " | ".join(cells) + " |"

    for b in sorted(set.intersection(*(set(learned[s]) for s in used))):
        lines.append(row(f"{b / 1e6:.1f} M", lambda c, b=b: c.get(b)))
    lines.append(row("end", lambda c: c[max(c)]))
    return lines


def main() -> None:
    argv = sys.argv[1:]
    flags: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, flags = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["screen", "final", "table"])
    ap.add_argument("name", nargs="?", default="arm", help="screen: the arm's name")
    ap.add_argument("--data", default="../shared/data/text/enwiki")
    ap.add_argument("--out", default="runs/small_scale")
    ap.add_argument("--preset", default="small", help="learntok preset the arms start from")
    ap.add_argument("--budget", type=float, default=1200.0, help="training seconds per arm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--strategies", nargs="+", default=["learned", "uniform-random", "uniform"])
    ap.add_argument("--equal-bytes", nargs="*", default=["uniform-random"],
                    help="baselines also trained for exactly the learned arm's bytes")
    args = ap.parse_intermixed_args(argv)
    if args.command == "screen":
        cmd_screen(args, flags)
    elif args.command == "final":
        cmd_final(args, flags)
    else:
        print(table(json.loads((Path(args.out) / "results.json").read_text())))


if __name__ == "__main__":
    main()
