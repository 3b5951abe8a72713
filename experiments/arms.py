"""Shared machinery of the comparison experiments (experiments/planted, experiments/leaderboard): the arms, their
training at a FLOPs budget, their evaluation on held-out splits, and paired statistics over seeds.

An arm is `learntok train --preset small` plus its flags. Every arm gets the bytes that cost the same training
FLOPs by the paper's accounting (6 x matrix parameters per byte at the byte level, per token at the token level)
at its expected rate; the realised FLOPs are recorded, since a strategy's rate can drift from its target.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from learntok import records
from learntok.evaluation.stats import interval_text, paired_interval
from learntok.viz.curves import load_metrics

ARMS: dict[str, list[str]] = {
    # the learned policy: the small preset (D = 2, gamma 0.9, normalised advantages, detached encoder, w = 0,
    # mean pooling), and variants
    "learned": [],
    "learned-norm": ["--policy-norm"],  # the small preset before the policy-norm re-screen
    "learned-D16": ["--logit-scale", "16"],
    "learned-D16-norm": ["--logit-scale", "16", "--policy-norm"],
    "learned-norm-noee": ["--policy-norm", "--early-loss-to-encoder", "never"],
    "learned-w1": ["--policy-window", "1"],
    "learned-noee": ["--early-loss-to-encoder", "never"],  # rewards from a probe; the encoder gets no L_early
    "learned-vb": ["--value-baseline"],  # a learned state baseline V(X_t) subtracted from G_t (unbiased)
    "learned-w1-vb": ["--policy-window", "1", "--value-baseline"],
    # its FLOPs-matched control: at target 0.2 the w = 1 policy's rate drifts to ~0.213 and overspends uniform's
    # FLOPs by 1.3-2.9 %; a target of 0.188 lands its realised rate near 0.2 (budgeted at 0.2, RATE_FREE)
    "learned-w1-vb-rate188": ["--policy-window", "1", "--value-baseline", "--target-rate", "0.188"],
    # its FLOPs-matched control under the padded convention: trained on a FLOPs schedule until its FLOPs with
    # padded token slots (every row as long as the step's longest) reach uniform's budget (FLOPS_CONVENTION)
    "learned-w1-vb-padded": ["--policy-window", "1", "--value-baseline"],
    # K boundary samples per sequence with a leave-one-out baseline (a batch of 8 rows: 8/K distinct texts)
    "learned-k2": ["--policy-samples", "2"],
    "learned-k4": ["--policy-samples", "4"],
    # fixed and random boundaries (mean pooling, as the small preset)
    "uniform": ["--boundaries", "uniform"],
    "uniform-ee": ["--boundaries", "uniform", "--early-loss-to-encoder", "always"],
    "uniform-random": ["--boundaries", "uniform-random"],
    # heuristics and straight-through baselines
    "whitespace": ["--boundaries", "whitespace"],
    "whitespace-ee": ["--boundaries", "whitespace", "--early-loss-to-encoder", "always"],
    "bpe": ["--boundaries", "bpe"],
    "entropy": ["--boundaries", "entropy"],
    "hnet": ["--boundaries", "hnet"],
    "dynamic": ["--boundaries", "dynamic"],
    # what every tokenizer-free paper compares against, at the U-Net's FLOPs per byte (docs/results.md)
    "flat": ["--boundaries", "flat", "--n-mid", "1", "--token-mlp-mult", "2"],
    "bpe-lm": ["--arch", "token", "--boundaries", "bpe", "--bpe-vocab-size", "4096", "--n-mid", "4"],
    # a second boundary level (--inner-layers; docs/method.md §9): the small preset's three token layers become one
    # inner layer on each side of one mid layer over super-tokens (--inner-rate 0.5: one per two tokens), and the
    # one-level arms beside them; all four matched in total FLOPs (FLOPS_CONVENTION), experiments/hierarchy
    "hier1-learned": [],
    "hier2-learned": ["--inner-layers", "1", "--n-mid", "1"],
    "hier1-uniform": ["--boundaries", "uniform"],
    "hier2-uniform": ["--boundaries", "uniform", "--inner-layers", "1", "--n-mid", "1"],
    # the second level's returns discounted over about 1.4 tokens instead of 10 (--inner-gamma 0.3, the discount of
    # largest second-level SNR at initialisation among 0.9, 0.59, 0.3 and 0, measured on validation text)
    "hier2-learned-g03": ["--inner-layers", "1", "--n-mid", "1", "--inner-gamma", "0.3"],
    # one super-token per four tokens (about 20 bytes) instead of two: where a cut goes may matter more when cuts
    # are fewer, as the first level's 1 in 5 bytes find word starts; with its fixed-groups control
    "hier2-learned-g03-r025": ["--inner-layers", "1", "--n-mid", "1", "--inner-gamma", "0.3", "--inner-rate", "0.25"],
    "hier2-uniform-r025": ["--boundaries", "uniform", "--inner-layers", "1", "--n-mid", "1", "--inner-rate", "0.25"],
    # a curriculum: every token its own super-token for the first half of training (--inner-start 0.5), so the
    # second level's grouping arrives at a model not yet adapted to a coin's; with its fixed-groups control
    "hier2-learned-g03-s50": ["--inner-layers", "1", "--n-mid", "1", "--inner-gamma", "0.3", "--inner-start", "0.5"],
    "hier2-uniform-s50": ["--boundaries", "uniform", "--inner-layers", "1", "--n-mid", "1", "--inner-start", "0.5"],
}
RATE_FREE = {"whitespace": None, "whitespace-ee": None, "flat": 1.0, "bpe-lm": 0.306,
             "learned-w1-vb-rate188": 0.2}
"""Arms whose rate is not --target-rate: None = the text's (whitespace), else the rate to budget FLOPs with
(flat: every byte; bpe-lm: tokens per byte of the 4096-token BPE on enwiki's validation text, measured with
learntok.boundaries.bpe.heldout_rate: 0.306; 8192 tokens give 0.272, 16384 give 0.246; learned-w1-vb-rate188
sets its own lower --target-rate and is budgeted at uniform's 0.2, the rate it is meant to realise)."""
FLOPS_CONVENTION = {"learned-w1-vb-padded": "6n-padded", "hier1-learned": "total", "hier2-learned": "total",
                    "hier1-uniform": "total", "hier2-uniform": "total", "hier2-learned-g03": "total",
                    "hier2-learned-g03-r025": "total", "hier2-uniform-r025": "total", "hier2-learned-g03-s50": "total",
                    "hier2-uniform-s50": "total"}
"""Arms matched in another FLOPs convention than the paper's (learntok.model.flops): they train on a FLOPs
schedule until that convention's count reaches the budget (uniform's FLOPs, the same in every 6N convention:
fixed patches pad nothing), instead of for the bytes their expected rate affords."""
EVAL_BYTES = 262_144
def arm_flags(name: str, rate: float) -> list[str]:
    flags = list(ARMS[name])
    return flags if name in RATE_FREE else [*flags, "--target-rate", f"{rate:.4f}"]


def flops_per_byte(name: str, rate: float) -> float:
    """Expected training FLOPs per byte of an arm (the paper's accounting)."""
    from learntok.cli.train import parse_train_args
    from learntok.model import build_model

    cfg = parse_train_args(["--preset", "small", *arm_flags(name, rate)])
    pb, pt = build_model(cfg.model, cfg.boundary).matrix_params()
    return 6.0 * (pb + pt * (RATE_FREE.get(name) or rate))


def saved_config(argv: list[str]) -> dict:
    """The model and boundary sections of the config `learntok train ARGV` builds, serialised as the trainer writes
    config.json (learntok.config.to_dict; JSON types: tuples as lists)."""
    from learntok.cli.train import parse_train_args
    from learntok.config import to_dict

    saved = to_dict(parse_train_args(argv))
    return json.loads(json.dumps({k: saved[k] for k in ("model", "boundary")}))


def config_differences(run: Path | dict, argv: list[str]) -> list[str]:
    """The model and boundary settings in which RUN's saved config (its config.json, or that config itself, as a
    record keeps it) differs from what `learntok train ARGV` builds, as `section.field: saved -> asked`; empty when
    resuming RUN trains what ARGV asks for (`--resume` restores the saved config whatever other flags say). Fields
    an older run did not save are not compared."""
    saved = run if isinstance(run, dict) else json.loads((run / "config.json").read_text())
    asked = saved_config(argv)
    return [f"{k}.{f}: {saved[k][f]} -> {v}" for k in asked for f, v in asked[k].items()
            if f in saved.get(k, {}) and saved[k][f] != v]


def train_arm(run: Path, data: Path, name: str, *, rate: float, seed: int, max_bytes: float = 0,
              time_budget: float = 0, flops_budget: float = 0, flops_convention: str = "6n", eval_every: int = 0,
              ckpt_every: int = 500, flags: list[str] | None = None) -> dict:
    """Train one arm in a fresh process (log in RUN.log) for `max_bytes` bytes, for `time_budget` seconds on a
    time schedule, or until `flops_budget` training FLOPs (in `flops_convention`: the paper's 6N by default) on a
    FLOPs schedule; an interrupted arm
    (a checkpoint in RUN) is resumed exactly, and refused (ValueError) when its saved model differs from the one
    asked for. `flags` replace the arm's own (ARMS[name] at `rate`). Returns its final
    metrics, its validation curve (bytes, FLOPs, seconds, val BPB), the training command and the run's config and
    provenance."""
    common = ["--progress-style", "lines", "--ckpt-every", str(ckpt_every), "--eval-every", str(eval_every)]
    if time_budget:
        budget = ["--schedule", "time", "--time-budget", str(time_budget), "--max-bytes", "0"]  # no preset cap
    elif flops_budget:
        budget = ["--schedule", "flops", "--flops-budget", f"{flops_budget:.6g}", "--flops-convention",
                  flops_convention, "--max-bytes", "0"]
    else:
        budget = ["--max-bytes", str(int(max_bytes))]
    fresh = ["train", "--preset", "small", "--data", str(data), "--out", str(run), "--overwrite", "--seed", str(seed),
             *budget, *common, *(arm_flags(name, rate) if flags is None else flags)]
    resume = (run / "latest").exists()
    if resume and (run / "config.json").exists() and (diff := config_differences(run, fresh[1:])):
        raise ValueError(f"{run} is an interrupted run of another model ({'; '.join(diff)}): resuming it would train "
                         "that one; move it aside or use another --out")
    args = ["train", "--resume", str(run), *common] if resume else fresh
    t0 = time.time()
    run.parent.mkdir(parents=True, exist_ok=True)  # a fresh --out: the log lives beside the run
    with open(run.parent / f"{run.name}.log", "a") as log:  # not with_suffix: "2.4e+07" has a dot
        subprocess.run([sys.executable, "-m", "learntok", *args], check=True, stdout=log, stderr=subprocess.STDOUT)
    metrics = load_metrics(run)
    evals = metrics.evals
    final = evals[-1]
    config, prov = records.run_provenance(run)
    more = {k: final[k] for k in ("flops_padded", "flops_total") if k in final}  # learntok.model.flops
    return {"bytes": final["bytes"], "flops": final["flops"], **more, "train_seconds": final["time"],
            "wall_seconds": time.time() - t0, "command": "learntok " + " ".join(fresh), "config": config,
            "provenance": prov, "curve": [[r["bytes"], r["flops"], r["time"], r["val/bpb"]] for r in evals],
            "train_last": last_window(metrics.train)}


def last_window(train: list[dict]) -> dict:
    """The last training log window's loss and boundary figures (loss/..., boundary/..., reinforce/...): what the
    estimator's terms ended at, kept in the record beside the held-out scores."""
    last = train[-1] if train else {}
    return {k: v for k, v in last.items() if k.split("/")[0] in ("loss", "boundary", "reinforce")}


def evaluate_arm(run: Path, reference) -> dict:
    """Bits per byte on the first EVAL_BYTES of the validation and test splits (one boundary sample, the
    paper's protocol) and agreement of the boundaries with `reference` (a document -> flags function)."""
    from learntok.checkpoint import load_run
    from learntok.data import ByteSequences, load_split
    from learntok.evaluation.bpb import BoundaryMode, heldout_bpb
    from learntok.evaluation.stats import BoundaryStats

    cfg, model = load_run(run)
    res = {}
    for split in ("val", "test"):
        _, docs = load_split(cfg.data, split)
        seqs = ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, annotate=model.boundary.annotator)
        refs = {"ref": ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, annotate=reference)}
        stats = BoundaryStats()
        out = heldout_bpb(model, seqs, BoundaryMode(), max_bytes=EVAL_BYTES, references=refs, stats=stats)
        s = stats.result()
        res[split] = {"bpb": out["bpb"], "bpb_se": out["bpb_se"], "rate": s["rate"],
                      **{k: s["agreement"]["ref"][k]
                         for k in ("precision", "recall", "f1", "f1_chance", "f1_by_shift", "best_shift")}}
    return res


