"""One model for any compression rate (docs/results.md, "One model, any rate").

A variable-rate learned model (`--rate-range 0.1 0.3333`: one target drawn per step, log-uniform) against
dedicated fixed-rate learned models at 0.1, 0.2 and 0.3333, the 0.2 model forced to other rates by shifting its
logits (the cheap alternative), and fixed patches (`uniform`) at each rate. Every arm is `learntok train --preset
small` with the `learned-w1-vb` policy (one previous boundary, a learned baseline) or `uniform`, and trains for the
same training FLOPs (the paper's 6N): those of 6e6 bytes of `uniform` at rate 0.2, on a FLOPs schedule.

    python experiments/rates/run.py train --data DATA/enwiki --out runs/rates --seeds 0 1 2
    python experiments/rates/run.py evaluate --data DATA/enwiki --out runs/rates --seeds 0 1 2
    python experiments/rates/run.py report

`train` trains every (arm, seed) not yet trained, one at a time, resuming an interrupted one from its checkpoint.
`evaluate` calibrates each learned model on validation text (`learntok calibrate`), sweeps the asked rate on test
text (BPB and realised rate at each), and appends one record per (arm, seed) to experiments/rates/records.jsonl
(the training run's config and provenance, the evaluation's provenance, every number). `report` prints the tables
that docs/results.md holds (experiments/report.py writes them there) and draws docs/images/rates.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import arms  # noqa: E402  (experiments/arms.py)

STUDY = "rates"
RECORDS = Path(__file__).resolve().parent / "records.jsonl"
RATES = (0.1, 0.2, 0.3333)
"""The dedicated models' rates (uniform: patches of 10, 5 and 3 bytes)."""
RANGE = (0.1, 0.3333)
POLICY = ["--policy-window", "1", "--value-baseline"]
"""learned-w1-vb's policy (experiments/arms.py)."""
BUDGET_BYTES = 6e6
"""The FLOPs budget: 6N of this many bytes of `uniform` at rate 0.2."""
ARMS: dict[str, list[str]] = {
    **{f"fixed-{r:g}": [*POLICY, "--target-rate", f"{r:g}"] for r in RATES},
    **{f"uniform-{r:g}": ["--boundaries", "uniform", "--target-rate", f"{r:g}"] for r in RATES},
    "variable": [*POLICY, "--target-rate", "0.2", "--rate-range", *map(str, RANGE)],
    # screened on validation at seed 0 against `variable`: the rate also given to the token stack; two targets per
    # step (two strata of 4 rows, each with its own baseline and rate loss)
    "variable-tokens": [*POLICY, "--target-rate", "0.2", "--rate-range", *map(str, RANGE), "--rate-tokens"],
    "variable-s2": [*POLICY, "--target-rate", "0.2", "--rate-range", *map(str, RANGE), "--rate-strata", "2"],
}


def budget() -> float:
    return BUDGET_BYTES * arms.flops_per_byte("uniform", 0.2)


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-seed{seed}"


def cmd_train(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for arm in args.arms:
            run = run_dir(out, arm, seed)
            if (run / "final.json").exists():
                continue
            print(f"training {arm} seed {seed}", flush=True)
            res = arms.train_arm(run, Path(args.data), arm, rate=0.2, seed=seed, flops_budget=budget(),
                                 eval_every=500, flags=ARMS[arm])
            import json

            (run / "final.json").write_text(json.dumps({k: res[k] for k in ("bytes", "flops", "flops_padded",
                                                                             "flops_total", "train_seconds",
                                                                             "command") if k in res}) + "\n")
            print(f"{arm} seed {seed}: {res['bytes'] / 1e6:.2f} MB, {res['flops']:.3g} FLOPs, "
                  f"{res['train_seconds']:.0f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train every (arm, seed) not yet trained")
    t.add_argument("--data", required=True)
    t.add_argument("--out", default="runs/rates")
    t.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    t.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    t.set_defaults(func=cmd_train)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
