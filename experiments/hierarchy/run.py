"""Does a second boundary level help? One level against two (--inner-layers 1; docs/method.md §9) at matched
total FLOPs, learned and fixed boundaries; the reading is docs/results.md §9.

    python experiments/hierarchy/run.py run --data DATA/enwiki --out runs/hierarchy --bytes 6e6 --seeds 0 1 2
    python experiments/hierarchy/run.py report                     # the paired table from the records
    python experiments/hierarchy/run.py variance --out runs/hierarchy  # each level's policy-gradient SNR
    python experiments/hierarchy/run.py variance --out runs/hierarchy --levels 2 --gammas 0.59 0.3 0
    python experiments/hierarchy/run.py sensitivity --out runs/hierarchy  # the loss's spread over each level's draws

The arms (experiments/arms.py) are the `small` preset at target rate 0.2: `hier1-learned` / `hier1-uniform` with its
three token layers, `hier2-learned` / `hier2-uniform` with one inner layer on each side of one mid layer over
super-tokens (--inner-rate 0.5); `hier2-learned-g03` with the second level's own discount 0.3 per token; and at
--inner-rate 0.25 `hier2-learned-g03-r025` / `hier2-uniform-r025`; and with a curriculum, every token its own
super-token for the first half of training (--inner-start 0.5), `hier2-learned-g03-s50` / `hier2-uniform-s50` (their
`init` state in `variance` and `sensitivity` is `hier2-learned-g03`'s: the flag does not change the model built).
Each trains on a FLOPs schedule until its total
FLOPs (attention counted, learntok.model.flops) reach the 6N FLOPs of --bytes bytes of `uniform`, so a two-level
model, cheaper per byte, sees more bytes. Scored on the first 256 KB of the validation and test splits, one boundary
sample; choose on validation, read test. Records (command, config, SHA, machine, metrics) go to
experiments/hierarchy/records.jsonl as each arm finishes; an interrupted arm resumes from its checkpoint, a finished
one is skipped. One training at a time: run nothing else on the machine meanwhile only if you read its seconds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import arms  # noqa: E402  (experiments/arms.py)

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records.jsonl"
SENSITIVITY = HERE / "records-sensitivity.jsonl"
"""How much the loss depends on each level's draw (`sensitivity`), one record per (arm, seed, state)."""
VARIANCE = HERE / "records-variance.jsonl"
"""The two-level learned runs' policy gradients at each level (`variance`), one record per (seed, level, state)."""
ARMS = ["hier1-learned", "hier2-learned", "hier1-uniform", "hier2-uniform", "hier2-learned-g03",
        "hier2-learned-g03-r025", "hier2-uniform-r025", "hier2-learned-g03-s50", "hier2-uniform-s50"]
LEARNED2 = ["hier2-learned", "hier2-learned-g03", "hier2-learned-g03-r025", "hier2-learned-g03-s50"]
"""The two-level arms whose second level learns by the score function (`variance` measures them)."""
PAIRS = [("hier2-learned", "hier1-learned"), ("hier2-uniform", "hier1-uniform"), ("hier2-learned", "hier2-uniform"),
         ("hier2-learned-g03", "hier2-learned"), ("hier2-learned-g03", "hier1-learned"),
         ("hier2-learned-g03", "hier2-uniform"), ("hier2-learned-g03-r025", "hier2-uniform-r025"),
         ("hier2-learned-g03-r025", "hier1-learned"), ("hier2-uniform-r025", "hier1-uniform"),
         ("hier2-learned-g03-s50", "hier2-uniform-s50"), ("hier2-learned-g03-s50", "hier2-learned-g03"),
         ("hier2-learned-g03-s50", "hier1-learned"), ("hier2-uniform-s50", "hier2-uniform"),
         ("hier1-learned", "hier1-uniform")]
"""(arm, base): base − arm in test BPB, paired by seed (positive: arm better)."""
RATE = 0.2


