"""Character-level robustness of learned boundaries against fixed patches and a BPE transformer
(docs/results.md, "Character-level robustness").

    python experiments/robustness/run.py run --data ../shared/data/text/enwiki [--threads 1]
    python experiments/robustness/run.py table

Arms, one seed each, at the training FLOPs of 2.4e7 bytes of `uniform` (the headline budget): `uniform` and
`bpe-lm` trained here (experiments/arms.py, resumable), and the learned model shipped in the package
(`enwiki-small`: the `learned-w1-vb` arm at 2.4e7 bytes, whose rate drift spends 1-3 % more FLOPs). Each is
evaluated with `learntok eval RUN --tasks none --split test --robustness` (seven CUTE-style tasks of 200 examples
from test-split words, and test-split BPB under 1-10 % byte edits: learntok.evaluation.robustness). One record per
arm in experiments/robustness/records.jsonl. One seed: the intervals are standard errors over examples, not over
training seeds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import arms  # noqa: E402

from learntok import records  # noqa: E402

RECORDS = Path(__file__).with_name("records.jsonl")
BUDGET = 2.4e7
RATE = 0.2
EVAL = ["--tasks", "none", "--split", "test", "--robustness", "--no-progress"]


def evaluate(run: str, out: Path, data: Path) -> dict:
    extra = ["--data", str(data / "test.jsonl.xz")] if not Path(run).exists() else []
    subprocess.run([sys.executable, "-m", "learntok", "eval", run, *EVAL, *extra, "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    rep = json.loads(out.read_text())
    return {"robustness": rep["robustness"], "heldout": {k: rep["heldout"][k] for k in ("bpb", "bpb_se", "bytes")},
            "eval_command": f"learntok eval {run} {' '.join(EVAL + extra)}"}


ARMS = ("uniform", "bpe-lm", "enwiki-small")


def run(data: Path, out: Path, arms_to_run=ARMS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    have = {r["arm"] for r in records.load(RECORDS)} if RECORDS.exists() else set()
    for name in ("uniform", "bpe-lm"):
        if name in have or name not in arms_to_run:
            continue
        rundir = out / f"{name}-seed0"
        fpb = arms.flops_per_byte(name, arms.RATE_FREE.get(name) or RATE)
        res = arms.train_arm(rundir, data, name, rate=RATE, seed=0,
                             max_bytes=BUDGET * arms.flops_per_byte("uniform", RATE) / fpb)
        command, prov = res.pop("command"), res.pop("provenance")
        res.pop("curve")
        ev = evaluate(str(rundir), out / f"{name}-eval.json", data)
        rec = records.make("robustness", name, 0, command=command, prov=prov, flags=arms.arm_flags(name, RATE),
                           budget_bytes=BUDGET, **res, **ev)
        records.append(RECORDS, rec)
        print(f"{name}: test BPB {ev['heldout']['bpb']:.4f}", flush=True)
    if "enwiki-small" not in have and "enwiki-small" in arms_to_run:
        from learntok.pretrained import bundled, read_config

        path = bundled("enwiki-small")
        res = evaluate("enwiki-small", out / "enwiki-small-eval.json", data)
        rec = records.make("robustness", "enwiki-small", 0, command="(the bundled model: experiments/bundled/run.py)",
                           prov=records.provenance(), bundled=str(path.name),
                           config={"boundary": read_config(path)[1].__dict__}, **res)
        records.append(RECORDS, rec)
        print(f"enwiki-small: test BPB {res['heldout']['bpb']:.4f}", flush=True)


def rescore(data: Path, out: Path, arms_to_run) -> None:
    """Evaluate recorded arms again with the current evaluation code (their run directories or the bundled
    model), replacing each record's evaluation fields; the record keeps its training provenance and gains the
    evaluation's (eval_provenance)."""
    recs = records.load(RECORDS)
    prov = records.provenance()  # before the first rewrite of the records file (which dirties the tree)
    for rec in recs:
        if rec["arm"] not in arms_to_run:
            continue
        run_ref = "enwiki-small" if rec["arm"] == "enwiki-small" else str(out / f"{rec['arm']}-seed0")
        rec.update(evaluate(run_ref, out / f"{rec['arm']}-eval.json", data), eval_provenance=prov)
        records.write(RECORDS, recs)
        print(f"{rec['arm']}: test BPB {rec['heldout']['bpb']:.4f} (rescored)", flush=True)