def spacebyte(doc: bytes):
    """SpaceByte's word boundaries of a document (the reference on real text)."""
    import torch

    from learntok.boundaries.whitespace import spacebyte_boundaries
    from learntok.vocab import BOS

    return spacebyte_boundaries(torch.tensor([[BOS, *doc]]))[0, 1:].numpy()


def budget_key(row: dict, results: dict) -> tuple[str, float]:
    """(match, budget) of a result row: ("flops", training FLOPs) or ("time", seconds). Rows written before the
    time view existed carry only a FLOPs budget, some only at the top level of results.json."""
    if row.get("match") == "time":
        return "time", row["time_budget"]
    return "flops", row.get("flops_budget", results.get("flops_budget"))


def load_results(path: Path, data: Path | None = None) -> dict:
    """{"data", "arms"} of a records file (learntok.records): every record, checked to be on `data` if given."""
    rows = records.load(path)
    names = {Path(r["data"]).name for r in rows if "data" in r}
    if data is not None and names - {Path(data).name}:
        raise ValueError(f"{path} holds results on {', '.join(sorted(names))}, not {data}: give another --results "
                         "file")
    return {"data": str(data if data is not None else next(iter(names), "")), "arms": rows}


def run_arms(out: Path, data: Path, arms: list[str], seeds: list[int], *, study: str, rate: float,
             budget_bytes: float = 0, time_budget: float = 0, reference, eval_every: int = 0, skip=lambda name: False,
             run_name=None, results_path: Path | None = None, extra: dict | None = None) -> dict:
    """Train and evaluate every (arm, seed) not yet in `results_path` (OUT/records.jsonl by default), one at a
    time, and return the results. Each finished arm is one record (learntok.records: command, config, provenance,
    metrics, curve; `extra` adds fields such as the planted floors) appended at once, so an interrupted study keeps
    what finished. Run directories (checkpoints) go under OUT; the records file is small, so a study keeps it in
    version control while its run directories come and go. Budget: the training FLOPs of `budget_bytes` of
    `uniform` (each arm gets the bytes that cost as much), or, with `time_budget`, that many seconds of training on
    a time schedule (the matched-time view)."""
    out.mkdir(parents=True, exist_ok=True)
    path = Path(results_path) if results_path else out / "records.jsonl"
    results = load_results(path, data)
    if time_budget:
        key, tag = ("time", float(time_budget)), f"{time_budget:g}s"
    else:
        key, tag = ("flops", budget_bytes * flops_per_byte("uniform", rate)), f"{budget_bytes:g}"
    done = {(r["arm"], r["seed"], budget_key(r, results)) for r in results["arms"]}
    for seed in seeds:
        for name in arms:
            if (name, seed, key) in done or skip(name):
                continue
            run = out / (run_name(name, seed) if run_name else f"{name}-{tag}-seed{seed}")
            if key[0] == "time":
                res = train_arm(run, data, name, rate=rate, seed=seed, time_budget=time_budget, eval_every=eval_every)
                budget = {"match": "time", "time_budget": float(time_budget)}
            elif name in FLOPS_CONVENTION:
                res = train_arm(run, data, name, rate=rate, seed=seed, eval_every=eval_every, flops_budget=key[1],
                                flops_convention=FLOPS_CONVENTION[name])
                budget = {"match": "flops", "flops_budget": key[1], "budget_bytes": budget_bytes,
                          "flops_convention": FLOPS_CONVENTION[name]}
            else:
                res = train_arm(run, data, name, rate=rate, seed=seed, eval_every=eval_every,
                                max_bytes=key[1] / flops_per_byte(name, rate))
                budget = {"match": "flops", "flops_budget": key[1], "budget_bytes": budget_bytes}
            command, prov = res.pop("command"), res.pop("provenance")
            rec = records.make(study, name, seed, command=command, prov=prov, data=str(data),
                               flags=arm_flags(name, rate), **budget, **res, **evaluate_arm(run, reference),
                               **(extra or {}))
            records.append(path, rec)
            results["arms"].append(rec)
            print(f"{name} seed {seed}: test BPB {rec['test']['bpb']:.4f}, F1 {rec['test']['f1']:.3f}, rate "
                  f"{rec['test']['rate']:.3f}, {rec['bytes'] / 1e6:.2f} MB, {rec['flops']:.3g} FLOPs, "
                  f"{rec['train_seconds']:.0f} s", flush=True)
    return results


