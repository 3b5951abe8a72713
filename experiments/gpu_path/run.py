"""Two questions of the GPU path, measured on a CPU with the `tiny` preset (1,000 steps of 8 x 512 bytes on the
built-in data, the README's first command), paired by seed:

- precision: what bf16-mixed costs in fp32 BPB, with the residual stream in fp32 (the default) and in bf16
  (`--residual-dtype autocast`);
- batch statistics: under gradient accumulation (4 micro-batches of 2), the estimator's baseline from the
  current batch (the pre-pass, the default) or from the previous step (`--batch-stats lagged`, no pre-pass).

    python experiments/gpu_path/run.py run --question precision --seeds 0 1
    python experiments/gpu_path/run.py run --question batch-stats --seeds 0 1
    python experiments/gpu_path/run.py table

Each arm and seed is a record in experiments/gpu_path/records.jsonl (learntok.records: flags, command, config,
git SHA, versions, machine, validation BPB, training seconds, final training loss); an arm already recorded for a
seed is skipped, so an interrupted run goes on where it stopped. `table` prints every arm and the paired
differences with 95 % t-intervals.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from learntok import records
from learntok.evaluation.stats import interval_text, paired_interval
from learntok.viz.curves import load_metrics

RECORDS = Path(__file__).with_name("records.jsonl")
QUESTIONS = {
    "precision": {
        "fp32": ["--precision", "fp32"],
        "bf16-mixed": ["--precision", "bf16-mixed"],  # residual stream in fp32 (the default)
        "bf16-mixed-bf16-stream": ["--precision", "bf16-mixed", "--residual-dtype", "autocast"],
    },
    "batch-stats": {
        "accum-prepass": ["--micro-batch-size", "2"],
        "accum-lagged": ["--micro-batch-size", "2", "--batch-stats", "lagged"],
    },
}
PAIRS = [("bf16-mixed-bf16-stream", "bf16-mixed"), ("bf16-mixed", "fp32"), ("accum-lagged", "accum-prepass")]
ARMS = {name: flags for arms in QUESTIONS.values() for name, flags in arms.items()}


def run(out: Path, seeds: list[int], arms: list[str]) -> None:
    for seed in seeds:
        for arm in arms:
            if records.select(records.load(RECORDS), arm=arm, seed=seed):
                continue
            run_dir = out / f"{arm}-seed{seed}"
            cmd = [sys.executable, "-m", "learntok", "train", "--out", str(run_dir), "--overwrite", "--no-progress",
                   "--seed", str(seed), *ARMS[arm]]
            print(" ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            metrics = load_metrics(run_dir)
            val, train = metrics.evals[-1], [r for r in metrics.train if "loss/auto" in r][-1]
            config, prov = records.run_provenance(run_dir)
            record = records.make("gpu_path", arm, seed, command=["learntok", *cmd[3:]], prov=prov, flags=ARMS[arm],
                                  config=config, val_bpb=val["val/bpb"], val_rate=val["val/rate"],
                                  final_loss_auto=train["loss/auto"], bytes=val["bytes"], train_seconds=train["time"])
            records.append(RECORDS, record)
            print(f"  {arm} seed {seed}: val BPB {record['val_bpb']:.4f}", flush=True)


def table() -> str:
    """Every arm's validation BPB by seed and the paired differences with 95 % t-intervals (markdown)."""
    by = {(r["arm"], r["seed"]): r for r in records.load(RECORDS)}
    seeds = sorted({s for _, s in by})
    lines = ["| arm | flags | " + " | ".join(f"seed {s}" for s in seeds) + " | training s |",
             "|---|---|" + "---|" * (len(seeds) + 1)]
    for arm, flags in ARMS.items():
        recs = [by.get((arm, s)) for s in seeds]
        if not any(recs):
            continue
        secs = [r["train_seconds"] for r in recs if r and "train_seconds" in r]
        lines.append(f"| {arm} | `{' '.join(flags)}` | "
                     + " | ".join(f"{r['val_bpb']:.4f}" if r else "-" for r in recs)
                     + f" | {' / '.join(f'{x:.0f}' for x in secs) or '-'} |")
    lines.append("")
    for a, b in PAIRS:
        d = [by[(a, s)]["val_bpb"] - by[(b, s)]["val_bpb"] for s in seeds if (a, s) in by and (b, s) in by]
        if len(d) >= 2:
            p = paired_interval(d)
            lines.append(f"- {a} − {b}: {interval_text(p)} val BPB over {len(d)} "
                         f"seeds ({'tie' if p['tie'] else 'differ'})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path("runs/gpu_path"))
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--question", choices=list(QUESTIONS), default="precision")
    r.add_argument("--arms", nargs="+", choices=list(ARMS), help="only these arms of the question")
    sub.add_parser("table")
    args = ap.parse_args()
    if args.cmd == "table":
        return print(table())
    run(args.out, args.seeds, [a for a in QUESTIONS[args.question] if not args.arms or a in args.arms])


if __name__ == "__main__":
    main()
