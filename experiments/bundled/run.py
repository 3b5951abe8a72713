"""The model shipped inside the package (`learntok.from_pretrained("enwiki-small")`): trained and exported by
this script, which anyone can rerun.

    python experiments/bundled/run.py run --data ../shared/data/text/enwiki      # about 25 minutes on 2 cores

It trains the `small` preset with the headline's learned policy (`learned-w1-vb`: a one-boundary policy window
and a learned value baseline; docs/results.md) on English Wikipedia's train split (2.4e7 bytes), evaluates it
(`learntok eval RUN --tasks none`: held-out BPB on the test split, boundary statistics), exports it into
src/learntok/models/enwiki-small/ (weights, config, model card, the transformers files) and appends a record
to experiments/bundled/records.jsonl. An interrupted run resumes (`--resume`) when started again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from learntok import records
from learntok.viz.curves import load_metrics

RECORDS = Path(__file__).with_name("records.jsonl")
TARGET = Path(__file__).resolve().parents[2] / "src" / "learntok" / "models" / "enwiki-small"
FLAGS = ["--preset", "small", "--policy-window", "1", "--value-baseline", "--seed", "0"]


def learntok(args: list[str]) -> None:
    print("learntok " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "learntok", *args], check=True)


def run(data: Path, out: Path, threads: int | None) -> None:
    more = ["--threads", str(threads)] if threads else []
    if (out / "config.json").exists():
        learntok(["train", "--resume", str(out), "--progress-style", "lines", *more])
    else:
        learntok(["train", *FLAGS, "--data", str(data), "--out", str(out), "--progress-style", "lines", *more])
    learntok(["eval", str(out), "--tasks", "none"])
    if TARGET.exists():
        shutil.rmtree(TARGET)
    learntok(["export", str(out), str(TARGET)])
    val = load_metrics(out).evals[-1]
    ev = json.loads((out / "eval.json").read_text())
    config, prov = records.run_provenance(out)
    rec = records.make("bundled", "enwiki-small", 0, prov=prov, config=config,
                       command=f"learntok train {' '.join(FLAGS)} --data {data} --out {out}",
                       bytes=val["bytes"], train_seconds=val["time"],
                       val={"bpb": val["val/bpb"], "rate": val["val/rate"]},
                       heldout={k: ev["heldout"][k] for k in ("bpb", "bpb_se", "bytes", "data")},
                       boundary_stats={k: ev["boundary_stats"][k] for k in ("rate", "bytes_per_token")},
                       diagnostics=ev["diagnostics"], eval_command=f"learntok eval {out} --tasks none",
                       weights_bytes=(TARGET / "model.safetensors").stat().st_size)
    records.append(RECORDS, rec)
    print(f"val BPB {rec['val']['bpb']:.4f}, held-out {rec['heldout']['bpb']:.4f}, rate {rec['val']['rate']:.3f}; "
          f"exported to {TARGET}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", type=Path, default=Path("../shared/data/text/enwiki"))
    r.add_argument("--out", type=Path, default=Path("runs/bundled/enwiki-small"))
    r.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    run(args.data, args.out, args.threads)


if __name__ == "__main__":
    main()
