"""A leaderboard of tokenizer-free methods on one U-Net at matched compute (docs/results.md, "Leaderboard").

    # every arm at a short budget (the FLOPs of 6 MB of `uniform`), 3 seeds
    python experiments/leaderboard/run.py run --data DATA/enwiki --out runs/leaderboard \
        --bytes 6e6 --seeds 0 1 2
    # the headline pair at the small preset's budget (~17 minutes per arm on 2 cores), 5 fresh seeds
    python experiments/leaderboard/run.py run --data DATA/enwiki --out runs/leaderboard \
        --bytes 2.4e7 --seeds 10 11 12 13 14 --arms learned-w1-vb uniform
    # the matched-time view: 600 s of training per arm on a time schedule
    python experiments/leaderboard/run.py run --data DATA/enwiki --out runs/leaderboard \
        --seconds 600 --seeds 0 1 --arms learned uniform flat bpe-lm
    python experiments/leaderboard/run.py report --out runs/leaderboard     # results.md and leaderboard.png
    python experiments/leaderboard/run.py headline --results experiments/leaderboard/records.jsonl   # the pair

Every arm is `learntok train --preset small` plus its flags (experiments/arms.py) at a target rate of 0.2. With
--bytes B every arm gets the training FLOPs of B bytes of `uniform` by the paper's accounting (6 x matrix
parameters per byte at the byte level and per token at the token level, at the arm's expected rate), so an arm
with more parameters per byte sees fewer bytes; the realised FLOPs are recorded. With --seconds S every arm
trains for S seconds with its learning rate decaying over that time. Validation BPB is measured --eval-points
times during training (the curves of the plot; mid-run points are mid-schedule); the final numbers are
measured on the first 256 KB of the validation and the test splits after training, one boundary sample (the
paper's protocol). Choose settings on validation; read the test column. `run` keeps finished arms and resumes
an interrupted one from its last checkpoint, so a study can be spread over sittings; it runs one training at a
time. Every finished arm is a record (learntok.records: command, config, git SHA, versions, machine, metrics);
`--results FILE` keeps them in FILE instead of OUT/records.jsonl (this project's English Wikipedia study keeps
experiments/leaderboard/records.jsonl in the repository, so they outlive OUT).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import arms  # noqa: E402  (experiments/arms.py)

from learntok.evaluation.stats import interval_text, paired_interval  # noqa: E402

LEADERBOARD_ARMS = ["learned", "uniform", "uniform-random", "whitespace", "bpe", "entropy", "hnet", "dynamic",
                    "flat", "bpe-lm", "uniform-ee", "learned-w1"]
RATE = 0.2
STEP_BYTES = 8 * 512
"""Bytes per optimiser step of the small preset (batch 8 x 512), to turn --eval-points into --eval-every."""


def cmd_run(args) -> None:
    if bool(args.bytes) == bool(args.seconds):
        sys.exit("give exactly one budget: --bytes (matched FLOPs) or --seconds (matched time)")
    steps = args.bytes / STEP_BYTES if args.bytes else args.seconds * 25e3 / STEP_BYTES  # ~25 kB/s on 2 cores
    eval_every = max(1, int(steps / args.eval_points)) if args.eval_points else 0
    try:
        results = arms.run_arms(Path(args.out), Path(args.data), args.arms, args.seeds, study="leaderboard", rate=RATE,
                                budget_bytes=args.bytes, time_budget=args.seconds, reference=arms.spacebyte,
                                eval_every=eval_every, results_path=_results_path(args))
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(arms.table(results, bases=("uniform",), against="learned"))


def _curve(rows: list[dict]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Mean, low and high (over seeds) of validation BPB at the evaluation points the seeds share, by FLOPs."""
    curves = [sorted({c[0]: c for c in r["curve"]}.values()) for r in rows]  # de-duplicate resumed evaluations
    n = min(len(c) for c in curves)
    xs, mean, lo, hi = [], [], [], []
    for i in range(n):
        vals = [c[i][3] for c in curves]
        xs.append(statistics.mean(c[i][1] for c in curves))
        mean.append(statistics.mean(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return xs, mean, lo, hi


def plot(results: dict, path: Path, title: str = "Matched-FLOPs leaderboard (bands: min–max over seeds)") -> None:
    """Validation BPB against training FLOPs (mean over seeds, band: min to max) for every arm and FLOPs budget,
    with each arm's final test BPB (mean ± standard error) at its realised FLOPs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["arms"] if arms.budget_key(r, results)[0] == "flops"]
    names = list(dict.fromkeys(r["arm"] for r in rows))
    colours = {a: plt.get_cmap("tab20")(i % 20) for i, a in enumerate(names)}
    fig, ax = plt.subplots(figsize=(9, 6))
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["arm"], arms.budget_key(r, results)[1]), []).append(r)
    labelled = set()
    for (a, _), rs in sorted(groups.items(), key=lambda kv: kv[0][1]):
        label = None if a in labelled else a
        labelled.add(a)
        if all(r["curve"] for r in rs):
            xs, mean, lo, hi = _curve(rs)
            ax.plot(xs, mean, color=colours[a], lw=1.2, label=label)
            ax.fill_between(xs, lo, hi, color=colours[a], alpha=0.2, lw=0)
            label = None
        test = [r["test"]["bpb"] for r in rs]
        se = statistics.stdev(test) / math.sqrt(len(test)) if len(test) > 1 else 0.0
        ax.errorbar(statistics.mean(r["flops"] for r in rs), statistics.mean(test), yerr=se, fmt="o",
                    color=colours[a], ms=4, capsize=2, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (6 x matrix parameters per byte / token)")
    ax.set_ylabel("bits per byte (lines: validation during training; dots: final test, ± s.e.)")
    ax.set_title(title)
    finals = [r["test"]["bpb"] for r in rows]
    if finals:
        ax.set_ylim(min(finals) - 0.1, max(finals) + 0.6)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def ranking(results: dict) -> str:
    """Arms ordered by mean test BPB within each budget (the short form for the README)."""
    lines = []
    groups: dict = {}
    for r in results["arms"]:
        groups.setdefault(arms.budget_key(r, results), {}).setdefault(r["arm"], []).append(r["test"]["bpb"])
    for (match, budget), by in sorted(groups.items()):
        what = f"{budget:g} s" if match == "time" else f"{budget:.3g} FLOPs"
        order = sorted(by, key=lambda a: statistics.mean(by[a]))
        lines.append(f"{what}: " + " < ".join(f"{a} {statistics.mean(by[a]):.3f}" for a in order))
    return "\n".join(lines)


def _results_path(args) -> Path:
    return Path(args.results) if args.results else Path(args.out) / "records.jsonl"


def cmd_report(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = arms.load_results(_results_path(args))
    text = (f"Data: {results['data']}; `--preset small` at target rate {RATE}; BPB on 256 KB of each split.\n\n"
            + arms.table(results, bases=("uniform",), against="learned") + "\nRanking by test BPB:\n\n"
            + ranking(results) + "\n")
    (out / "results.md").write_text(text)
    print(text)
    try:
        plot(results, out / "leaderboard.png")
        print(f"wrote {out / 'results.md'} and {out / 'leaderboard.png'}")
    except ImportError:
        print(f"wrote {out / 'results.md'} (no plot: pip install matplotlib)")


HEADLINE = ("learned-w1-vb", "uniform", 2.4e7)
DECLARED = {"the design declared first": range(10, 15), "with the declared extension": range(10, 19)}
"""The headline pair's seed sets, each fixed before any of its seeds ran (docs/results.md, "The headline pair").
The second contains the first, so it is the second look at one growing set: it is also reported at 97.5 %
(a 95 % interval Bonferroni-split over the two looks). Its new seeds alone are a replication the first look
never saw (a secondary reading, added after the extension was declared and before its last seed finished)."""


CONTROLS = {"uniform-ee": range(10, 19), "learned-w1-vb-padded": range(14, 19)}
"""The headline pair's confound controls (issue 30) and their seeds, declared before any of them ran: `uniform-ee`
gives uniform the early-exit loss that only learned's encoder gets, on the pair's nine seeds; `learned-w1-vb-padded`
stops learned when its FLOPs with padded token slots (every row as long as the step's longest, as the paper counts
variable token counts) reach uniform's, on the seeds whose uniform runs kept their FLOPs (14-18)."""


def headline_rows(results: dict) -> dict[tuple[str, int], dict]:
    """(arm, seed) -> record of every arm's run at the headline pair's FLOPs budget."""
    return {(r["arm"], r["seed"]): r for r in results["arms"]
            if r.get("match") == "flops" and r.get("budget_bytes") == HEADLINE[2]}


def control_rows(results: dict) -> dict[str, dict[int, tuple[dict, dict, dict]]]:
    """control -> seed -> (its record, uniform's, learned-w1-vb's) at the headline budget, for the declared seeds
    that have all three."""
    arm, base, _ = HEADLINE
    rows = headline_rows(results)
    return {c: {s: (rows[c, s], rows[base, s], rows[arm, s]) for s in seeds
                if (c, s) in rows and (base, s) in rows and (arm, s) in rows} for c, seeds in CONTROLS.items()}


def headline_pairs(results: dict) -> dict[int, tuple[float, float]]:
    """seed -> (test difference, validation difference), learned-w1-vb - uniform at 2.4e7 bytes, from the records
    (seeds 10-13 are transcribed records: test BPB of each arm and the validation difference only)."""
    arm, base, _ = HEADLINE
    rows = headline_rows(results)
    pairs = {}
    for (a, seed), r in rows.items():
        if a == arm and (base, seed) in rows:
            b = rows[base, seed]
            val = r["val_difference"] if "val_difference" in r else r["val"]["bpb"] - b["val"]["bpb"]
            pairs[seed] = (r["test"]["bpb"] - b["test"]["bpb"], val)
    return dict(sorted(pairs.items()))


def interval(d: list[float], level: float = 0.95) -> str:
    p = paired_interval(d, level)
    verdict = "tie" if p["tie"] else ("learned better" if p["mean"] < 0 else "uniform better")
    return f"{interval_text(p)} {verdict}, t = {p['t']:.2f}"


def cmd_headline(args) -> None:
    """The headline pair's paired differences per seed and over each declared seed set (complete sets only)."""
    pairs = headline_pairs(arms.load_results(_results_path(args)))
    print("seed | learned-w1-vb - uniform, test | validation")
    for seed, (t, v) in pairs.items():
        print(f"{seed} | {t:+.4f} | {v:+.4f}")
    first, extended = DECLARED.values()
    for name, seeds in DECLARED.items():
        have = [s for s in seeds if s in pairs]
        if len(have) < len(seeds):
            print(f"{name} (seeds {seeds[0]}-{seeds[-1]}): {len(have)} of {len(seeds)} seeds finished, not reported")
            continue
        test = [pairs[s][0] for s in seeds]
        print(f"{name} (seeds {seeds[0]}-{seeds[-1]}): test {interval(test)}; "
              f"validation {interval([pairs[s][1] for s in seeds])}")
        if seeds is extended:
            new = [s for s in seeds if s not in first]
            print(f"  the same at 97.5 % (two looks at this set): test {interval(test, 0.975)}")
            print(f"  its new seeds alone ({new[0]}-{new[-1]}, a replication): test "
                  f"{interval([pairs[s][0] for s in new])}; validation {interval([pairs[s][1] for s in new])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rn = sub.add_parser("run", help="train and evaluate the arms (resumable)")
    rn.add_argument("--data", required=True)
    rn.add_argument("--out", default="runs/leaderboard")
    rn.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    rn.add_argument("--arms", nargs="+", default=LEADERBOARD_ARMS, choices=list(arms.ARMS))
    rn.add_argument("--bytes", type=float, default=0.0, help="matched FLOPs: those of this many bytes of uniform")
    rn.add_argument("--seconds", type=float, default=0.0, help="matched time: seconds of training per arm")
    rn.add_argument("--eval-points", type=int, default=8, help="validation evaluations during training")
    rp = sub.add_parser("report", help="write OUT/results.md and OUT/leaderboard.png")
    rp.add_argument("--out", default="runs/leaderboard")
    hl = sub.add_parser("headline", help="the headline pair's paired differences over its declared seed sets")
    hl.add_argument("--out", default="runs/leaderboard")
    for p in (rn, rp, hl):
        p.add_argument("--results", default="", help="the records file (default OUT/records.jsonl): finished arms "
                       "are kept there and skipped; a file under version control outlives the run directories")
    args = ap.parse_args()
    {"run": cmd_run, "report": cmd_report, "headline": cmd_headline}[args.cmd](args)


if __name__ == "__main__":
    main()
