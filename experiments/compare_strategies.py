"""Every boundary strategy on the same U-Net and the same training bytes, then the paper's evaluation.

    python experiments/compare_strategies.py --out runs/strategies --steps 600 --eval-limit 200

For each strategy: `learntok train --preset tiny --boundaries NAME --max-steps STEPS` (same model, data, seed,
bytes), then `learntok eval RUN --limit EVAL_LIMIT`, then `learntok compare` over all runs. Writes
OUT/strategies.md, OUT/strategies.json and OUT/records.jsonl (learntok.records) with validation BPB, boundary
rate and training bytes/s per strategy,
plus OUT/comparison.md (Table 1 / Table 3 layout). Runs one training at a time (2-core machines).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from learntok import records
from learntok.viz.curves import load_metrics

STRATEGIES = ["learned", "uniform", "uniform-random", "whitespace", "bpe", "dynamic", "hnet", "entropy"]


def last_rows(run: Path) -> tuple[dict, dict]:
    metrics = load_metrics(run)
    return [r for r in metrics.train if "loss/auto" in r], metrics.evals[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/strategies")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--data", default="stdlib")
    ap.add_argument("--strategies", nargs="+", default=STRATEGIES)
    ap.add_argument("--eval-limit", type=int, default=200, help="examples per downstream task (0 = skip eval)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    learntok = [sys.executable, "-m", "learntok"]
    results = []
    for name in args.strategies:
        run = out / name
        t0 = time.time()
        train_args = ["train", "--preset", "tiny", "--boundaries", name, "--out", str(run), "--data", args.data,
                      "--max-steps", str(args.steps), "--seed", str(args.seed), "--no-progress", "--eval-every", "0"]
        subprocess.run([*learntok, *train_args], check=True)
        wall = time.time() - t0
        train_rows, final = last_rows(run)
        seconds = final.get("time", train_rows[-1]["time"])
        res = {"strategy": name, "val_bpb": final["val/bpb"], "val_rate": final["val/rate"],
               "early_exit_bpb": final.get("val/early_bpb"), "bytes": final["bytes"], "train_seconds": seconds,
               "bytes_per_s": final["bytes"] / seconds, "wall_seconds_incl_setup": wall,
               "flops_per_byte": train_rows[-1].get("flops_per_byte")}
        if args.eval_limit:
            subprocess.run([*learntok, "eval", str(run), "--limit", str(args.eval_limit), "--no-progress"],
                           check=True)
        results.append(res)
        config, prov = records.run_provenance(run)
        records.append(out / "records.jsonl", records.make("compare_strategies", name, args.seed,
                                                           command=["learntok", *train_args], prov=prov, config=config,
                                                           **{k: v for k, v in res.items() if k != "strategy"}))
        print(json.dumps(res), flush=True)
    (out / "strategies.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| strategy | val BPB | boundary rate | train bytes/s | training time | FLOPs/byte |",
             "|---|---|---|---|---|---|"]
    best = min(r["val_bpb"] for r in results)
    for r in results:
        bpb = f"**{r['val_bpb']:.4f}**" if r["val_bpb"] == best else f"{r['val_bpb']:.4f}"
        lines.append(f"| {r['strategy']} | {bpb} | {r['val_rate']:.3f} | {r['bytes_per_s'] / 1e3:.1f} k | "
                     f"{r['train_seconds']:.0f} s | {(r['flops_per_byte'] or 0) / 1e6:.2f} M |")
    (out / "strategies.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.eval_limit:
        subprocess.run([*learntok, "compare", *(str(out / n) for n in args.strategies), "--out", str(out)],
                       check=True)


if __name__ == "__main__":
    main()
