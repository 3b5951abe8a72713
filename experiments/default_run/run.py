"""The README's first command as a recorded experiment: `learntok train` (the `tiny` preset on the built-in data),
then `learntok eval RUN --tasks none` (held-out BPB, boundary statistics, sensitivity and placement) and
`learntok diagnose variance RUN [--init]` (the policy gradient's variance and signal-to-noise ratio under each of
the paper's reductions, trained and at initialisation).

    python experiments/default_run/run.py run --seeds 0        # about 6 minutes per seed on 2 cores
    python experiments/default_run/run.py table

Each seed is a record in experiments/default_run/records.jsonl (learntok.records); a seed already recorded is
skipped. The built-in data is the running interpreter's standard library, so records name the Python version:
another Python trains on other text. Speed is not reported here (bench/README.md measures it on an otherwise idle
machine); the records keep the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from learntok import records
from learntok.viz.curves import load_metrics

RECORDS = Path(__file__).with_name("records.jsonl")


def run(out: Path, seeds: list[int], path: Path = RECORDS) -> None:
    for seed in seeds:
        if records.select(records.load(path), seed=seed):
            continue
        run_dir = out / f"seed{seed}"
        train = ["train", "--out", str(run_dir), "--overwrite", "--seed", str(seed), "--progress-style", "lines"]
        variance = [["diagnose", "variance", str(run_dir), *init] for init in ([], ["--init"])]
        for args in (train, ["eval", str(run_dir), "--tasks", "none"], *variance):
            print("learntok " + " ".join(args), flush=True)
            subprocess.run([sys.executable, "-m", "learntok", *args], check=True, stdout=subprocess.DEVNULL)
        val = load_metrics(run_dir).evals[-1]
        ev = json.loads((run_dir / "eval.json").read_text())
        config, prov = records.run_provenance(run_dir)
        rec = records.make("default_run", "tiny", seed, command="learntok " + " ".join(train[:-2]), prov=prov,
                           config=config, bytes=val["bytes"], train_seconds=val["time"],
                           val={"bpb": val["val/bpb"], "rate": val["val/rate"]},
                           heldout={k: ev["heldout"][k] for k in ("bpb", "bpb_se", "bytes", "data")},
                           boundary_stats={k: ev["boundary_stats"][k] for k in ("rate", "bytes_per_token")},
                           diagnostics=ev["diagnostics"], eval_command=f"learntok eval {run_dir} --tasks none",
                           variance={k: json.loads((run_dir / d / "variance.json").read_text())
                                     for k, d in (("trained", "diagnose"), ("init", "diagnose-init"))},
                           variance_command=f"learntok diagnose variance {run_dir} [--init]")
        records.append(path, rec)
        print(f"  seed {seed}: val BPB {rec['val']['bpb']:.4f}, rate {rec['val']['rate']:.3f}", flush=True)


def table(path: Path = RECORDS) -> str:
    """One row per measure, one column per seed (markdown)."""
    recs = sorted(records.load(path), key=lambda r: r["seed"])
    rows = [
        ("training bytes", lambda r: f"{r['bytes'] / 1e6:.2f} MB"),
        ("validation BPB (first 256 KB, one boundary sample)", lambda r: f"{r['val']['bpb']:.4f}"),
        ("boundary rate (target 0.2)", lambda r: f"{r['val']['rate']:.3f}"),
        ("held-out BPB (`learntok eval`, whole split ± s.e.)",
         lambda r: f"{r['heldout']['bpb']:.4f} ± {r['heldout']['bpb_se']:.4f}"),
        ("bytes per token (held-out)", lambda r: f"{r['boundary_stats']['bytes_per_token']:.2f}"),
        ("sensitivity: BPB with no boundaries − with its own", lambda r: f"{r['diagnostics']['sensitivity']:+.3f}"),
        ("placement: BPB with random boundaries at its rate − with its own",
         lambda r: f"{r['diagnostics']['placement']:+.3f}"),
        ("SpaceByte F1 (chance); one byte later",
         lambda r: f"{r['diagnostics']['spacebyte_f1']:.3f} ({r['diagnostics']['spacebyte_f1_chance']:.3f}); "
                   f"{r['diagnostics']['wordstart_f1']:.3f}"),
        ("machine", lambda r: f"{r['provenance'].get('cpu', '?')}, Python {r['provenance'].get('python', '?')}, "
                              f"{r['provenance'].get('torch_threads', '?')} thread(s)"),
        ("code", lambda r: f"`{(r['provenance'].get('git_sha') or '?')[:9]}`"
                           + (" (uncommitted changes)" if r["provenance"].get("git_dirty") else "")),
    ]
    lines = ["| measure | " + " | ".join(f"seed {r['seed']}" for r in recs) + " |",
             "|---|" + "---|" * len(recs)]
    lines += [f"| {name} | " + " | ".join(f(r) for r in recs) + " |" for name, f in rows]
    if len(recs) > 1:
        bpb = [r["val"]["bpb"] for r in recs]
        lines += ["", f"Validation BPB over {len(recs)} seeds: mean {statistics.mean(bpb):.4f}, "
                  f"sd {statistics.stdev(bpb):.4f}."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path("runs/default_run"))
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    sub.add_parser("table")
    args = ap.parse_args()
    if args.cmd == "table":
        return print(table())
    run(args.out, args.seeds)


if __name__ == "__main__":
    main()
