"""The planted-boundary benchmark: text whose optimal segmentation and best achievable bits per byte are known
(learntok.data.planted), every strategy at equal training FLOPs, seeds, one training at a time.

    python experiments/planted/run.py make --out runs/planted/data-sep                  # separators between words
    python experiments/planted/run.py make --out runs/planted/data-nosep --no-separator
    python experiments/planted/run.py run --data runs/planted/data-sep --out runs/planted/sep --seeds 0 1

Each arm is `learntok train --preset small --target-rate 1/(mean word bytes)` plus its own flags, for the bytes
that give every arm the same training FLOPs by the paper's accounting (6 x matrix parameters per byte at the byte
level, per token at the token level, at the target rate): arms whose strategy has more parameters see fewer
bytes. Evaluation: bits per byte on the first 256 KB of the validation and test splits (one boundary sample, the
paper's protocol), minus the language's entropy rate (the floor), and precision / recall / F1 of the boundaries
against the planted ones (the last byte of every word). `run` keeps finished arms (results.json) and adds the
missing ones; it writes results.md.

`run` also screens arms on real text (a data directory without planted.json, e.g. enwiki): the floor is then 0
and the reference boundaries are SpaceByte's word boundaries.

    python experiments/planted/run.py run --data DATA/enwiki --out runs/planted/enwiki --bytes 6e6 \
        --arms learned learned-nonorm learned-D16 learned-D16-nonorm uniform --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS: dict[str, list[str]] = {
    "learned": [],  # the small preset: D = 2, policy RMSNorm, gamma 0.9, normalised advantages, detached encoder
    "learned-nonorm": ["--no-policy-norm"],
    "learned-D16": ["--logit-scale", "16"],
    "learned-D16-nonorm": ["--logit-scale", "16", "--no-policy-norm"],
    "uniform": ["--boundaries", "uniform"],
    "uniform-random": ["--boundaries", "uniform-random"],
    "whitespace": ["--boundaries", "whitespace"],
    "hnet": ["--boundaries", "hnet"],
    "dynamic": ["--boundaries", "dynamic"],
}
EVAL_BYTES = 262_144


def cmd_make(args) -> None:
    from learntok.data.planted import PlantedLanguage, PlantedSpec

    lang = PlantedLanguage(PlantedSpec(separator=args.separator, vocab=args.vocab, seed=args.seed))
    out = lang.write(args.out, train_bytes=args.train_mb * 1e6, val_bytes=5e5, test_bytes=5e5)
    info = json.loads((out / "planted.json").read_text())
    print(f"wrote {out}: entropy rate {info['entropy_rate']:.4f} bits/byte, {info['mean_word_bytes']:.2f} bytes "
          f"per word (planted rate {1 / info['mean_word_bytes']:.3f})")


def arm_flags(name: str, rate: float) -> list[str]:
    flags = list(ARMS[name])
    return flags if "whitespace" in flags else [*flags, "--target-rate", f"{rate:.4f}"]


def flops_per_byte(flags: list[str], rate: float) -> float:
    """Training FLOPs per byte of an arm at the target rate (the paper's accounting)."""
    from learntok.cli.train import parse_train_args
    from learntok.model.lm import ByteLM

    cfg = parse_train_args(["--preset", "small", *flags])
    pb, pt = ByteLM(cfg.model, cfg.boundary).matrix_params()
    return 6.0 * (pb + pt * rate)


def evaluate(run: Path, data: Path) -> dict:
    """BPB on the validation and test splits, and agreement of the boundaries with the planted ones."""
    from learntok.checkpoint import load_run
    from learntok.data import ByteSequences, load_split
    from learntok.data.planted import PlantedLanguage
    from learntok.evaluation.bpb import BoundaryMode, heldout_bpb
    from learntok.evaluation.stats import BoundaryStats

    cfg, model = load_run(run)
    reference = PlantedLanguage.load(data).boundaries if (data / "planted.json").exists() else _spacebyte
    res = {}
    for split in ("val", "test"):
        _, docs = load_split(cfg.data, split)
        seqs = ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, annotate=model.boundary.annotator)
        refs = {"planted": ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, annotate=reference)}
        stats = BoundaryStats()
        out = heldout_bpb(model, seqs, BoundaryMode(), max_bytes=EVAL_BYTES, references=refs, stats=stats)
        s = stats.result()
        res[split] = {"bpb": out["bpb"], "bpb_se": out["bpb_se"], "rate": s["rate"],
                      **{k: s["agreement"]["planted"][k] for k in ("precision", "recall", "f1", "f1_chance")}}
    return res


def _spacebyte(doc: bytes):
    """SpaceByte's word boundaries of a document (the reference on real text)."""
    import torch

    from learntok.boundaries.whitespace import spacebyte_boundaries
    from learntok.vocab import BOS

    return spacebyte_boundaries(torch.tensor([[BOS, *doc]]))[0, 1:].numpy()


REAL_TEXT = {"entropy_rate": 0.0, "mean_word_bytes": 5.0, "spec": {"separator": True}, "real_text": True}
"""What `run` assumes of a data directory without planted.json: no floor, target rate 0.2, SpaceByte words."""