def cmd_run(args) -> None:
    arms.run_arms(Path(args.out), Path(args.data), args.arms, args.seeds, study="hierarchy", rate=RATE,
                  budget_bytes=args.bytes, reference=arms.spacebyte, results_path=Path(args.results))
    cmd_report(args)


def _run_dir(out: str, r: dict) -> Path:
    """A record's run directory under `out` (the name it trained under, wherever OUT was then)."""
    return Path(out) / Path(r["command"].split(" --out ")[1].split()[0]).name


def _measured(run: Path, batch_size: int):
    """What `variance` and `sensitivity` measure a seed's run on: its config, its trained model and the same
    model at initialisation (the run's seed), and the first `batch_size` validation sequences (B, T+1)."""
    import torch

    from learntok.checkpoint import load_run
    from learntok.data import ByteSequences, load_split
    from learntok.model import build_model

    cfg, trained = load_run(run)
    torch.manual_seed(cfg.seed)
    models = {"trained": trained, "init": build_model(cfg.model, cfg.boundary)}
    _, docs = load_split(cfg.data, "val")
    batch = torch.from_numpy(ByteSequences(docs, cfg.data.seq_len, cfg.data.pack).batch(range(batch_size)))
    return cfg, models, batch


def cmd_backfill(args) -> None:
    """Add `train_last` (arms.last_window) to records written before train_arm kept it, from their run
    directories under OUT; records whose run directory is gone stay as they are."""
    from learntok import records
    from learntok.viz.curves import load_metrics

    path = Path(args.results)
    rows = records.load(path)
    for r in rows:
        run = _run_dir(args.out, r)
        if "train_last" not in r and (run / "metrics.jsonl").exists():
            r["train_last"] = arms.last_window(load_metrics(run).train)
    records.write(path, rows)


def cmd_variance(args) -> None:
    """Why does the second level's policy not learn? On each trained run of --arms (and its initialisation),
    the policy gradient's variance and SNR at both levels (learntok.evaluation.variance, the run's estimator
    among the others), on the first --batch-size validation sequences; a record per (seed, level, state)."""
    import torch

    from learntok import records
    from learntok.evaluation.variance import discount_key, policy_gradient_variance

    torch.set_num_threads(args.threads)
    asked = (args.batch_size, args.samples, args.samples * args.reference_factor,
             tuple(sorted({discount_key(g) for g in args.gammas})))  # as the record's info lists them
    done = {(r["seed"], r["arm"]) for r in records.load(args.variance) if _settings(r) == asked}
    for r in arms.load_results(Path(args.results))["arms"]:
        if r["arm"] not in args.arms or r["seed"] not in args.seeds:
            continue
        todo = [(state, level) for state in ("trained", "init") for level in args.levels
                if (r["seed"], f"{r['arm']}/level{level}/{state}") not in done]
        if not todo:
            continue
        run = _run_dir(args.out, r)
        cfg, models, batch = _measured(run, args.batch_size)  # once per seed; each measurement copies its model
        b = cfg.boundary
        estimator = ("value" if getattr(b, "value_baseline", False) else "normalised"
                     if getattr(b, "normalize_advantage", False) else "centred")
        command = ["python", "experiments/hierarchy/run.py", "variance", "--out", args.out, "--arms", r["arm"],
                   "--seeds", r["seed"],
                   "--levels", *args.levels,
                   "--samples", args.samples, "--batch-size", args.batch_size, "--reference-factor",
                   args.reference_factor, *(["--gammas", *args.gammas] if args.gammas else [])]
        for state, level in todo:
            arm = f"{r['arm']}/level{level}/{state}"
            t0 = time.perf_counter()
            rows, info = policy_gradient_variance(copy.deepcopy(models[state]), batch, samples=args.samples,
                                                  level=level, reference_factor=args.reference_factor, seed=0,
                                                  gammas=tuple(args.gammas))
            print(f"{arm} seed {r['seed']}: {time.perf_counter() - t0:.0f} s", flush=True)
            records.append(args.variance, records.make(
                "hierarchy", arm, r["seed"], command=command, run=str(run), level=level, state=state,
                estimator=estimator, variance={**info, "rows": [dataclasses.asdict(x) for x in rows]}))