def mean_se(xs: list[float], digits: int = 4) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs) / math.sqrt(len(xs)):.{digits}f}"


def paired(rows: list[dict], arm: str, base: str, split: str = "test") -> str:
    """base - arm in BPB, paired by seed at the same budget: mean, 95 % CI, and the reading, which names the
    better of the two ("tie" when the interval covers 0)."""
    by = {(r["arm"], r["seed"]): r[split]["bpb"] for r in rows}
    d = [by[base, s] - by[arm, s] for (a, s) in by if a == arm and (base, s) in by]
    if len(d) < 2:
        return "—" if not d else f"{d[0]:+.4f} (1 seed)"
    p = paired_interval(d)
    verdict = "tie" if p["tie"] else f"{arm if p['mean'] > 0 else base} better"
    return f"{interval_text(p)} {verdict} ({len(d)} seeds)"


def _shifted(rows: list[dict]) -> str:
    """' (+1: F1)' when the arms' boundaries agree best with the reference at a shift (one byte early: +1)."""
    shifts = [r["test"].get("best_shift", 0) for r in rows]
    k = max(set(shifts), key=shifts.count)
    if k == 0:
        return ""
    return f" ({k:+d}: {statistics.mean(r['test']['f1_by_shift'][str(k)] for r in rows):.3f})"