def table(path: Path = RECORDS) -> str:
    """Per task: gold-answer BPB and accuracy of each arm, and the learned model's paired differences (same
    examples) with 95 % t-intervals; then BPB under byte noise (markdown)."""
    from learntok.evaluation.stats import interval_text, paired_interval

    recs = {r["arm"]: r for r in records.load(path)}
    names = [n for n in ("enwiki-small", "uniform", "bpe-lm") if n in recs]
    label = {"enwiki-small": "learned (enwiki-small)", "uniform": "uniform (5-byte patches)",
             "bpe-lm": "BPE transformer"}
    others = [n for n in names if n != "enwiki-small"]
    tasks = list(next(iter(recs.values()))["robustness"]["cute"])

    def diff(task: str, other: str, key: str) -> str:
        a = recs["enwiki-small"]["robustness"]["cute"][task]["values"][key]
        b = recs[other]["robustness"]["cute"][task]["values"][key]
        p = paired_interval([x - y for x, y in zip(a, b)])
        return interval_text(p, 3, tie=True)

    lines = ["| task (chance) | " + " | ".join(f"{label[n]}: gold BPB; accuracy" for n in names) + " | "
             + " | ".join(f"learned − {label[n]}: gold BPB; accuracy" for n in others) + " |",
             "|---|" + "---|" * (len(names) + len(others))]
    for t in tasks:
        cells = []
        for n in names:
            c = recs[n]["robustness"]["cute"][t]
            cells.append(f"{c['bpb']:.3f} ± {c['bpb_se']:.3f}; {c['acc']:.2f} ± {c['acc_se']:.2f}")
        cells += [f"{diff(t, n, 'bpb')}; {diff(t, n, 'acc')}" for n in others]
        chance = recs[names[0]]["robustness"]["cute"][t]["chance"]
        lines.append(f"| {t} ({chance:.2f}) | " + " | ".join(cells) + " |")
    n_ex = recs[names[0]]["robustness"]["cute"][tasks[0]]["n"]
    lines += ["", f"{n_ex} examples per task, the same for every arm (words of the test split); intervals are over "
              "examples (paired), from one training seed per arm.", ""]
    noise = recs[names[0]]["robustness"]["noise"]
    lines += ["| text | " + " | ".join(label[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    lines.append("| test split, whole (BPB ± s.e.) | " + " | ".join(
        f"{recs[n]['heldout']['bpb']:.4f} ± {recs[n]['heldout']['bpb_se']:.4f}" for n in names) + " |")
    lines.append(f"| first {noise['bytes']:,} test bytes, clean | " + " | ".join(
        f"{recs[n]['robustness']['noise']['clean_bpb']:.4f}" for n in names) + " |")
    for k in noise["rates"]:
        lines.append(f"| the same with {float(k):.0%} byte edits (increase) | " + " | ".join(
            f"{recs[n]['robustness']['noise']['rates'][k]['bpb']:.4f} "
            f"({recs[n]['robustness']['noise']['rates'][k]['delta']:+.4f})" for n in names) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", type=Path, default=Path("../shared/data/text/enwiki"))
    r.add_argument("--out", type=Path, default=Path("runs/robustness"))
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    rs = sub.add_parser("rescore", help="evaluate recorded arms again with the current code")
    rs.add_argument("--data", type=Path, default=Path("../shared/data/text/enwiki"))
    rs.add_argument("--out", type=Path, default=Path("runs/robustness"))
    rs.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    sub.add_parser("table")
    args = ap.parse_args()
    if args.cmd == "rescore":
        return rescore(args.data, args.out, args.arms)
    if args.cmd == "table":
        return print(table())
    if args.threads:
        import os

        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the training and evaluation subprocesses
    run(args.data, args.out, args.arms)


if __name__ == "__main__":
    main()