def cmd_sensitivity(args) -> None:
    """Does the trained model still use the second level's grouping? On each run of --arms (trained and at
    initialisation), how much the loss moves between draws of the second level with the first level's draw held,
    against how much it moves between draws of the first level: F first-level draws of --batch-size validation
    sequences, K second-level draws under each (`loss_spread`: the first level's boundaries given), the model in
    training mode as the estimator sees it. A record per (arm, seed, state) in --sensitivity."""
    import torch

    from learntok import records

    torch.set_num_threads(args.threads)
    F, K = args.first, args.second
    done = {(r["seed"], r["arm"]) for r in records.load(args.sensitivity)  # measured with these settings
            if (r["draws"], r["batch"]) == ([F, K], args.batch_size)}
    for r in arms.load_results(Path(args.results))["arms"]:
        if r["arm"] not in args.arms or r["seed"] not in args.seeds:
            continue
        todo = [s for s in ("trained", "init") if (r["seed"], f"{r['arm']}/sensitivity/{s}") not in done]
        if not todo:
            continue
        run = _run_dir(args.out, r)
        _, models, batch = _measured(run, args.batch_size)
        ids, targets = batch[:, :-1], batch[:, 1:]
        for state in todo:
            fields = {"draws": [F, K], "batch": args.batch_size, **loss_spread(models[state], ids, targets, F, K)}
            command = ["python", "experiments/hierarchy/run.py", "sensitivity", "--out", args.out, "--arms", r["arm"],
                       "--seeds", r["seed"], "--first", F, "--second", K, "--batch-size", args.batch_size]
            records.append(args.sensitivity, records.make("hierarchy", f"{r['arm']}/sensitivity/{state}", r["seed"],
                                                          command=command, run=str(run), state=state, **fields))
            print(f"{r['arm']} seed {r['seed']} {state}: {fields}", flush=True)