def _speed(rs: list[dict]) -> str:
    """' seconds | kB/s |' cells: mean training seconds and bytes per second over the rows."""
    return (f" {statistics.mean(r['train_seconds'] for r in rs):.0f} | "
            f"{statistics.mean(r['bytes'] / r['train_seconds'] for r in rs) / 1e3:.1f} |")


def table(results: dict, floor: dict | None = None, *, bases: tuple[str, ...] = ("uniform-random", "uniform"),
          reference_name: str = "SpaceByte", against: str | None = None, speed: bool = True) -> str:
    """Per budget: the arms' BPB on test and validation (minus `floor`: split -> bits per byte), F1 against the
    reference, rate, bytes, FLOPs, speed (mean ± standard error over seeds), then paired test-BPB differences:
    base − arm for each of `bases` (positive: the arm is better), and arm − `against` (positive: `against` is
    better). `speed=False` leaves out the seconds and bytes per second (for runs that shared the machine)."""
    lines = []
    groups: dict = {}
    for r in results["arms"]:
        if r.get("source") != "transcribed":  # numbers only: no bytes, FLOPs or curves to tabulate
            groups.setdefault(budget_key(r, results), []).append(r)
    for (match, budget), rows in sorted(groups.items()):
        arms = list(dict.fromkeys(r["arm"] for r in rows))
        sub = "− floor " if floor else ""
        low = floor or {"test": 0.0, "val": 0.0}
        if match == "time":
            head = f"Matched time: {budget:g} s of training per arm (time schedule)"
        else:
            of = rows[0].get("budget_bytes")
            head = f"Matched FLOPs: {budget:.3g} training FLOPs per arm"
            head += f" ({of:.2g} bytes of uniform)" if of else ""
        lines += [f"{head}; mean ± standard error over seeds. F1 (k: F1'): the boundaries agree best with the "
                  "reference shifted by k bytes (k = +1: they sit one byte before the reference's), with F1' there.",
                  "", f"| arm | seeds | test BPB {sub}| val BPB {sub}| F1 vs {reference_name} | rate | MB | GFLOPs |"
                  + (" train s | kB/s |" if speed else ""), "|---|---|---|---|---|---|---|---|" + ("---|---|" * speed)]
        for a in arms:
            rs = [r for r in rows if r["arm"] == a]
            lines.append(f"| {a} | {len(rs)} | {mean_se([r['test']['bpb'] - low['test'] for r in rs])} | "
                         f"{mean_se([r['val']['bpb'] - low['val'] for r in rs])} | "
                         f"{mean_se([r['test']['f1'] for r in rs], 3)}{_shifted(rs)} | "
                         f"{mean_se([r['test']['rate'] for r in rs], 3)} | "
                         f"{statistics.mean(r['bytes'] for r in rs) / 1e6:.2f} | "
                         f"{statistics.mean(r['flops'] for r in rs) / 1e9:.1f} |" + (_speed(rs) if speed else ""))
        cols = [f"{b} − arm" for b in bases] + ([f"arm − {against}"] if against else [])
        lines += ["", "Paired differences in test BPB (same seed; positive: the arm named first in the column is "
                  "worse; 95 % CI; tie when it covers 0):", "", "| arm | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for a in arms:
            cells = ["" if a == b else paired(rows, a, b) for b in bases]
            if against:
                cells.append("" if a == against else paired(rows, against, a))
            if any(cells):
                lines.append(f"| {a} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