def cmd_run(args) -> None:
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    planted = data / "planted.json"
    info = json.loads(planted.read_text()) if planted.exists() else REAL_TEXT
    rate = 1.0 / info["mean_word_bytes"]
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {"data": str(data), "planted": info, "arms": []}
    done = {(r["arm"], r["seed"]) for r in results["arms"]}
    budget = args.bytes * flops_per_byte(arm_flags("uniform", rate), rate)  # the FLOPs of args.bytes of uniform
    results["flops_budget"] = budget
    for seed in args.seeds:
        for name in args.arms:
            if (name, seed) in done:
                continue
            if name == "whitespace" and not info["spec"]["separator"]:
                continue  # no spaces to find
            flags = arm_flags(name, rate)
            max_bytes = budget / flops_per_byte(flags, rate)
            run = out / f"{name}-seed{seed}"
            cmd = [sys.executable, "-m", "learntok", "train", "--preset", "small", "--data", str(data), "--out",
                   str(run), "--overwrite", "--progress-style", "lines", "--ckpt-every", "0", "--eval-every", "0",
                   "--seed", str(seed), "--max-bytes", str(int(max_bytes)), *flags]
            t0 = time.time()
            with open(run.with_suffix(".log"), "w") as log:
                subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
            final = [r for r in rows if "val/bpb" in r][-1]
            res = {"arm": name, "seed": seed, "flags": flags, "bytes": final["bytes"], "flops": final["flops"],
                   "train_seconds": final["time"], "wall_seconds": time.time() - t0, **evaluate(run, data)}
            results["arms"].append(res)
            path.write_text(json.dumps(results, indent=1))
            print(f"{name} seed {seed}: test BPB {res['test']['bpb']:.4f} (floor {info['entropy_rate']:.4f}), "
                  f"F1 {res['test']['f1']:.3f}, rate {res['test']['rate']:.3f}, {res['bytes'] / 1e6:.2f} MB",
                  flush=True)
    (out / "results.md").write_text(table(results) + "\n")
    print(table(results))


def _ms(xs: list[float], digits: int = 4) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
"""Two-sided 95 % Student t quantiles by degrees of freedom."""


def paired(results: dict, arm: str, base: str, split: str = "test") -> str:
    """base - arm in BPB, paired by seed: mean, 95 % CI, and the reading (positive: arm better)."""
    by = {(r["arm"], r["seed"]): r[split]["bpb"] for r in results["arms"]}
    d = [by[base, s] - by[arm, s] for (a, s) in by if a == arm and (base, s) in by]
    if len(d) < 2:
        return "—" if not d else f"{d[0]:+.4f} (1 seed)"
    m, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
    lo, hi = m - T95.get(len(d) - 1, 2.0) * se, m + T95.get(len(d) - 1, 2.0) * se
    verdict = "tie" if lo <= 0 <= hi else ("better" if m > 0 else "worse")
    return f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}] {verdict}"


def table(results: dict) -> str:
    floor = results["planted"]["entropy_rate"]
    arms = list(dict.fromkeys(r["arm"] for r in results["arms"]))
    lines = [f"Planted language: entropy rate {floor:.4f} bits/byte, {results['planted']['mean_word_bytes']:.2f} "
             f"bytes per word, separators {results['planted']['spec']['separator']}; equal training FLOPs "
             f"({results.get('flops_budget', 0):.3g} per arm, paper accounting); BPB on 256 KB of each split; "
             "mean ± sd over seeds.", "",
             "| arm | seeds | test BPB − floor | val BPB − floor | F1 planted (test) | rate | MB seen | bytes/s |",
             "|---|---|---|---|---|---|---|---|"]
    for a in arms:
        rs = [r for r in results["arms"] if r["arm"] == a]
        lines.append(f"| {a} | {len(rs)} | {_ms([r['test']['bpb'] - floor for r in rs])} | "
                     f"{_ms([r['val']['bpb'] - floor for r in rs])} | {_ms([r['test']['f1'] for r in rs], 3)} | "
                     f"{_ms([r['test']['rate'] for r in rs], 3)} | {statistics.mean(r['bytes'] for r in rs) / 1e6:.2f}"
                     f" | {statistics.mean(r['bytes'] / r['train_seconds'] for r in rs) / 1e3:.1f} k |")
    lines += ["", "Paired differences on test BPB (baseline − arm, same seed; positive: the arm is better; 95 % CI):",
              "", "| arm | vs uniform-random | vs uniform |", "|---|---|---|"]
    for a in arms:
        if a.startswith("learned") or a in ("hnet", "dynamic"):
            lines.append(f"| {a} | {paired(results, a, 'uniform-random')} | {paired(results, a, 'uniform')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write a planted-language data directory")
    mk.add_argument("--out", required=True)
    mk.add_argument("--separator", action=argparse.BooleanOptionalAction, default=True)
    mk.add_argument("--vocab", type=int, default=512)
    mk.add_argument("--train-mb", type=float, default=20.0)
    mk.add_argument("--seed", type=int, default=0)
    rn = sub.add_parser("run", help="train and evaluate the arms (resumable)")
    rn.add_argument("--data", required=True)
    rn.add_argument("--out", required=True)
    rn.add_argument("--seeds", type=int, nargs="+", default=[0])
    rn.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    rn.add_argument("--bytes", type=float, default=3e6, help="training bytes of the uniform arm (sets the FLOPs)")
    args = ap.parse_args()
    {"make": cmd_make, "run": cmd_run}[args.cmd](args)


if __name__ == "__main__":
    main()