def loss_spread(model, ids, targets, first: int, second: int) -> dict:
    """The loss's spread over a two-level model's draws on one batch: `first` first-level draws, `second`
    second-level draws under each (the first level's boundaries given, so held exactly: `first_level_flips`
    counts any that moved), in training mode as the estimator sees it. Per byte and per sequence: the SD over
    second-level draws given the first, and over first-level draws (of the mean over second-level ones, less that
    mean's own share of the second-level variance)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    nll = torch.empty(first, second, *ids.shape)
    flips = 0
    was = model.training
    model.train()
    with torch.no_grad():
        for f in range(first):
            held = None
            for k in range(second):
                # the first level drawn once per f and then given (`boundaries`), so only the second level draws
                out = model(ids, targets, noise=torch.rand(ids.shape, generator=gen), boundaries=held)
                held = out.boundaries.mask if held is None else held
                flips += int((out.boundaries.mask != held).sum())
                nll[f, k] = out.nll.float()
    model.train(was)

    def spread(x):  # x (F,K,...) -> (SD over second-level draws, SD over first-level draws)
        within = x.var(1).mean()
        return float(within.sqrt()), float((x.mean(1).var(0).mean() - within / second).clamp(min=0).sqrt())

    (b2, b1), (r2, r1) = spread(nll), spread(nll.mean(-1))
    return {"loss": float(nll.mean()), "byte_sd_second": b2, "byte_sd_first": b1, "row_sd_second": r2,
            "row_sd_first": r1, "first_level_flips": flips}


def sensitivity_table(path: Path) -> str:
    """The loss's dependence on each level's draw, per arm and state (mean over seeds, and per seed)."""
    from learntok import records

    rows = records.load(path)
    if not rows:
        return ""
    lines = ["| arm | state | seeds | loss, nats per byte | SD per byte over second-level draws, mean (per seed) | "
             "over first-level draws | second / first | SD of a sequence's loss over second-level draws |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"].split("/")[0] for r in rows):
        for state in ("init", "trained"):
            rs = sorted((r for r in rows if r["arm"] == f"{arm}/sensitivity/{state}"), key=lambda r: r["seed"])
            if not rs:
                continue
            mean = {k: sum(r[k] for r in rs) / len(rs) for k in ("loss", "byte_sd_second", "byte_sd_first",
                                                                  "row_sd_second")}
            second = ", ".join(f"{r['byte_sd_second']:.4f}" for r in rs)
            lines.append(f"| {arm} | {state} | {len(rs)} | {mean['loss']:.3f} | {mean['byte_sd_second']:.4f} "
                         f"({second}) | {mean['byte_sd_first']:.4f} | "
                         f"{mean['byte_sd_second'] / max(mean['byte_sd_first'], 1e-12):.2f} | "
                         f"{mean['row_sd_second']:.4f} |")
    return "\n".join(lines) + "\n"


def _settings(r: dict) -> tuple:
    """A variance record's measurement settings: (batch, samples, reference draws, extra discounts). A measurement
    under other settings is a different measurement, so `variance` runs it and the table lists it apart."""
    v = r["variance"]
    return v["batch"], v["samples"], v["reference_samples"], tuple(v.get("gammas", ()))


FLOOR = 0.01
"""SNRs at or below this are not told from zero in 64 draws: estimators with no signal read -0.01 to 0.01 there."""


def variance_table(path: Path = VARIANCE) -> str:
    """The policy gradient's SNR at each level (mean over seeds, and per seed), a table per measurement setting:
    under the default one, the run's estimator and the batch-centred one with gamma 1, and per seed the batches
    whose mean gradient reaches SNR 1 (1 / SNR, "–" within the floor); where other discounts were measured, the
    batch-centred estimator at each of them."""
    from learntok import records

    groups = {}
    for r in records.load(path):
        groups.setdefault(_settings(r), []).append(r)
    tables = []
    for (batch, samples, reference, gammas), rows in groups.items():
        more = f", discounts {', '.join(f'{g:g}' for g in gammas)} added" if gammas else ""
        heading = "" if len(groups) == 1 else (
            f"{samples} draws per estimator, {reference} reference draws, batches of {batch}{more}:\n\n")
        tables.append(heading + (_discount_rows(rows) if gammas else _variance_rows(rows, batch)))
    return "\n".join(tables)


def _cells(rows: list[dict]):
    """(arm, level, state, that cell's records by seed) in a fixed order; arm is the trained run's arm."""
    for arm in dict.fromkeys(r["arm"].split("/")[0] for r in rows):
        for level in (1, 2):
            for state in ("init", "trained"):
                rs = sorted((r for r in rows if r["arm"] == f"{arm}/level{level}/{state}"), key=lambda r: r["seed"])
                if rs:
                    yield arm, level, state, rs


def _stat(r: dict, name: str, key: str = "snr") -> float:
    return next(x[key] for x in r["variance"]["rows"] if x["group"] == "policy" and x["name"] == name)


def _discount_rows(rows: list[dict]) -> str:
    """For records that measured other discounts: the batch-centred estimator's SNR and its mean's cosine to the
    reference (centred, γ = 1, many draws) at each discount, the run's and 1 included (γ per token at level 2)."""
    lines = ["| arm | level | state | seeds | γ | SNR, centred, mean (per seed) | cosine to the reference, mean |",
             "|---|---|---|---|---|---|---|"]
    for arm, level, state, rs in _cells(rows):
        run = rs[0]["variance"]["gamma"]
        for g in sorted({1.0, run, *rs[0]["variance"]["gammas"]}, reverse=True):
            name = "centred" if g == run else f"centred, gamma={g:g}"
            snr = [_stat(r, name) for r in rs]
            cos = sum(_stat(r, name, "cosine") for r in rs) / len(rs)
            tag = " (the run's)" if g == run else ""
            lines.append(f"| {arm} | {level} | {state} | {len(rs)} | {g:g}{tag} | {sum(snr) / len(snr):.4f} "
                         f"({', '.join(f'{x:.4f}' for x in snr)}) | {cos:.2f} |")
    return "\n".join(lines) + "\n"


def _variance_rows(rows: list[dict], batch: int) -> str:
    """variance_table's table for records of the default setting."""
    lines = ["| arm | level | state | seeds | SNR, run's estimator, mean (per seed) | "
             f"batches of {batch} for SNR 1, per seed | "
             f"seeds within the floor (≤ {FLOOR}) | SNR, centred, γ = 1 | policy parameters |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, level, state, rs in _cells(rows):
        run = [_stat(r, r.get("estimator", "normalised")) for r in rs]
        flat = sum(x <= FLOOR for x in run)
        need = ", ".join(f"{1 / x:.0f}" if x > FLOOR else "–" for x in run)
        lines.append(f"| {arm} | {level} | {state} | {len(rs)} | {sum(run) / len(run):.4f} "
                     f"({', '.join(f'{x:.4f}' for x in run)}) | {need} | {flat} | "
                     f"{sum(_stat(r, 'centred, gamma=1') for r in rs) / len(rs):.4f} | "
                     f"{rs[0]['variance']['groups']['policy']:,} |")
    return "\n".join(lines) + "\n"


def report(path: Path = RECORDS) -> str:
    """Per arm: seeds, mean test BPB, realised rate and super-token count; then the paired differences."""
    rows = arms.load_results(path)["arms"] if path.exists() else []
    if not rows:
        return "no records yet"
    lines = ["| arm | seeds | test BPB | test rate | MB trained |", "|---|---|---|---|---|"]
    for a in dict.fromkeys(r["arm"] for r in rows):
        rs = [r for r in rows if r["arm"] == a]
        lines.append(f"| {a} | {len(rs)} | {arms.mean_se([r['test']['bpb'] for r in rs])} | "
                     f"{sum(r['test']['rate'] for r in rs) / len(rs):.3f} | "
                     f"{sum(r['bytes'] for r in rs) / len(rs) / 1e6:.2f} |")
    lines += ["", "| base − arm (test BPB) | difference, 95 % t over seeds |", "|---|---|"]
    lines += [f"| {b} − {a} | {arms.paired(rows, a, b)} |" for a, b in PAIRS]
    inner = [r for r in rows if "boundary/inner_neg_log_pi" in r.get("train_last", {})]
    if inner:
        lines += ["", "| two-level learned | seed | second level: −log π per decision | a coin at its mean p | "
                  "its rate | L_early2 | L_early | first level's best F1 over shifts |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in inner:
            t = r["train_last"]
            # at the mean probability of the decisions −log π averages over (the realised rate also counts each
            # row's forced first super-token, which −log π leaves out)
            lines.append(f"| {r['arm']} | {r['seed']} | {t['boundary/inner_neg_log_pi']:.4f} | {_coin(t):.4f} | "
                         f"{t['boundary/inner_rate']:.3f} | "
                         f"{t['loss/early2']:.4f} | {t['loss/early']:.4f} | "
                         f"{max(r['test']['f1_by_shift'].values()):.3f} |")
    tables = [t for t in (variance_table(path.with_name(VARIANCE.name)),
                          sensitivity_table(path.with_name(SENSITIVITY.name))) if t]
    return "\n".join(lines) + "\n" + "".join("\n" + t for t in tables)


COIN_NATS = 0.02
"""A second-level policy whose −log π per decision is within this of `_coin` reads as a coin (the summary)."""


def _coin(t: dict) -> float:
    """−log π per decision of a second-level policy that ignores its input, at the run's mean probability."""
    q = t["boundary/inner_p_mean"]
    return -(q * math.log(q) + (1 - q) * math.log(1 - q))


def summary(path: Path = RECORDS) -> str:
    """The README's line on the second level: whether its policy learned in any run, and one level against two."""
    rows = arms.load_results(path)["arms"] if path.exists() else []
    learned = [r for r in rows if r["arm"] in LEARNED2 and "boundary/inner_p_mean" in r.get("train_last", {})]
    if not learned or not any(r["arm"] == "hier1-learned" for r in rows):
        return ""
    from learntok.evaluation.stats import interval_text, paired_interval

    gaps = [abs(_coin(r["train_last"]) - r["train_last"]["boundary/inner_neg_log_pi"]) for r in learned]
    coins = sum(g < COIN_NATS for g in gaps)
    by = {(r["arm"], r["seed"]): r["test"]["bpb"] for r in rows}
    d = [by["hier2-learned", s] - by["hier1-learned", s] for (a, s) in by if a == "hier2-learned"
         and ("hier1-learned", s) in by]
    p = paired_interval(d)
    verdict = "a tie" if p["tie"] else "one level better" if p["mean"] > 0 else "two levels better"
    if coins == len(learned):
        policy = (f"its learned policy ended a coin in every run ({len(learned)} runs, "
                  f"{len({r['arm'] for r in learned})} settings; −log π within {max(gaps):.3f} nats of an "
                  "input-blind policy)")
        tail = "Why it does not learn is measured there, not yet solved."
    else:
        policy = (f"its learned policy ended a coin (−log π within {COIN_NATS} nats of an input-blind policy) in "
                  f"{coins} of {len(learned)} runs ({len({r['arm'] for r in learned})} settings)")
        tail = "What the others learned, and what it bought, is there."
    return ("- A second boundary level (`--inner-layers`, [§9](docs/results.md#9-a-second-boundary-level); the "
            f"paper leaves deeper hierarchies open), `small` shape at matched total FLOPs: {policy}; test BPB, two "
            f"levels − one: {interval_text(p)} ({len(d)} seeds; {verdict}). {tail}")


def cmd_report(args) -> None:
    print(report(Path(args.results)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rn = sub.add_parser("run", help="train and score the arms not yet in the records")
    rn.add_argument("--data", required=True)
    rn.add_argument("--out", default="runs/hierarchy")
    rn.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    rn.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS)
    rn.add_argument("--bytes", type=float, default=6e6, help="the budget: 6N FLOPs of this many bytes of uniform")
    rp = sub.add_parser("report", help="the paired table from the records")
    bf = sub.add_parser("backfill", help="add the last training window's figures to older records")
    bf.add_argument("--out", default="runs/hierarchy")
    va = sub.add_parser("variance", help="each level's policy-gradient SNR on the trained two-level runs")
    va.add_argument("--out", default="runs/hierarchy", help="where the runs are")
    va.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    va.add_argument("--samples", type=int, default=64, help="boundary draws per estimator")
    va.add_argument("--reference-factor", type=int, default=4, help="reference draws per sample")
    va.add_argument("--batch-size", type=int, default=8)
    va.add_argument("--arms", nargs="+", default=["hier2-learned"], choices=LEARNED2)
    va.add_argument("--levels", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    va.add_argument("--gammas", type=float, nargs="*", default=[], help="discounts to measure besides the run's")
    va.add_argument("--threads", type=int, default=1, help="CPU threads (1: leave a core to other work)")
    va.add_argument("--variance", default=str(VARIANCE), help="its records file")
    se = sub.add_parser("sensitivity", help="how much the loss depends on each level's draw")
    se.add_argument("--out", default="runs/hierarchy", help="where the runs are")
    se.add_argument("--arms", nargs="+", default=LEARNED2, choices=LEARNED2)
    se.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    se.add_argument("--first", type=int, default=8, help="first-level draws")
    se.add_argument("--second", type=int, default=8, help="second-level draws under each")
    se.add_argument("--batch-size", type=int, default=8)
    se.add_argument("--threads", type=int, default=1, help="CPU threads (1: leave a core to other work)")
    se.add_argument("--sensitivity", default=str(SENSITIVITY), help="its records file")
    for p in (rn, rp, bf, va, se):
        p.add_argument("--results", default=str(RECORDS), help="the records file")
    args = ap.parse_args()
    {"run": cmd_run, "report": cmd_report, "backfill": cmd_backfill, "variance": cmd_variance,
     "sensitivity": cmd_sensitivity}[args.command](args)


if __name__ == "__main__":
    main()
