"""What the GPU path's numerics cost in quality, measured on a CPU: the `tiny` preset (1,000 steps on the
built-in data, the README's first command) in fp32, in bf16-mixed with the residual stream in bf16 (the
default under bf16-mixed) and in bf16-mixed with an fp32 stream (--residual-dtype fp32), paired by seed.

    python experiments/precision/run.py run --out runs/precision --seeds 0 1
    python experiments/precision/run.py table

Each arm and seed is a record in experiments/precision/records.json (flags, command, seed, git commit,
validation BPB, final training loss); an arm already recorded for a seed is skipped, so an interrupted run
goes on where it stopped. `table` prints the paired differences with 95 % t-intervals.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from arms import t_interval  # noqa: E402

RECORDS = Path(__file__).with_name("records.json")
ARMS = {
    "fp32": ["--precision", "fp32"],
    "bf16-mixed": ["--precision", "bf16-mixed"],  # residual stream in bf16 (--residual-dtype auto)
    "bf16-mixed-fp32-stream": ["--precision", "bf16-mixed", "--residual-dtype", "fp32"],
}


def _load() -> list[dict]:
    return json.loads(RECORDS.read_text()) if RECORDS.exists() else []


def _git() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()


def run(out: Path, seeds: list[int], arms: list[str]) -> None:
    sha = _git()  # the code the arms run (the script's start, not when each record is written)
    for seed in seeds:
        for arm in arms:
            if any(r["arm"] == arm and r["seed"] == seed for r in _load()):
                continue
            run_dir = out / f"{arm}-seed{seed}"
            cmd = [sys.executable, "-m", "learntok", "train", "--out", str(run_dir), "--overwrite", "--no-progress",
                   "--seed", str(seed), *ARMS[arm]]
            print(" ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            val = [r for r in rows if "val/bpb" in r][-1]
            train = [r for r in rows if "loss/auto" in r][-1]
            record = {"arm": arm, "seed": seed, "flags": ARMS[arm], "command": " ".join(["learntok", *cmd[3:]]),
                      "git": sha, "val_bpb": val["val/bpb"], "val_rate": val["val/rate"],
                      "final_loss_auto": train["loss/auto"], "bytes": val["bytes"]}
            RECORDS.write_text(json.dumps(_load() + [record], indent=1) + "\n")
            print(f"  {arm} seed {seed}: val BPB {record['val_bpb']:.4f}", flush=True)


def table() -> None:
    recs = _load()
    by = {(r["arm"], r["seed"]): r["val_bpb"] for r in recs}
    seeds = sorted({s for _, s in by})
    print("| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for arm in ARMS:
        print(f"| {arm} | " + " | ".join(f"{by[(arm, s)]:.4f}" if (arm, s) in by else "-" for s in seeds) + " |")
    for a, b in (("bf16-mixed", "bf16-mixed-fp32-stream"), ("bf16-mixed", "fp32"), ("bf16-mixed-fp32-stream", "fp32")):
        d = [by[(a, s)] - by[(b, s)] for s in seeds if (a, s) in by and (b, s) in by]
        if len(d) >= 2:
            mean, half, _ = t_interval(d)
            print(f"{a} - {b}: {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}] over {len(d)} seeds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path("runs/precision"))
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    sub.add_parser("table")
    args = ap.parse_args()
    run(args.out, args.seeds, args.arms) if args.cmd == "run" else table()


if __name__ == "__main__":
    main()
