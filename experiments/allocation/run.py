"""Issue 30's study: every method at its own best allocation for one budget, then with seeds at that budget and
at 4x it, scored on test text no earlier screen read, at matched total FLOPs (attention included) and at matched
wall-clock.

    python experiments/allocation/run.py sweep --data DATA/enwiki --out runs/alloc              # stage 1, seed 0
    python experiments/allocation/run.py sweep --data DATA/enwiki --out runs/alloc --stage 2 [--ngrams]  # on stage 1
    python experiments/allocation/run.py sweep --data DATA/enwiki --out runs/alloc --clock      # at matched seconds
    python experiments/allocation/run.py collect --out runs/alloc       # the cells' records into records-sweep.jsonl
    python experiments/allocation/run.py best --out runs/alloc                                  # chosen on validation
    python experiments/allocation/run.py final --data DATA/enwiki --out runs/alloc --scale 1
    python experiments/allocation/run.py final --data DATA/enwiki --out runs/alloc --scale 1 --clock
    python experiments/allocation/run.py final --data DATA/enwiki --out runs/alloc --convention 6n  # accounting
    python experiments/allocation/run.py final --data DATA/enwiki --out runs/alloc --clock --series w --allocation clock
    python experiments/allocation/run.py final --data DATA/enwiki --out runs/alloc --scale 4 --allocation wider
    python experiments/allocation/run.py final --data DATA/enwiki --out runs/alloc --scale 4 --allocation chosen
    python experiments/allocation/run.py evaluate --out runs/alloc
    python experiments/allocation/run.py classes --out runs/alloc --scale 0.5     # the test bits by byte class
    python experiments/allocation/run.py retire --out runs/alloc    # after a sweep stage changed an allocation
    python experiments/allocation/run.py report
    python experiments/allocation/run.py restore --out runs/alloc   # on a new machine: OUT's bookkeeping from records

Budget: the total training FLOPs (learntok.model.flops, convention `total`: the paper's 6N plus attention) of
6e6 bytes of `uniform` at rate 0.2 in the `small` preset's shape, so the flat model's full attention and every
method's attention over its tokens are paid for. `--scale 4` is 4x it.

Stage 1 sweeps width and depth (d_model with its heads, and the token-level depth n_mid, or the flat and BPE models' own
depth) for each method in SWEPT (bpe, entropy and hnet take uniform's allocation), one seed, each cell at the budget
(`learntok sweep`, one run directory per cell, resumable). Stage 2 sweeps the byte window, and the target rate for
methods that have one (the BPE transformer: its vocabulary), at stage 1's best width and depth; `sweep --stage 2
--ngrams` sweeps them again with the n-gram tables (STAGE2N_WINDOWS; in sweep2n-METHOD), whose choice the n-gram arms
and the clock sweep take (the plain stage 2's did not carry over to them). `best` reads the stages' validation BPB and
prints the allocation each method trains with. `sweep --clock` runs stage 1 again with the n-gram tables and every cell
trained for the seconds the n-gram arms' clock finals train for (the median training seconds of the flat-ngrams FLOPs
runs at scale 1; the tables cost time, not FLOPs), over a narrower grid (CLOCK_WIDTH x CLOCK_DEPTH: without the FLOPs
sweep's d 192 (but the BPE transformer's: CLOCK_WIDER) and n_mid 5 cells; see CLOCK_WIDTH), at stage 2's choice
where it ran, in sweep1c-METHOD (stale, and refused, once stage 2 chooses another window or rate: `retire` it and
run it again): each method's wall-clock-optimal
allocation, which `best` prints beside the FLOPs one and `final --clock --series NAME --allocation clock` trains at. A
method whose patches are cheap to compute trains more FLOPs per second, so the two optima can differ; the cells run
hours apart and this CPU's speed drifts by about 7 %, the clock sweep's own noise. `final` trains every method (and its
n-gram variant, `--ngrams`, with learned-ngrams-chunks, the chunk embedding's arm) at its allocation with --seeds (5 for
learned, uniform, flat and bpe-lm, 3 for the others by default) to the budget times --scale; with --clock each trains
instead for the median training seconds of the flat model with the same embeddings at that scale (the matched
wall-clock view; that flat arm's FLOPs runs must be finished first; it trains again for those seconds too, each seed
beside the others', since this CPU's speed drifts by ±7 % over hours and a clock set by runs hours earlier would favour
whichever arm ran at the faster time); `--convention 6n` matches the budget in the paper's 6N instead (attention free:
the accounting lever's control, its runs in directories of their own); --arms picks some arms only; `--clock --series
NAME` trains a new set of clock runs paired only among themselves (e.g. learned-ngrams beside bpe-lm-ngrams, after the
first set paired learned with flat). `evaluate` scores every finished final run on the test split after its first 256
KB (which earlier screens read many times), 512 KB of it, per document, and on validation, into
experiments/allocation/records.jsonl. `retire` moves aside the final runs a later sweep stage made stale (they trained
another model than their method's allocation now gives: saved configs compared) and marks their records retired: kept
and listed, out of the tables and the README, so `final` trains those arms again; and the stale clock sweeps, their
cells' records marked retired too (listed in the sweep table). When a later sweep goes back to a retired run's or clock
sweep's settings, `retire` returns it to its place and clears its records' mark instead of training the same model
again (CPU training is deterministic). `restore` rebuilds OUT's bookkeeping from the committed records when its run
directories are gone (a new machine): the sweeps' cells and the finished final runs, so the allocations stand and
nothing finished trains again, and the retired ones in OUT/retired/, so `retire` can still reinstate them. `report`
prints the tables (`levers_table`: what each lever changed, for docs/results.md): test BPB per method, the paired
t-interval over seeds against `flat` and `bpe-lm` (and learned's against it), and a paired bootstrap over documents
(each document's bits averaged over seeds) for the same pairs.
The width check of a budget no sweep reached (4x): `final --allocation wider` trains each arm one step up stage 1's
width axis, the rest of its allocation kept, and `--allocation chosen` at whichever of its allocation and that one
validation preferred on the seeds both trained; the tables, the figure and the README then read each arm at its chosen
width, the levers table the check's differences.
Everything resumes: finished cells and runs are skipped, an interrupted one continues from its checkpoint, except a
clock sweep's cell or a clock run, which trains again from step 0 (resumed, its seconds would span two machine speeds).
Settings are chosen on validation only.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import arms  # noqa: E402  (experiments/arms.py)

from learntok import atomic  # noqa: E402
from learntok.evaluation.stats import interval_text  # noqa: E402

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "records.jsonl"
STUDY = "allocation"
BUDGET_BYTES = 6e6
"""The budget: the total FLOPs of this many bytes of `uniform` at 0.2 in the small preset's shape."""
RATE = 0.2
SKIP_BYTES = 262_144
"""Test bytes left out: the first 256 KB, which every earlier screen read."""
TEST_BYTES = 524_288
NGRAMS = ["--ngram-sizes", "3", "4", "5", "6", "7", "8"]
CHUNKS = {"learned-ngrams-chunks": ["--chunk-table", "16384"]}
"""The chunk-embedding lever's arm and its flags: learned-ngrams plus a hashed embedding of each token's bytes at
the token level, at learned-ngrams' allocation (no sweep of its own), paired with learned-ngrams by seed."""

METHODS: dict[str, list[str]] = {
    "learned": ["--policy-window", "1", "--value-baseline"],  # the headline policy (learned-w1-vb)
    "uniform": ["--boundaries", "uniform"],
    "whitespace": ["--boundaries", "whitespace"],
    "bpe": ["--boundaries", "bpe"],
    "entropy": ["--boundaries", "entropy"],
    "hnet": ["--boundaries", "hnet"],
    "flat": ["--boundaries", "flat", "--token-mlp-mult", "2"],
    "bpe-lm": ["--arch", "token", "--boundaries", "bpe", "--bpe-vocab-size", "4096"],
}
"""Each method's flags on top of `--preset small` (experiments/arms.py's arms, less the allocation, which is
swept)."""
HAS_RATE = ("learned", "uniform", "bpe", "entropy", "hnet")
"""Methods with a --target-rate (whitespace, flat and bpe-lm have their text's or their vocabulary's)."""
MANY_SEEDS = ("learned", "uniform", "flat", "bpe-lm")
SWEPT = ("learned", "uniform", "whitespace", "flat", "bpe-lm")
"""Methods with sweeps of their own: the targets' (learned against flat, bpe-lm, uniform and whitespace). The
other U-Net strategies (bpe, entropy, hnet: reported, not targets) train with uniform's allocation, the same
network at the same rate, which keeps the study near its 10-12 hours (a stage-1 cell costs about 5 minutes)."""

WIDTH = "d-model,n-heads=64:2,96:2,128:2,192:3"
"""Stage 1's width axis (d_model with its heads). The first grids stopped at 96; flat's, learned's and the BPE
transformer's best all lay at the narrow edge, so every method's grid reaches down to 64."""
DEPTH = {"flat": "n-mid=1,2,3", "bpe-lm": "n-mid=2,4,6"}
"""Stage 1's depth axis per method (the U-Net's token-level layers by default)."""
UNET_DEPTH = "n-mid=2,3,5"
CLOCK_WIDTH = "d-model,n-heads=64:2,96:2,128:2"
CLOCK_WIDER = {"bpe-lm": CLOCK_WIDTH + ",192:3"}
"""A method's clock grid extended past CLOCK_WIDTH's wide edge after its optimum lay there: the BPE transformer's
clock sweep improved with width at each depth (val 2.068 / 1.984 / 1.969 at d 64 / 96 / 128 × 2 layers): on this
CPU its wider shapes run more FLOPs per second (d 128 × 2 about twice d 64 × 2's in the same seconds), so width
costs it little text. Its grid takes the FLOPs sweep's d 192 back; decided after those cells, before any wider one
ran.
Its best then lay inside the width axis (d 128) but at the depth axis's deep edge (4 layers: 1.952 against 1.969
at 2), so its depth axis takes the FLOPs sweep's 6 back too (CLOCK_DEPTH), decided before any such cell ran."""
CLOCK_DEPTH = {"flat": "n-mid=1,2", "bpe-lm": "n-mid=2,4,6"}
"""The clock sweep's grid (stage 1 at matched seconds): the FLOPs sweep's neighbourhood of every method's best,
without its d 192 cells (0.10 BPB or more behind every method's best) and its deepest ones (n_mid 5, flat's 3, the
BPE transformer's 6: 0.007 to 0.038 behind; flat's, uniform's and the BPE transformer's within 0.01, so the clock
grid may miss their optimum; the BPE transformer's 6 came back when its clock optimum reached 4, CLOCK_WIDER), which
keeps a method's clock sweep to six cells, about an hour; `best` says when a clock optimum lies at this grid's edge
(its deepest or narrowest point), where the grid should grow."""
CLOCK_UNET_DEPTH = "n-mid=2,3"
STAGE2_RATES = "target-rate=0.15,0.2,0.25,0.333,0.5"
"""Stage 2's rate axis. It began at 0.15-0.25; learned's first cells put its best at 0.25, the grid's edge, so the
axis reached 1/3 (the rate that beat 0.2 at matched 6N in docs/results.md's rates table) for every method with a rate
before any other method's stage 2 ran; learned's best then lay at 1/3, the edge again, so it reaches 1/2 for every
method with a rate, decided with 2 of uniform's cells seen (both at rate 0.2 or below). It ends there, decided
before those cells ran: past 1/2 a token holds one or two bytes and the U-Net tends to a byte model with extra
layers, the flat model's ground; an optimum at 1/2 is reported as an edge, not chased."""
STAGE2_WINDOWS = "byte-window=2,4,8,16"
"""Stage 2's byte-window axis (the byte layers' attention span). It began at 4-16; learned's and uniform's best lay
at 4, its edge (uniform's by 0.03-0.04 over 8 at every rate), so it reaches 2 (a byte and its predecessor) for every
method with a window, decided with learned's and uniform's cells seen and none of whitespace's."""
STAGE2N_WINDOWS = "byte-window=4,8"
"""The byte-window axis of stage 2 with the n-gram tables (`sweep --stage 2 --ngrams`, over STAGE2N_RATES): the
plain stage 2's choice without them did not carry over to the n-gram arms (their first seed at window 4 x 1/2 was
0.04-0.05 worse on validation than at window 8 x 0.2 for learned and uniform), so the n-gram arms and the clock sweep
(which has the tables) take a stage 2 of their own. Its windows are the plain sweep's best (4) and the preset's (8):
2 was the plain sweep's worst window at most rates and 16 never its best."""
STAGE2N_RATES = "target-rate=0.1,0.15,0.2,0.25,0.333,0.5"
"""The rate axis of stage 2 with the n-gram tables: STAGE2_RATES and 0.1. Learned's best lay at 0.15, the grid's low
edge, at both windows (4: 1.9248 against 1.9279 at 0.2; 8: 1.9167 against 1.9205; at each window every rate worse
than the one below it), so the axis grows to 0.1 for every method with a rate, as decided before this sweep ran. It
ends there, decided before those cells ran: a token of 10 bytes on average is longer than most English words with
their space (whitespace's rate is 0.167), so past it tokens span words; an optimum at 0.1 is reported as an edge,
not chased."""
CLOCK_REFERENCE = "flat-ngrams"
"""The arm whose FLOPs runs' median seconds the clock sweep's cells train for (with the n-gram tables, like the
clock finals of the n-gram arms it chooses allocations for)."""


def budget(scale: float = 1.0, budget_bytes: float = BUDGET_BYTES, convention: str = "total") -> float:
    """Training FLOPs of `budget_bytes` of `uniform` at RATE, the small preset's shape and batch (8 x 512), in
    its counter's `convention` (learntok.model.flops: `total` by default; `6n` is the paper's) on rows of 103
    tokens (a boundary every 5 bytes from the first)."""
    from learntok.cli.train import parse_train_args
    from learntok.model import build_model

    cfg = parse_train_args(["--preset", "small", "--boundaries", "uniform", "--target-rate", str(RATE)])
    model = build_model(cfg.model, cfg.boundary)
    rows, L = cfg.batch_size, cfg.data.seq_len
    tokens = -(-L // round(1 / RATE))
    step = model.flops_conventions(rows, L, rows * tokens, rows * tokens, rows * tokens * (tokens + 1) / 2)
    return scale * budget_bytes * step[convention] / (rows * L)


def _flags(method: str, allocation: dict[str, str] | None = None, ngrams: bool = False, rate: bool = True) -> list[str]:
    """`--preset small`, the method's flags, its rate (unless the allocation sets one, or `rate` is False: a sweep
    axis will) and the allocation."""
    allocation = allocation or {}
    rate = ["--target-rate", str(RATE)] if rate and method in HAS_RATE and "target-rate" not in allocation else []
    more = [x for k, v in allocation.items() for x in (f"--{k}", v)]
    return ["--preset", "small", *METHODS[method], *rate, *more, *(NGRAMS if ngrams else [])]


def _arm_flags(arm: str, method: str, allocation: dict[str, str], ngrams: bool) -> list[str]:
    """A final arm's training flags after `--preset small` (which train_arm adds): its method's at `allocation`,
    and the chunk table for a CHUNKS arm. `final` trains with them and `retire` judges a run by them."""
    return _flags(method, allocation, ngrams)[2:] + CHUNKS.get(arm, [])


def _sweep_dir(out: Path, method: str, stage: int, clock: bool = False, ngrams: bool = False) -> Path:
    """sweepSTAGE-METHOD; sweepSTAGEc-METHOD for the sweep at matched seconds, sweepSTAGEn-METHOD for stage 2 with
    the n-gram tables."""
    return out / f"sweep{stage}{'c' if clock else ''}{'n' if ngrams else ''}-{method}"


def _axes(method: str, stage: int, clock: bool = False, ngrams: bool = False) -> list[str]:
    """The --axis specs of a method's sweep stage (stage 2: none for flat; the vocabulary for bpe-lm; the clock
    sweep's stage 1: a narrower grid; stage 2 with n-grams: STAGE2N_WINDOWS and STAGE2N_RATES, none for flat and the BPE
    transformer, whose n-gram arms take the plain stage 2's choice)."""
    if stage == 2 and ngrams:
        if method in ("flat", "bpe-lm"):
            return []
        return [STAGE2N_WINDOWS] + ([STAGE2N_RATES] if method in HAS_RATE else [])
    if stage == 1:
        if clock:
            return [CLOCK_WIDER.get(method, CLOCK_WIDTH), CLOCK_DEPTH.get(method, CLOCK_UNET_DEPTH)]
        return [WIDTH, DEPTH.get(method, UNET_DEPTH)]
    if method == "bpe-lm":  # at d 64 its output layer is most of its FLOPs per token: a smaller one buys tokens
        return ["bpe-vocab-size=1024,2048,4096"]
    axes = [] if method == "flat" else [STAGE2_WINDOWS]
    return axes + ([STAGE2_RATES] if method in HAS_RATE else [])


class UnfinishedSweep(SystemExit):
    """A sweep stage with some but not all of its cells (its best so far could still change): a command that needs
    its allocation stops with the one-line message; `best` reports it and goes on with the others."""


class StaleSweep(UnfinishedSweep):
    """A clock sweep whose cells trained with another byte window or rate than stage 2 now chooses (stage 2 ran,
    or changed its choice, after it): like an unfinished sweep, its best cannot be used until it runs again."""


def _stale_clock_sweep(path: Path, method: str, second: dict[str, str]) -> list[str]:
    """The model settings in which the cells of the clock sweep in `path` (their recorded configs) differ from what
    stage 2's choice `second` now gives them; empty when they agree, or for cells recorded without a config."""
    from learntok import records

    found: set[str] = set()
    for r in records.load(path / "sweep.jsonl"):
        if "config" in r:
            asked = ["--preset", "small", *_flags(method, {**r["axes"], **second}, ngrams=True)[2:]]
            found.update(arms.config_differences(r["config"], asked))
    return sorted(found)


def _best_cell(out: Path, method: str, stage: int, clock: bool = False, ngrams: bool = False) -> dict[str, str] | None:
    """The axes of the stage's lowest validation BPB (mean over its seeds), or None when the stage has no cell
    yet; a stage with some but not all of its cells is an error (its best so far could change)."""
    from learntok import records
    from learntok.cli.sweep import cells, parse_axes

    rows = records.load(_sweep_dir(out, method, stage, clock, ngrams) / "sweep.jsonl")
    if not rows:
        return None
    grid = {json.dumps(c, sort_keys=True) for c in cells(parse_axes(tuple(_axes(method, stage, clock, ngrams))))}
    missing = grid - {json.dumps(r["axes"], sort_keys=True) for r in rows}
    if missing:
        raise UnfinishedSweep(f"{method}: {'the clock sweep' if clock else 'stage'} {stage}"
                              f"{' with n-grams' if ngrams else ''} has "
                              f"{len(grid) - len(missing)} of {len(grid)} cells; finish it (run the sweep again) "
                              "before its best allocation is used")
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(json.dumps(r["axes"], sort_keys=True), []).append(r)
    best = min(groups, key=lambda g: statistics.mean(r["val_bpb"] for r in groups[g]))
    return json.loads(best)


def edges(out: Path, method: str, stage: int, clock: bool = False, ngrams: bool = False) -> list[str]:
    """The axes (by their first flag) whose best point is the first or last of the grid: the optimum may lie
    beyond it, so the axis should be extended before its best is trusted."""
    from learntok.cli.sweep import parse_axes

    best = _best_cell(out, method, stage, clock, ngrams)
    if not best:
        return []
    return [f"{flags[0]}={best[flags[0]]}" for flags, points in parse_axes(tuple(_axes(method, stage, clock, ngrams)))
            if len(points) > 1 and tuple(best[f] for f in flags) in (points[0], points[-1])]


def _stage_2(out: Path, method: str, ngrams: bool, strict: bool = True) -> dict[str, str]:
    """Stage 2's choice for an arm ({} before stage 2 runs). With n-grams (the n-gram arms, and the clock sweep,
    which has the tables): the n-gram stage 2's, for a method it has axes for; before that runs, UnfinishedSweep
    once the plain stage 2 has run (its choice did not carry over to the n-gram arms), or with `strict` False the
    plain stage 2's."""
    plain = _best_cell(out, method, 2)
    if not (ngrams and _axes(method, 2, ngrams=True)):
        return plain or {}
    with_ngrams = _best_cell(out, method, 2, ngrams=True)
    if with_ngrams is None and plain is not None and strict:
        raise UnfinishedSweep(f"{method}: stage 2 with n-grams has not run (`sweep --stage 2 --ngrams --methods "
                              f"{method}`): the n-gram arms and the clock sweep take its choice")
    return with_ngrams or plain or {}


def allocation(out: Path, method: str, clock: bool = False, strict: bool = True, ngrams: bool = False
               ) -> dict[str, str]:
    """Stage 1's best width and depth and stage 2's best byte window (and rate), with `ngrams` (an n-gram arm)
    stage 2 with the n-gram tables' (`_stage_2`); the preset's where a stage has not run. A method outside SWEPT
    takes uniform's. With `clock`, the clock sweep's stage 1 replaces stage 1 (and the allocation is {} until it has
    run), with the n-gram stage 2 (the clock sweep has the tables); a clock sweep run at another stage-2 choice is
    StaleSweep unless not `strict` (then its best stands beside today's stage 2: what `retire` judges runs by)."""
    source = method if method in SWEPT else "uniform"
    first = _best_cell(out, source, 1, clock)
    if clock and first is None:
        return {}
    second = _stage_2(out, source, ngrams or clock, strict)
    if clock and strict and (changed := _stale_clock_sweep(_sweep_dir(out, source, 1, True), source, second)):
        raise StaleSweep(f"{source}: the clock sweep trained with other settings than stage 2 now chooses "
                         f"({'; '.join(changed)}); move {_sweep_dir(out, source, 1, clock=True).name} aside and "
                         f"run `sweep --clock --methods {source}` again")
    return {**(first or {}), **second}


def clock_seconds(out: Path, reference: str, scale: float) -> float | None:
    """The median training seconds of all of `reference`'s finished FLOPs runs (budget matched in total FLOPs) at
    `scale`, whichever seeds a command names (so every clock run of a scale trains for the same seconds): what a
    clock run trains for; None when it has none."""
    runs = out.glob(f"{_run_dir(out, reference, scale, False, '*').name}/final.json")  # every seed's
    secs = [json.loads(path.read_text())["train_seconds"] for path in runs]
    return statistics.median(secs) if secs else None


def cmd_sweep(args) -> None:
    if args.ngrams and args.stage != 2:
        sys.exit("--ngrams: stage 2 has an n-gram sweep of its own (the clock sweep has the tables already)")
    if args.clock:
        if args.stage != 1:
            sys.exit("--clock: the clock sweep is stage 1 (width and depth) at matched seconds")
        secs = clock_seconds(args.out, CLOCK_REFERENCE, 1.0)
        if secs is None:
            sys.exit(f"--clock: the {CLOCK_REFERENCE} arm's FLOPs runs at scale 1 must finish first (`final`)")
        budget_flags = ["--time-budget", f"{secs:.6g}"]
    else:
        budget_flags = ["--flops-budget", f"{budget(1.0, args.budget_bytes):.6g}", "--flops-convention", "total"]
    for method in args.methods:
        axes = _axes(method, args.stage, args.clock, args.ngrams)
        if not axes:
            continue
        if args.stage == 1:  # the clock sweep keeps stage 2's choice with n-grams (the tables are in its cells)
            base = _flags(method, _stage_2(args.out, method, True) if args.clock else None, ngrams=args.clock)
        else:
            first = _best_cell(args.out, method, 1)
            if first is None:
                sys.exit(f"{method}: stage 1 has no finished cell; run stage 1 first")
            base = _flags(method, first, ngrams=args.ngrams, rate=method not in HAS_RATE)
        where = _sweep_dir(args.out, method, args.stage, args.clock, args.ngrams)
        if args.clock:
            _restart_interrupted_clock_cells(where)
        cmd = [sys.executable, "-m", "learntok", "sweep", str(where),
               *budget_flags, *[x for a in axes for x in ("--axis", a)], "--seeds", *map(str, args.seeds), "--",
               "--data", str(args.data), *base]
        print(f"{method}, stage {args.stage}: " + " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True)


def _restart_interrupted_clock_cells(where: Path) -> None:
    """Delete a clock sweep's interrupted cells, so they train again from step 0 rather than resume: a cell's
    budget is its seconds, and one resumed later would have met two machine speeds (this CPU's differ by 1.5-2x
    between sittings), which the cells it is compared with did not."""
    from learntok import records
    from learntok.cli.sweep import cell_name

    done = {cell_name(r["axes"], r["seed"]) for r in records.load(where / "sweep.jsonl")}
    for run in sorted(where.glob("*__seed*")):
        if run.is_dir() and run.name not in done:
            _restart(run)


def _restart(run: Path) -> None:
    """Delete an interrupted clock run's directory (`_restart_interrupted_clock_cells` says why)."""
    print(f"{run.name}: an interrupted clock run trains again from step 0 (resumed, its seconds would span two "
          "machine speeds)", flush=True)
    shutil.rmtree(run)


SWEEP_RECORDS = HERE / "records-sweep.jsonl"


def _sweep_key(r: dict) -> tuple[str, int, bool, bool]:
    """(method, stage, clock, n-grams) of a collected sweep cell's record: the sweep it belongs to."""
    return r["method"], r["stage"], r.get("clock", False), r.get("ngrams", False)


def _cell_key(r: dict) -> tuple:
    """A collected cell's identity: its sweep, axes and seed, and where `retire` moved it (a retired cell is
    another record than the cell run again in its place)."""
    return *_sweep_key(r), json.dumps(r["axes"], sort_keys=True), r["seed"], r.get("retired", {}).get("dir", "")


def _sweep_of(path: Path) -> tuple[str, int, bool, bool]:
    """(method, stage, clock, n-grams) of a sweep directory (`_sweep_dir`'s name)."""
    head, method = path.name.removeprefix("sweep").split("-", 1)
    return method, int(head.rstrip("cn")), "c" in head, "n" in head


def cmd_collect(args) -> None:
    """Copy every sweep cell's record (OUT/sweep{stage}[c]-{method}/sweep.jsonl) into the committed records file,
    each tagged with its method and stage (and `clock` for the sweep at matched seconds). Cells the file has and
    OUT lacks (their run directories are gone) are kept, so collecting from a restored or partial OUT adds cells
    and never drops one."""
    from learntok import records

    rows = []
    for path in sorted(args.out.glob("sweep[12]*-*/sweep.jsonl")):
        method, stage, clock, ngrams = _sweep_of(path.parent)
        rows += [{**r, "method": method, "stage": stage, **({"clock": True} if clock else {}),
                  **({"ngrams": True} if ngrams else {})} for r in records.load(path)]
    found = {_cell_key(r) for r in rows}
    kept = [r for r in records.load(args.results) if _cell_key(r) not in found]
    records.write(args.results, kept + rows)
    print(f"{len(rows)} sweep cells from {args.out}, {len(kept)} more kept -> {args.results}")


RECORD_ONLY = ("schema", "study", "arm", "seed", "source", "run", "run_dir", "val", "test")
"""A final run's record fields that its final.json does not hold (evaluate adds them)."""


def cmd_restore(args) -> None:
    """Rebuild OUT's bookkeeping from the committed records where its run directories are gone (a new machine):
    each sweep's sweep.jsonl, so `best` and `final` choose the same allocations and a sweep trains only its missing
    cells, and each current final run's final.json, marked `restored` (it has no checkpoint), so `final` skips it,
    `--clock` reads its reference's seconds and `retire` can judge it; and likewise the clock sweeps and final
    runs `retire` moved aside, in OUT/retired/, so that a later stage 2 choosing their settings again reinstates
    them there too. Nothing that exists is touched."""
    from learntok import records

    groups: dict[tuple[str, int, bool, bool], list[dict]] = {}
    for r in (r for r in records.load(args.sweep_results) if not r.get("retired")):
        groups.setdefault(_sweep_key(r), []).append(
            {k: v for k, v in r.items() if k not in ("method", "stage", "clock", "ngrams")})
    sweeps = 0
    for key, rows in groups.items():
        path = _sweep_dir(args.out, *key) / "sweep.jsonl"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            records.write(path, rows)
            sweeps += 1
    retired: dict[Path, list[dict]] = {}  # the retired clock sweeps' cells, by the directory retire moved them to
    for r in (r for r in records.load(args.sweep_results) if r.get("retired", {}).get("dir")):
        retired.setdefault(_out_path(args.out, r["retired"]["dir"]), []).append(
            {k: v for k, v in r.items() if k not in ("method", "stage", "clock", "ngrams", "retired")})
    retired_sweeps = retired_runs = 0
    for where, rows in retired.items():
        if not (path := where / "sweep.jsonl").exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            records.write(path, rows)
            retired_sweeps += 1
    finals = 0
    for r in records.load(args.results):
        path = _out_path(args.out, r["run_dir"]) / "final.json"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        res = {k: v for k, v in r.items() if k not in (*RECORD_ONLY, "retired")}
        atomic.write_text(path, json.dumps({**res, "restored": True}, indent=1) + "\n")
        retired_runs += bool(r.get("retired"))
        finals += not r.get("retired")
    print(f"restored {sweeps} sweeps ({sum(map(len, groups.values()))} cells in all) and {finals} final runs in "
          f"{args.out}; {retired_sweeps} retired sweeps and {retired_runs} retired runs in {args.out / 'retired'}")


def _out_path(out: Path, recorded: str) -> Path:
    """Where a record's run directory (`run_dir`, or a retired sweep's `dir`, recorded on the machine that ran it)
    lies in OUT on this machine: OUT/NAME, or OUT/retired/NAME for one `retire` moved aside."""
    path = Path(recorded)
    return out / "retired" / path.name if path.parent.name == "retired" else out / path.name


def _is(recorded: str, out: Path, path: Path) -> bool:
    """Whether a record's directory (`run_dir`, or a retired sweep's `dir`) is `path` in OUT, wherever OUT was when
    it was recorded (`restore` may rebuild OUT elsewhere)."""
    return _out_path(out, recorded).resolve() == path.resolve()


def sweep_table(path: Path = SWEEP_RECORDS) -> str:
    """Validation BPB of every sweep cell: per method and stage (stage 1 at matched seconds: `1 (clock)`; a clock
    sweep `retire` moved aside: `1 (clock, retired: what changed)`, after the current one; stage 2 with the n-gram
    tables: `2 (n-grams)`), one row per cell, best first."""
    from learntok import records

    rows = records.load(path)
    if not rows:
        return "(no sweep cells yet)\n"
    out = ["| method | stage | cell | val BPB | MB trained | total GFLOPs | train s |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        retired = r.get("retired", {})
        groups.setdefault((*_sweep_key(r), retired.get("dir", ""), "; ".join(retired.get("changed", []))),
                          []).append(r)
    for key in sorted(groups, key=lambda k: (list(METHODS).index(k[0]), *k[1:])):
        cells = sorted(groups[key], key=lambda r: r["val_bpb"])
        stage = (f"{key[1]} (clock{', retired: ' + key[5] if key[4] else ''})" if key[2]
                 else f"{key[1]} (n-grams)" if key[3] else str(key[1]))
        for i, r in enumerate(cells):
            name = ", ".join(f"{k} {v}" for k, v in r["axes"].items() if k != "n-heads")
            out.append(f"| {key[0] if i == 0 else ''} | {stage if i == 0 else ''} | {name} | "
                       f"{'**' if i == 0 else ''}{r['val_bpb']:.4f}{'**' if i == 0 else ''} | {r['bytes'] / 1e6:.2f} | "
                       f"{r['flops_total'] / 1e9:.0f} | {r['train_seconds']:.0f} |")
    return "\n".join(out) + "\n"


def cmd_best(args) -> None:
    for method in METHODS:
        try:
            edge = [e for stage in (1, 2) for e in edges(args.out, method, stage)] if method in SWEPT else []
            print(f"{method}: {allocation(args.out, method) or '(no sweep yet: the preset)'}"
                  + (f"; at the grid's edge: {', '.join(edge)} (extend the axis)" if edge else ""))
        except UnfinishedSweep as unfinished:  # a sweep under way: say so, and go on with the others
            print(unfinished)
        if method not in SWEPT:
            continue
        if _axes(method, 2, ngrams=True):
            try:
                edge = edges(args.out, method, 2, ngrams=True)
                print(f"{method} with n-grams: {allocation(args.out, method, ngrams=True)}"
                      + (f"; at the grid's edge: {', '.join(edge)}" if edge else ""))
            except UnfinishedSweep as unfinished:
                print(unfinished)
        try:
            clock = allocation(args.out, method, clock=True)
        except UnfinishedSweep as unfinished:
            print(f"{method} at matched seconds: {unfinished}")
            continue
        if clock:
            edge = edges(args.out, method, 1, clock=True)
            print(f"{method} at matched seconds: {clock}"
                  + (f"; at the clock grid's edge: {', '.join(edge)}" if edge else ""))


def _arms(ngrams: bool) -> list[tuple[str, str, bool]]:
    """(arm name, method, with n-grams) of `final`. With `ngrams` every method has an n-gram arm too (byte n-grams
    in the U-Net's encoder and the flat model, token n-grams for bpe-lm), so each meets learned-ngrams with the same
    lever."""
    out = [(m, m, False) for m in METHODS]
    if ngrams:
        out += [(f"{m}-ngrams", m, True) for m in METHODS] + [(arm, "learned", True) for arm in CHUNKS]
    return out


WALLOC = "-walloc"
"""The run directory's tag of a final run at the wall-clock allocation (`final --allocation clock`)."""
WIDER = "-wider"
"""The run directory's tag of a final run one width step wider than its allocation (`final --allocation wider`)."""


def _run_dir(out: Path, arm: str, scale: float, clock: bool, seed: int | str, series: str = "",
             convention: str = "total", allocated: str = "flops") -> Path:
    """final-ARM-xSCALE[-CONVENTION unless total][-walloc: at the wall-clock allocation, -wider: one width step
    wider][-clock[-SERIES]]-seedSEED"""
    tag = ("" if convention == "total" else f"-{convention}") + {"clock": WALLOC, "wider": WIDER}.get(allocated, "")
    return out / f"final-{arm}-x{scale:g}{tag}{'-clock' if clock else ''}{'-' + series if series else ''}-seed{seed}"


_RUN_NAME = re.compile(r"final-(?P<arm>.+?)-x[0-9.e+]+(?:-.*)?-seed(?P<seed>[0-9]+)(?:-[0-9]+)?")


def _parse_run(name: str) -> tuple[str, int]:
    """(arm, seed) of a final run's directory name (`_run_dir`'s; in OUT/retired/ perhaps with a `-N` that keeps
    two retired copies apart): the arm ends at the first scale tag `-xSCALE`, so a clock series may have any name
    (series `x` was once read as a scale tag)."""
    m = _RUN_NAME.fullmatch(name)
    if not m:
        sys.exit(f"not a final run's directory name: {name}")
    return m["arm"], int(m["seed"])


def _trained(out: Path, arm: str, scale: float, clock: bool, seed: int, series: str = "",
             convention: str = "total", allocated: str = "flops") -> dict | None:
    path = _run_dir(out, arm, scale, clock, seed, series, convention, allocated) / "final.json"
    return json.loads(path.read_text()) if path.exists() else None


def _other_allocation(run: Path, done: dict | None, flags: list[str]) -> bool:
    """Whether RUN trained (`done`: its final.json) or began training (its saved config) another model than
    `flags` build: the saved config is compared, not the flags' text, so `--byte-window 8` given or left to the
    preset is one model (a finished run recorded without its config: the flags' text)."""
    argv = ["--preset", "small", *flags]
    if done:
        return bool(arms.config_differences(done["config"], argv)) if "config" in done else done["flags"] != flags
    return (run / "config.json").exists() and bool(arms.config_differences(run, argv))


def _widened(chosen: dict[str, str]) -> dict[str, str]:
    """An allocation one step up stage 1's width axis (WIDTH: d_model with its heads), the rest kept: the width
    check of a budget the sweeps did not reach (`final --allocation wider`)."""
    from learntok.cli.train import parse_train_args

    names, values = WIDTH.split("=")
    steps = [dict(zip(names.split(","), v.split(":"))) for v in values.split(",")]
    width = chosen.get("d-model") or str(parse_train_args(["--preset", "small"]).model.d_model)  # unswept: the preset's
    at = next((i for i, step in enumerate(steps) if step["d-model"] == width), None)
    if at is None or at + 1 == len(steps):
        sys.exit(f"--allocation wider: d-model {width} has no wider step on stage 1's width axis ({WIDTH})")
    return {**chosen, **steps[at + 1]}


def _judged(out: Path, run: Path) -> tuple[dict | None, list[str], bool]:
    """A final run's final.json (None if unfinished), the flags its method's allocation now gives (one width step
    wider for a `-wider` run), and whether it trained, or began training, another model than those build. The run
    may sit in OUT/retired/."""
    arm, _ = _parse_run(run.name)
    method, ngrams = {a: (m, ng) for a, m, ng in _arms(True)}[arm]
    done = json.loads((run / "final.json").read_text()) if (run / "final.json").exists() else None
    chosen = allocation(out, method, clock=WALLOC + "-" in run.name, strict=False, ngrams=ngrams)
    now = _arm_flags(arm, method, _widened(chosen) if WIDER + "-" in run.name else chosen, ngrams)
    return done, now, _other_allocation(run, done, now)


def _unless_unfinished(waiting: set[str] | None, judge, *args):
    """judge(*args) (`_judged`, `_stage_2`), or None when a sweep it needs is under way, its message added to
    `waiting`: what `retire` cannot judge yet, it leaves as it is."""
    try:
        return judge(*args)
    except UnfinishedSweep as unfinished:
        if waiting is not None:
            waiting.add(str(unfinished))
        return None


def _stale(out: Path, waiting: set[str] | None = None) -> list[tuple[Path, dict | None, list[str]]]:
    """(run, its final.json or None if unfinished, the flags its allocation now gives) of every final run that
    trained, or began training, another model. A run whose method's sweep is under way cannot be judged yet: it
    is left out, the reason added to `waiting`."""
    found = []
    for run in sorted(p for p in out.glob("final-*") if p.is_dir()):
        if (judged := _unless_unfinished(waiting, _judged, out, run)) is None:
            continue
        done, now, other = judged
        if other:
            found.append((run, done, now))
    return found


def _place(retired: Path) -> Path:
    """Where a retired final run trained: OUT/final-...-seedS for OUT/retired/final-...-seedS[-N]."""
    return retired.parent.parent / re.sub(r"(-seed\d+)-\d+$", r"\1", retired.name)


def _reinstatable(out: Path, waiting: set[str] | None = None) -> list[tuple[Path, Path, dict | None]]:
    """(retired run, its place, its final.json) of each retired final run that trained the model its method's
    allocation gives again (a later sweep went back to it) and whose place is empty: the first such of each place;
    like `_stale`, none whose method's sweep is under way."""
    found: dict[Path, tuple[Path, Path, dict | None]] = {}
    for run in sorted(p for p in (out / "retired").glob("final-*") if p.is_dir()):
        if (place := _place(run)).exists() or place in found:
            continue
        if (judged := _unless_unfinished(waiting, _judged, out, run)) is None:
            continue
        done, _, other = judged
        if not other:
            found[place] = (run, place, done)
    return list(found.values())


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], dict | None]:
    """The seeds both arms have, and the paired 95 % t-interval of a − b over them (None under two seeds)."""
    from learntok.evaluation.stats import paired_interval

    seeds = sorted(set(a) & set(b))
    return seeds, paired_interval([a[s] - b[s] for s in seeds]) if len(seeds) >= 2 else None


def cmd_final(args) -> None:
    if args.series and (not args.clock or not args.series.isalnum()):
        sys.exit(f"--series {args.series!r}: needs --clock and a name of letters and digits")
    if args.clock and args.convention != "total":
        sys.exit(f"--convention {args.convention}: --clock matches seconds, not FLOPs; give one or the other")
    at_clock = args.allocation == "clock"
    if at_clock and not (args.clock and args.series):
        sys.exit("--allocation clock: needs --clock and a --series (its runs are paired only among themselves)")
    if args.allocation in ("wider", "chosen") and args.clock:
        sys.exit(f"--allocation {args.allocation}: the width check of a FLOPs budget; not with --clock")
    if args.allocation == "chosen":  # its runs' records' _budget_key, and the records of both shapes
        from learntok import records

        view = _budget_key({"budget": {"scale": args.scale, "match": f"flops-{args.convention}",
                                       "flops_budget": budget(args.scale, args.budget_bytes, args.convention)}})
        current = [r for r in records.load(args.results) if not r.get("retired")]
    for seed in args.seeds:
        for arm, method, ngrams in _arms(args.ngrams):
            if method not in args.methods or (args.arms and arm not in args.arms):
                continue
            if seed not in (args.seeds if method in MANY_SEEDS else args.seeds[:args.few_seeds]):
                continue
            shape = args.allocation
            if shape == "chosen" and (shape := _width_choice(current, arm, view)) is None:
                sys.exit(f"--allocation chosen: {arm} needs a run at its allocation and one a width step wider "
                         f"(--allocation wider) of a common seed, both evaluated, at x{args.scale:g} first")
            where = (args.out, arm, args.scale, args.clock, seed, args.series, args.convention, shape)
            run, done = _run_dir(*where), _trained(*where)
            chosen = allocation(args.out, method, clock=at_clock, ngrams=ngrams)
            if at_clock and not chosen:
                sys.exit(f"--allocation clock: {method} has no clock sweep yet (`sweep --clock --methods {method}`)")
            if shape == "wider":
                chosen = _widened(chosen)
            flags = _arm_flags(arm, method, chosen, ngrams)
            if _other_allocation(run, done, flags):
                why = (f"trained with {' '.join(done['flags'])}, but the allocation now gives {' '.join(flags)}: the "
                       "seeds of one arm must train one model" if done else f"is an unfinished run of another "
                       f"allocation than {' '.join(flags)}: resuming it would train that one")
                sys.exit(f"{run} {why} (run `retire` to move it aside)")
            if done:
                continue
            ref = "flat-ngrams" if ngrams else "flat"  # the clock's: the flat model with the same embeddings
            if args.clock:  # the reference trains again too, beside the others: the CPU's speed drifts by hours
                secs = clock_seconds(args.out, ref, args.scale)
                if secs is None:
                    sys.exit(f"--clock: the {ref} arm's FLOPs runs at this scale must finish first")
                kw = {"time_budget": secs}
                if run.exists():
                    _restart(run)
            else:
                kw = {"flops_budget": budget(args.scale, args.budget_bytes, args.convention),
                      "flops_convention": args.convention}
            print(f"training {run.name}", flush=True)
            res = arms.train_arm(run, args.data, method, rate=RATE, seed=seed, flags=flags, **kw)
            res["flags"], res["method"], res["ngrams"] = flags, method, ngrams
            res["budget"] = {"scale": args.scale, "match": "time" if args.clock else f"flops-{args.convention}", **kw,
                             **({"reference": ref} if args.clock else {}),
                             **({"series": args.series} if args.series else {}),
                             **({"allocation": shape} if shape in ("clock", "wider") else {})}
            atomic.write_text(run / "final.json", json.dumps(res, indent=1) + "\n")  # _trained reads it whole
            print(f"{run.name}: {res['bytes'] / 1e6:.2f} MB, {res.get('flops_total', 0):.3g} total FLOPs, "
                  f"{res['train_seconds']:.0f} s", flush=True)


def _wider(r: dict) -> bool:
    """Whether a final run's record trained one width step wider than its allocation (`--allocation wider`)."""
    return r["budget"].get("allocation") == "wider"


def _width_choice(rows: list[dict], arm: str, view: tuple) -> str | None:
    """Which of an arm's two shapes at a budget (`view`: a `_budget_key`) validation prefers, "flops" (its
    allocation) or "wider", by mean validation BPB over the seeds both trained (seed 0 in the queue; a tie keeps
    the allocation); None when no seed has both."""
    val: dict[bool, dict[int, float]] = {False: {}, True: {}}
    for r in rows:
        if r["arm"] == arm and _budget_key(r) == view:
            val[_wider(r)][r["seed"]] = r["val"]["bpb"]
    if not (seeds := sorted(set(val[False]) & set(val[True]))):
        return None
    better = statistics.mean(val[True][s] for s in seeds) < statistics.mean(val[False][s] for s in seeds)
    return "wider" if better else "flops"


def _current(rows: list[dict]) -> list[dict]:
    """The final runs the tables and the README read: not retired, each arm at its chosen width
    (`_at_chosen_width`)."""
    return _at_chosen_width([r for r in rows if not r.get("retired")])


def _at_chosen_width(rows: list[dict]) -> list[dict]:
    """The records of each arm's chosen shape where a budget has it at two widths (the width check,
    `_width_choice`), the other shape's left out (the levers table reads them); its allocation while no seed has
    both. The tables, the figure and the README read these."""
    checked = {(_budget_key(r), r["arm"]) for r in rows if _wider(r)}
    choice = {k: _width_choice(rows, k[1], k[0]) or "flops" for k in checked}
    return [r for r in rows if (k := (_budget_key(r), r["arm"])) not in checked
            or (choice[k] == "wider") == _wider(r)]


def _heldout(cfg, model, split: str, **kw) -> dict:
    """`model`'s held-out BPB on its data's `split` (learntok.evaluation.bpb.heldout_bpb's keywords `kw`): how
    `evaluate` and `classes` score a final run."""
    from learntok.data import ByteSequences, load_split
    from learntok.evaluation.bpb import BoundaryMode, heldout_bpb

    seqs = ByteSequences(load_split(cfg.data, split)[1], cfg.data.seq_len, cfg.data.pack,
                         annotate=model.boundary.annotator)
    return heldout_bpb(model, seqs, BoundaryMode(), **kw)


def cmd_evaluate(args) -> None:
    from learntok import records
    from learntok.checkpoint import load_run

    done = {r["run_dir"] for r in records.load(args.results)}
    for path in sorted(args.out.glob("final-*/final.json")):
        run = path.parent
        if str(run.resolve()) in done:
            continue
        res = json.loads(path.read_text())
        if res.get("restored"):  # `restore` wrote it from its record: scored already, and it has no checkpoint
            continue
        cfg, model = load_run(run)
        scores = {split: _heldout(cfg, model, split, **kw) for split, kw in (
            ("val", {"max_bytes": args.val_bytes}),
            ("test", {"skip_bytes": SKIP_BYTES, "max_bytes": args.test_bytes, "per_document": True}))}
        arm, seed = _parse_run(run.name)
        rec = records.make(STUDY, arm, seed, command=res.pop("command"),
                           prov=res.pop("provenance"), run=run.name, run_dir=str(run.resolve()), **res,
                           val=scores["val"], test=scores["test"])
        records.append(args.results, rec)
        print(f"{run.name}: test BPB {scores['test']['bpb']:.4f} (val {scores['val']['bpb']:.4f})", flush=True)


CLASS_RECORDS = HERE / "records-classes.jsonl"
CLASS_ARMS = ("learned-ngrams", "flat-ngrams", "uniform-ngrams", "whitespace-ngrams")
"""The arms `classes` breaks down (the byte models learned leads at x1; the BPE transformer's bits are per
token)."""


def cmd_classes(args) -> None:
    """Score each current run of CLASS_ARMS at budget x --scale (matched total FLOPs; with --clock its clock
    series' runs instead) again on `evaluate`'s test bytes with its bits broken down by byte class
    (learntok.evaluation.byteclass: word starts, the rest of words, spaces, punctuation), into
    records-classes.jsonl: which bytes learned's lead over each method is made of. Runs already there are skipped;
    a run without its checkpoint (restored from its record on a machine that did not train it) is named and
    skipped."""
    from learntok import records

    done = {_scored(r) for r in records.load(args.class_results)}
    rows = _current(records.load(args.results))
    for r in sorted(rows, key=lambda r: (r["seed"], CLASS_ARMS.index(r["arm"]) if r["arm"] in CLASS_ARMS else 0)):
        scale, match, _, series = _budget_key(r)
        view = scale == args.scale and (match == "time" if args.clock else (match, series) == ("flops-total", ""))
        if r["arm"] not in CLASS_ARMS or not view or _scored(r) in done:
            continue
        run = _out_path(args.out, r["run_dir"])
        if not (run / "latest").exists():
            print(f"{run.name}: no checkpoint here (restored from its record?); skipped", flush=True)
            continue
        res = _class_scores(run, args.test_bytes)
        if res["bytes"] != r["test"]["bytes"] or abs(res["bpb"] - r["test"]["bpb"]) > 1e-4:
            sys.exit(f"{run.name}: scored {res['bpb']:.5f} on {res['bytes']:,} bytes, its record "
                     f"{r['test']['bpb']:.5f} on {r['test']['bytes']:,}: not the same model or text")
        rec = records.make(f"{STUDY}-classes", r["arm"], r["seed"], command=sys.argv, run=r["run"],
                           budget=r["budget"], test={k: res[k] for k in ("bpb", "bytes", "by_class")})
        records.append(args.class_results, rec)
        done.add(_scored(r))
        print(f"{run.name}: " + ", ".join(f"{c} {bits / n:.4f}" for c, bits, n in zip(
            *(res["by_class"][k] for k in ("classes", "bits", "bytes")), strict=True)), flush=True)


def _class_scores(run: Path, test_bytes: int) -> dict:
    """A final run's test bits per byte class on `evaluate`'s test bytes (after the first 256 KB)."""
    from learntok.checkpoint import load_run

    return _heldout(*load_run(run), "test", skip_bytes=SKIP_BYTES, max_bytes=test_bytes, by_class=True)


def _scored(r: dict) -> tuple[str, float]:
    """Which training of a run a record scored: its directory's name and test BPB (a run retired and trained again
    keeps its name)."""
    return r["run"], round(r["test"]["bpb"], 6)


def classes_table(path: Path = CLASS_RECORDS, results: Path = RECORDS) -> str:
    """Where learned's lead lies, a table per budget (scale, match, clock series) that has learned-ngrams' runs:
    per byte class, its share of the test bytes, learned-ngrams' bits per byte there, and against each other arm
    of CLASS_ARMS learned − it in that class's bits per byte and the class's part of the whole gap (its bits of
    learned − the other's, over all bytes: the parts add up to the gap), mean and 95 % t over the seeds both have;
    then, for runs scored with their boundaries, where each U-Net arm's tokens begin (`_token_view`); only the
    records of runs still current in `results`."""
    from learntok import records

    current = {_scored(r) for r in records.load(results) if not r.get("retired")}
    recs = [r for r in records.load(path) if _scored(r) in current]
    groups: dict[tuple, list[dict]] = {}
    for r in recs:
        groups.setdefault(_budget_key(r), []).append(r)
    out = []
    for key in sorted(groups, key=_view_order):
        breakdowns = {(r["arm"], r["seed"]): r["test"]["by_class"] for r in groups[key]}
        tables = [t for t in (_class_view(breakdowns), _token_view(breakdowns)) if t]
        if tables:
            series = f", clock series {key[3]}" if key[3] else ""
            shapes = {r["budget"].get("allocation") for r in groups[key]}
            shape = "each method at its " + ("wall-clock allocation" if "clock" in shapes else
                                             WIDTH_CHOSEN if "wider" in shapes else "x1 allocation")
            out += [f"Budget x{key[0]:g}, matched {VIEWS[key[1]]}{series} ({shape}):", ""]
            out += [x for t in tables for x in (t, "")][:-1]
    return "\n".join(out) or "(no records yet)\n"


def _token_view(recs: dict[tuple[str, int], dict]) -> str:
    """Where each arm's own tokens begin, for one budget's breakdowns {(arm, seed): by_class} (those scored with
    their boundaries; "" without any): per byte class, the fraction of its bytes that are a token's first byte and
    bits per byte on those and on the rest, each the mean over the arm's seeds (flat, every byte a token, left
    out)."""
    from learntok.evaluation.byteclass import token_split

    split = {}
    for (arm, _), c in sorted(recs.items()):
        if "token_first" in c and arm != "flat-ngrams":
            split.setdefault(arm, []).append(token_split(c))
    if not split:
        return ""

    def mean(values: list) -> str:
        values = [v for v in values if v is not None]
        return f"{statistics.mean(values):.3f}" if values else "—"

    head = ["byte class"]
    for arm, runs in split.items():
        name = arm.removesuffix("-ngrams")
        head += [f"{name}: a token's first byte ({len(runs)} seed{'s' if len(runs) > 1 else ''})",
                 f"{name}: BPB on first bytes / the rest"]
    rows = []
    for i, name in enumerate(r["class"] for r in next(iter(split.values()))[0]):
        row = ["**all**" if name == "all" else name]
        for runs in split.values():
            first = [run[i]["first"] for run in runs]
            row += [f"{statistics.mean(first):.1%}",
                    f"{mean([run[i]['bpb_first'] for run in runs])} / {mean([run[i]['bpb_rest'] for run in runs])}"]
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _class_view(recs: dict[tuple[str, int], dict]) -> str:
    """`classes_table`'s table for one budget's breakdowns {(arm, seed): by_class}; "" without learned's."""
    from learntok.evaluation.byteclass import class_difference
    from learntok.evaluation.stats import paired_interval

    base = CLASS_ARMS[0]
    mine = {s: c for (a, s), c in recs.items() if a == base}
    others = [a for a in CLASS_ARMS[1:] if any((a, s) in recs for s in mine)]
    if not mine or not others:
        return ""
    head = ["byte class", "share of the bytes", f"{base} BPB there"]
    for other in others:
        name = other.removesuffix("-ngrams")
        head += [f"learned − {name}: BPB there", f"learned − {name}: part of the gap"]
    first = next(iter(mine.values()))
    rows = [[c, f"{n / sum(first['bytes']):.1%}", arms.mean_se([m["bits"][i] / m["bytes"][i] for m in mine.values()])]
            for i, (c, n) in enumerate(zip(first["classes"], first["bytes"], strict=True))]
    rows.append(["**all**", "100 %", arms.mean_se([sum(m["bits"]) / sum(m["bytes"]) for m in mine.values()])])

    def cell(values: list[float]) -> str:
        return interval_text(paired_interval(values), tie=True) if len(values) > 1 else f"{values[0]:+.4f} (1 seed)"

    for other in others:
        seeds = sorted(s for (a, s) in recs if a == other and s in mine)
        diffs = [class_difference(mine[s], recs[other, s]) for s in seeds]
        for i, row in enumerate(rows[:-1]):
            row += [cell([d[i]["diff"] for d in diffs]), cell([d[i]["contribution"] for d in diffs])]
        rows[-1] += [cell([sum(c["contribution"] for c in d) for d in diffs]),
                     f"({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


VIEWS = {"flops-total": "total FLOPs", "time": "wall-clock", "flops-6n": "6N FLOPs (the paper's)",
         "flops-6n-padded": "6N FLOPs with padded token slots"}
"""What a final run's budget matched (its record's budget.match), in the order the tables show them."""


def _budget_key(r: dict) -> tuple[float, str, float, str]:
    """What a final run's record is paired within: its scale, match, budget (FLOPs or seconds) and clock series."""
    b = r["budget"]
    return b["scale"], b["match"], float(f"{b.get('flops_budget') or b.get('time_budget'):.4g}"), b.get("series", "")


def _view_order(key: tuple[float, str, float, str]) -> tuple:
    """Tables by scale (the x1 budget's first, the study's own; then ½x, 4x), then total FLOPs, wall-clock (its
    series in turn) and the 6N conventions."""
    return key[0] != 1, key[0], list(VIEWS).index(key[1]), key[3], key[2]


def _move_run(run: Path, dest: Path) -> None:
    """Move a final run's directory, and its log beside it, to `dest`."""
    dest.parent.mkdir(exist_ok=True)
    run.rename(dest)
    for log in run.parent.glob(run.name + ".log"):
        log.rename(dest.parent / (dest.name + ".log"))


def cmd_retire(args) -> None:
    """Move aside every final run, finished or not, that trained another model than its method's allocation now
    gives (a later sweep stage chose another), into OUT/retired/ (NAME-2, -3, ... when a run of its name was
    retired before), and mark its record `retired` with the flags that replace them. The record stays (every arm
    trained is logged) but leaves the tables, and `final` can train the arm again. Then the clock sweeps stage 2
    made stale, likewise (`_retire_clock_sweeps`). Last, the other way: a retired clock sweep or final run whose
    settings are again the allocation's (a later sweep went back to them) returns to its place, its records no
    longer retired, instead of training the same model again (`_reinstate`). A method whose sweep is under way
    cannot be judged: its runs and clock sweep are left as they are, the sweep named, for a later `retire`."""
    from learntok import records

    rows, waiting = records.load(args.results), set()
    moved = 0
    for run, res, now in _stale(args.out, waiting):
        dest = next(d for n in range(1, 100) if not (d := args.out / "retired" / (
            run.name if n == 1 else f"{run.name}-{n}")).exists())
        for r in rows:
            if _is(r["run_dir"], args.out, run):
                r["run_dir"] = str(dest.resolve())
                r["retired"] = {"reason": "its method's allocation changed after it trained", "now": now}
        _move_run(run, dest)
        moved += 1
        print(f"retired {run.name}: {'trained with ' + ' '.join(res['flags']) if res else 'unfinished'}; the "
              f"allocation now gives {' '.join(now)}", flush=True)
    records.write(args.results, rows)
    print(f"{moved} runs retired; {sum(1 for r in rows if r.get('retired'))} records marked retired in "
          f"{args.results}")
    _retire_clock_sweeps(args.out, args.sweep_results, waiting)
    _reinstate(args.out, args.results, args.sweep_results, waiting)
    for why in sorted(waiting):  # judged once the sweep finishes: run `retire` again then
        print(f"left as they are until a sweep finishes: {why}", flush=True)


def _reinstate(out: Path, results: Path, sweep_results: Path, waiting: set[str]) -> None:
    """Return to its place each retired clock sweep whose cells trained at the settings stage 2 now chooses, then
    each retired final run that trained the model its allocation now gives (`_reinstatable`; a run at the
    wall-clock allocation needs its clock sweep back first), and clear their records' `retired` mark: CPU training
    is deterministic, so training them again would give the same models."""
    from learntok import records

    cells, back = records.load(sweep_results), False
    for method in SWEPT:
        place = _sweep_dir(out, method, 1, clock=True)
        if place.exists():
            continue
        if (second := _unless_unfinished(waiting, _stage_2, out, method, True, False)) is None:
            continue
        for old in sorted((out / "retired").glob(f"{place.name}-*")):
            kept = records.load(old / "sweep.jsonl")
            if kept and all("config" in r for r in kept) and not _stale_clock_sweep(old, method, second):
                for r in cells:
                    if r.get("retired", {}).get("dir") and _is(r["retired"]["dir"], out, old):
                        r.pop("retired", None)
                old.rename(place)
                back = True
                print(f"reinstated the clock sweep of {method} from {old}: stage 2 chose its settings again",
                      flush=True)
                break
    if back:
        records.write(sweep_results, cells)
    rows = records.load(results)
    found = _reinstatable(out, waiting)
    for run, place, done in found:
        for r in rows:
            if _is(r["run_dir"], out, run):
                r["run_dir"] = str(place.resolve())
                r.pop("retired", None)
        _move_run(run, place)
        print(f"reinstated {place.name} from {run.name}: "
              f"{'trained with ' + ' '.join(done['flags']) if done else 'unfinished'}, the allocation's model again",
              flush=True)
    if found:
        records.write(results, rows)
        print(f"{len(found)} runs reinstated; {sum(1 for r in rows if r.get('retired'))} records still retired")


def _retire_clock_sweeps(out: Path, results: Path, waiting: set[str]) -> None:
    """Move aside, into OUT/retired/, each clock sweep whose cells trained at other settings than stage 2 now
    chooses (StaleSweep's), and mark its cells' records in `results` retired with what changed: they stay logged
    and in the sweep table, but `restore` and `collect` no longer count them as the clock sweep, so `sweep
    --clock` runs it again at today's settings."""
    from learntok import records

    rows, moved = records.load(results), False
    for method in SWEPT:
        path = _sweep_dir(out, method, 1, clock=True)
        if not path.is_dir() or (second := _unless_unfinished(waiting, _stage_2, out, method, True, False)) is None:
            continue
        if not (changed := _stale_clock_sweep(path, method, second)):
            continue
        dest = next(d for n in range(1, 100) if not (d := out / "retired" / f"{path.name}-{n}").exists())
        dest.parent.mkdir(exist_ok=True)
        path.rename(dest)
        moved, marked = True, 0
        for r in rows:
            if _sweep_key(r) == (method, 1, True, False) and not r.get("retired"):
                r["retired"] = {"reason": "stage 2 chose other settings after it ran", "changed": changed,
                                "dir": str(dest.resolve())}
                marked += 1
        print(f"retired the clock sweep of {method} ({'; '.join(changed)}) to {dest}; {marked} records marked "
              f"retired in {results}", flush=True)
    if moved:
        records.write(results, rows)


def _options(flags: list[str]) -> dict[str, str]:
    """A flag list's `--name value` options, the last value of each winning as on the command line (the
    allocation's flags follow the method's)."""
    return {x: v for x, v in zip(flags, flags[1:]) if x.startswith("--") and not v.startswith("--")}


def _changed(a: list[str], b: list[str]) -> str:
    """The options of flag list `a` that `b` lacks or sets to another value."""
    a_, b_ = _options(a), _options(b)
    return " ".join(f"{k} {v}" for k, v in a_.items() if b_.get(k) != v)


def retired_table(path: Path = RECORDS) -> str:
    """The retired final runs (trained at an allocation a later sweep stage replaced): kept, out of the tables."""
    from learntok import records

    every = records.load(path)
    rows = [r for r in every if r.get("retired")]
    if not rows:
        return ""
    out = ["", "Retired runs (their method's allocation changed after they trained; left out of the tables above), "
           "and learned's current runs of the same budget against them:", "",
           "| arm | budget | seeds | test BPB | trained with | now | learned − it (seeds, 95 % t) |",
           "|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["arm"], _budget_key(r), tuple(r["flags"])), []).append(r)
    for (arm, key, _), rs in sorted(groups.items()):
        was, now = rs[0]["flags"], rs[0]["retired"]["now"]
        view = f"x{key[0]:g} {VIEWS[key[1]]}{' ' + key[3] if key[3] else ''}"
        learned = {r["seed"]: r["test"]["bpb"] for r in every if not r.get("retired") and _budget_key(r) == key
                   and r["arm"] == "learned" + ("-ngrams" if arm.endswith("-ngrams") else "")}
        seeds, p = _paired(learned, {r["seed"]: r["test"]["bpb"] for r in rs})
        diff = interval_text(p, tie=True) if p else "—"
        out.append(f"| {arm} | {view} | {len(rs)} | {arms.mean_se([r['test']['bpb'] for r in rs])} | "
                   f"{_changed(was, now)} | {_changed(now, was)} | {diff} |")
    return "\n".join(out) + "\n"


def report(path: Path = RECORDS) -> str:
    """Per budget (scale, match and clock series): each arm's test BPB, and its paired differences against flat
    and bpe-lm, and learned's against it, each with the same embeddings (an n-gram arm against flat-ngrams and
    bpe-lm-ngrams; learned-ngrams against it)."""
    from learntok import records

    every = records.load(path)
    rows = _current(every)
    before = _before_stage_2(every)
    out = _tables(rows) if rows else ["(no current records yet)", ""]
    if any(r.get("retired") for r in before):
        out += ["At stage 1's allocation (width × depth only, at the preset's byte window 8 and rate 0.2): the runs "
                "`retire` moved aside when stage 2 gave their methods a byte window and rate, beside the current "
                "runs at that window and rate (flat, which stage 2 gives none; the BPE transformer at the vocabulary "
                "its stage 2 chose, its only stage-2 axis; and any arm a later stage 2 sent back to it).", "",
                *_tables([{k: v for k, v in r.items() if k != "retired"} for r in before])]
    return "\n".join(out) + retired_table(path)


def _tables(rows: list[dict]) -> list[str]:
    """`report`'s lines for these final runs' records: one table per budget."""
    from learntok.evaluation.stats import paired_bootstrap

    out = []
    for key in sorted({_budget_key(r) for r in rows}, key=_view_order):
        sub = [r for r in rows if _budget_key(r) == key]
        by = {}
        for r in sub:
            by.setdefault(r["arm"], {})[r["seed"]] = r
        n_test = sub[0]["test"]["bytes"]
        unit = "s" if key[1] == "time" else "FLOPs"
        walloc = ", each at its wall-clock allocation" if sub[0]["budget"].get("allocation") == "clock" else ""
        series = f" (clock series {key[3]}: its arms trained beside each other{walloc})" if key[3] else ""
        if wider := sorted({r["arm"] for r in sub if _wider(r)}):
            series += (f" (one width step wider than its allocation, which validation preferred on the seeds both "
                       f"shapes trained: {', '.join(wider)}; the levers table has every checked arm's difference)")
        out += [f"Budget x{key[0]:g} of the reference ({key[2]:.4g} {unit}), matched {VIEWS[key[1]]}{series}; test "
                f"BPB on {n_test:,} bytes after the first {SKIP_BYTES // 1024} KB; bootstrap: the text resampled, "
                f"each document's bits averaged over the paired seeds, models fixed (a verdict is the seed "
                f"column's).", "",
                "| arm | seeds | test BPB | val BPB | total GFLOPs | train s | − flat (seeds, 95 % t) | "
                "− flat (documents, bootstrap) | − bpe-lm (seeds, 95 % t) | − bpe-lm (documents, bootstrap) | "
                "learned − it (seeds, 95 % t) | learned − it (documents, bootstrap) |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def vs(arm: str, base: str, by: dict = by) -> tuple[str, str]:
            a, b = by.get(arm, {}), by.get(base, {})
            seeds, p = _paired(*({s: r["test"]["bpb"] for s, r in x.items()} for x in (a, b)))
            if arm == base or not seeds:
                return "—", "—"
            if p is None:  # no interval over one seed: the difference, and the documents' bootstrap
                t = f"{a[seeds[0]]['test']['bpb'] - b[seeds[0]]['test']['bpb']:+.4f} (1 seed)"
            else:
                t = interval_text(p, tie=True)
            docs = [a[s]["test"]["per_document"] for s in seeds] + [b[s]["test"]["per_document"] for s in seeds]
            if any((d["documents"], d["bytes"]) != (docs[0]["documents"], docs[0]["bytes"]) for d in docs):
                return t, "(different text)"
            mean_bits = [[statistics.mean(v) for v in zip(*(d["bits"] for d in part))]
                         for part in (docs[:len(seeds)], docs[len(seeds):])]
            try:
                q = paired_bootstrap(*mean_bits, docs[0]["bytes"])
            except ValueError:  # fewer than two documents
                return t, "—"
            return t, interval_text(q, tie=True)

        for arm in sorted(by, key=lambda a: statistics.mean(r["test"]["bpb"] for r in by[a].values())):
            rs = list(by[arm].values())
            variant = "-ngrams" if "-ngrams" in arm else ""  # against the baselines with the same lever
            flat_t, flat_b = vs(arm, "flat" + variant)
            bpe_t, bpe_b = vs(arm, "bpe-lm" + variant)
            learned_t, learned_b = vs("learned" + variant, arm)
            out.append(f"| {arm} | {len(rs)} | {arms.mean_se([r['test']['bpb'] for r in rs])} | "
                       f"{arms.mean_se([r['val']['bpb'] for r in rs])} | "
                       f"{statistics.mean(r.get('flops_total', 0) for r in rs) / 1e9:.1f} | "
                       f"{statistics.mean(r['train_seconds'] for r in rs):.0f} | {flat_t} | {flat_b} | {bpe_t} | "
                       f"{bpe_b} | {learned_t} | {learned_b} |")
        out.append("")
    return out


PRESET_RECORDS = HERE / "records-preset.jsonl"
"""The first screen's records: every method in the small preset's shape (the allocation lever's before)."""


def _by_budget(recs: list[dict], key=None) -> dict[tuple, dict[str, dict[int, float]]]:
    """Test BPB per budget (`key` of a record, default `_budget_key`), arm and seed of final runs' records; a
    later record of the same budget, arm and seed replaces an earlier one."""
    by: dict[tuple, dict[str, dict[int, float]]] = {}
    for r in recs:
        by.setdefault((key or _budget_key)(r), {}).setdefault(r["arm"], {})[r["seed"]] = r["test"]["bpb"]
    return by


def _views(recs: list[dict]) -> dict[tuple[float, str, str], dict[str, dict[int, float]]]:
    """Test BPB per (scale, match, clock series), arm and seed of final runs' records, retired runs left out."""
    def view(r: dict) -> tuple[float, str, str]:
        scale, match, _, series = _budget_key(r)
        return scale, match, series

    return _by_budget([r for r in recs if not r.get("retired")], view)


def _gap(arms_: dict[str, dict[int, float]], a: str, b: str) -> dict[int, float]:
    """a − b per seed both have."""
    x, y = arms_.get(a, {}), arms_.get(b, {})
    return {s: x[s] - y[s] for s in x if s in y}


GAPS = [f"learned{v} − {m}{v}" for v in ("-ngrams", "") for m in METHODS if m != "learned"]
"""The levers table's gaps: learned − each other method, with n-grams and without."""


def _of(view: dict[str, dict[int, float]], subject: str) -> dict[int, float]:
    """A levers-table subject's test BPB per seed: an arm's, or for "a − b" the gap a − b."""
    pair = subject.split(" − ")
    return _gap(view, *pair) if len(pair) == 2 else view.get(subject, {})


def _change(after: dict[int, float], before: dict[int, float]) -> tuple[int, str] | None:
    """after − before paired over seeds: (seeds, the 95 % t-interval, or the one seed's difference); None when no
    seed has both."""
    seeds, p = _paired(after, before)
    if not seeds:
        return None
    if p is None:
        return 1, f"{after[seeds[0]] - before[seeds[0]]:+.4f} (1 seed)"
    return len(seeds), interval_text(p, tie=True)


PLOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "allocation_budgets.png"
PLOT_ARMS = ("learned-ngrams", "flat-ngrams", "bpe-lm-ngrams", "uniform-ngrams", "whitespace-ngrams")


def budget_points(rows: list[dict]) -> dict[str, dict[str, list[tuple[float, float, float, int]]]]:
    """What `plot` draws from the final runs' records `rows`: {"flops" | "clock": {arm: [(mean training FLOPs,
    mean test BPB, its standard error over seeds, seeds)]}}, the matched-total-FLOPs runs of every scale (retired
    left out; each arm at its chosen width where a width check ran), and the clock series at the wall-clock
    allocations, each at the FLOPs its seconds bought."""
    recs = _at_chosen_width([r for r in rows if not r.get("retired") and r["arm"] in PLOT_ARMS])
    walloc = {s for s in _walloc_series(recs)  # a series stage 2 retired leaves its flat runs alone: not drawn
              if any(r["arm"] == "learned-ngrams" and r["budget"].get("series") == s for r in recs)}
    groups: dict[tuple[str, str, tuple], list[dict]] = {}
    for r in recs:
        scale, match, _, series = _budget_key(r)
        kind = "flops" if match == "flops-total" else "clock" if match == "time" and series in walloc else None
        if kind and r.get("flops_total"):
            groups.setdefault((kind, r["arm"], (scale, series)), []).append(r)
    out: dict[str, dict[str, list]] = {"flops": {}, "clock": {}}
    for (kind, arm, _), rs in sorted(groups.items()):
        bpb = [r["test"]["bpb"] for r in rs]
        se = statistics.stdev(bpb) / len(bpb) ** 0.5 if len(bpb) > 1 else 0.0
        out[kind].setdefault(arm, []).append(
            (statistics.mean(r["flops_total"] for r in rs), statistics.mean(bpb), se, len(rs)))
    for arms_ in out.values():
        for pts in arms_.values():
            pts.sort()
    return out


def plot(path: Path = RECORDS, out: Path = PLOT) -> Path:
    """docs/images/allocation_budgets.png: each method's test BPB against the training FLOPs it spent (log
    scale), mean ± s.e. over seeds: a line through its matched-total-FLOPs runs at ½x, x1 and 4x the budget (at
    its x1 allocation, or at 4x the width validation chose; dotted lines mark the budgets), and a hollow marker
    for its wall-clock runs at its clock allocation."""
    from learntok import records
    from learntok.viz.mpl import pyplot, save

    plt = pyplot()
    rows = records.load(path)
    pts = budget_points(rows)
    fig, ax = plt.subplots(figsize=(8, 6.5))
    colours = plt.get_cmap("tab10")
    for i, arm in enumerate(PLOT_ARMS):
        c, name = colours(i), arm.removesuffix("-ngrams")
        if arm in pts["flops"]:
            x, y, e, n = zip(*pts["flops"][arm])
            ax.errorbar(x, y, yerr=e, fmt="-o", color=c, ms=5, capsize=3,
                        label=f"{name}: matched total FLOPs ({min(n)}–{max(n)} seeds)" if min(n) != max(n)
                        else f"{name}: matched total FLOPs ({n[0]} seeds)")
        if arm in pts["clock"]:
            x, y, e, n = zip(*pts["clock"][arm])
            ax.errorbar(x, y, yerr=e, fmt="s", mfc="none", color=c, ms=7, capsize=3,
                        label=f"{name}: matched wall-clock, clock allocation ({max(n)} seeds)")
    budgets = {r["budget"]["scale"]: r["budget"]["flops_budget"] for r in rows
               if r["budget"]["match"] == "flops-total" and r["arm"] in pts["flops"]}
    for scale, flops in budgets.items():
        last = scale == max(budgets)  # its label left of its line, inside the axes
        ax.axvline(flops, ls=":", lw=0.8, color="grey")
        ax.annotate(f"{scale:g}× budget", (flops, 1), xycoords=("data", "axes fraction"),
                    xytext=(-3 if last else 3, -12), textcoords="offset points", fontsize=8, color="grey",
                    ha="right" if last else "left")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs, attention counted (log scale)")
    ax.set_ylabel("test bits per byte (mean ± s.e. over seeds)")
    ax.set_title("Every method at its allocation, with n-grams: test BPB against training compute")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    return save(fig, out)


def _walloc_series(rows: list[dict]) -> set[str]:
    """The clock series whose arms trained at each method's wall-clock allocation (`final --allocation clock`)."""
    return {r["budget"].get("series", "") for r in rows if r["budget"].get("allocation") == "clock"}


def levers_table(path: Path = RECORDS, preset: Path = PRESET_RECORDS) -> str:
    """What each lever of the study changed, paired over seeds at the x1 budget: on each arm's test BPB and on
    learned's difference to each method with the same embeddings. Levers: the n-gram tables (an arm with them −
    the arm without, at its own allocation and in the preset's shape); the allocation (its own width × depth −
    the small preset's shape, the first screen's runs); the accounting (matched total FLOPs − matched 6N,
    attention free); the clock (matched wall-clock − matched total FLOPs, per clock series); the budget (½x or 4x
    the FLOPs − x1, each arm at its x1 allocation, or the width check's choice); the width check (`_width_rows`).
    The same again at stage 1's allocation (the runs stage 2 retired, `_before_stage_2`) where it differs, and
    stage 2's own lever: today's runs − those, at matched total FLOPs."""
    from learntok import records

    recs = records.load(path)
    screen = _views(records.load(preset)).get((1.0, "flops-total", ""), {})
    walloc = _walloc_series(recs)
    every = [r for r in recs if not r.get("retired")]
    current = _at_chosen_width(every)
    before_stage_2 = _before_stage_2(recs)
    earlier = [{k: v for k, v in r.items() if k != "retired"} for r in before_stage_2]
    rows = _lever_rows(current, screen, walloc) + _width_rows(every)
    if any(r.get("retired") for r in before_stage_2):
        rows += [(lever, subject, f"{where} (stage 1)", change)
                 for lever, subject, where, change in _lever_rows(earlier, screen, walloc)
                 if (lever, subject, where, change) not in rows]
        after, before = (_views(x).get((1.0, "flops-total", ""), {}) for x in (current, earlier))
        for subject in sorted(set(after) & set(before)) + GAPS:
            if any(after.get(arm) == before.get(arm) for arm in subject.split(" − ")):
                continue  # runs stage 2 left alone change nothing; a gap to them repeats learned's own row
            x, y = _of(after, subject), _of(before, subject)
            if change := _change(x, y):
                rows.append(("allocation: stage 2's byte window and rate", subject, "total FLOPs", change))
    if not rows:
        return "(no paired runs yet)\n"
    out = ["| lever | test BPB of | where | seeds | change (95 % t over seeds) |", "|---|---|---|---|---|"]
    out += [f"| {lever} | {subject} | {where} | {n} | {text} |" for lever, subject, where, (n, text) in rows]
    return "\n".join(out) + "\n"


def _lever_rows(recs: list[dict], screen: dict, walloc: set[str]) -> list[tuple[str, str, str, tuple[int, str]]]:
    """`levers_table`'s rows (lever, subject, where, change) for these final runs' records, the preset screen's
    x1 runs (`screen`) the allocation lever's before."""
    now = _views(recs)
    total = now.get((1.0, "flops-total", ""), {})
    rows: list[tuple[str, str, str, tuple[int, str]]] = []

    def add(lever: str, where: str, after: dict, before: dict, subjects: list[str]) -> None:
        for subject in subjects:
            if change := _change(_of(after, subject), _of(before, subject)):
                rows.append((lever, subject, where, change))

    for where, view in (("its own allocation", total), ("the preset's shape", screen)):
        for m in METHODS:  # the n-gram arm against the plain one
            if change := _change(view.get(f"{m}-ngrams", {}), view.get(m, {})):
                rows.append(("n-gram embeddings", m, where, change))
        for b in (m for m in METHODS if m != "learned"):
            change = _change(_gap(view, "learned-ngrams", f"{b}-ngrams"), _gap(view, "learned", b))
            if change:
                rows.append(("n-gram embeddings", f"learned − {b}", where, change))
    for arm in CHUNKS:  # learned's difference to every other arm moves by the same
        if change := _change(total.get(arm, {}), total.get("learned-ngrams", {})):
            rows.append(("chunk embedding", "learned-ngrams", "its own allocation", change))
    add("allocation: own instead of the preset's", "total FLOPs", total, screen,
        sorted(set(total) & set(screen)) + GAPS)
    for conv in ("6n", "6n-padded"):
        matched = now.get((1.0, f"flops-{conv}", ""), {})
        add(f"accounting: total FLOPs instead of {SHORT['flops-' + conv]}", "own allocation", total, matched,
            sorted(matched) + GAPS)
    for (scale, match, series), clock in sorted(now.items()):
        if scale == 1.0 and match == "time":
            own = " (wall-clock allocations)" if series in walloc else ""  # two levers at once: clock and shape
            add("wall-clock instead of total FLOPs", f"clock series {series or 'a'}{own}", clock, total,
                sorted(clock) + GAPS)
    for (scale, match, series), view in sorted(now.items()):  # compute: where learned's lead grows or shrinks
        if scale != 1.0 and match == "flops-total" and not series:
            wider = any(_wider(r) and _budget_key(r)[:2] == (scale, match) for r in recs)
            add(f"budget: {scale:g}× instead of 1×", "total FLOPs, " + (WIDTH_CHOSEN if wider else "x1 allocation"),
                view, total, sorted(view) + GAPS)
    return rows


def _width_rows(recs: list[dict]) -> list[tuple[str, str, str, tuple[int, str]]]:
    """The width check's rows of the levers table, from the current final runs `recs` (both shapes): at each
    budget with runs one width step wider, each such arm's wider runs − its runs at its allocation, and learned's
    gap to each method with every checked arm wider − the same gap at the allocations, paired over seeds."""
    rows = []
    for key in sorted({_budget_key(r) for r in recs if _wider(r)}, key=_view_order):
        own: dict[str, dict[int, float]] = {}
        wide: dict[str, dict[int, float]] = {}
        for r in (r for r in recs if _budget_key(r) == key):
            (wide if _wider(r) else own).setdefault(r["arm"], {})[r["seed"]] = r["test"]["bpb"]
        where = f"x{key[0]:g} budget, {VIEWS[key[1]]}"
        for subject in sorted(wide) + [g for g in GAPS if any(arm in wide for arm in g.split(" − "))]:
            if change := _change(_of({**own, **wide}, subject), _of(own, subject)):
                rows.append(("allocation: one width step wider", subject, where, change))
    return rows


WIDTH_CHOSEN = "x1 allocation or a width step wider, validation's choice"
"""Where a budget's runs stand once its width check ran (`_at_chosen_width`)."""


TABLE_METHODS = ("flat", "bpe-lm", "uniform", "whitespace", "bpe", "entropy", "hnet")
"""The README table's rows, learned − each in this order."""
AT_UNIFORMS = ("bpe", "entropy", "hnet")
"""The methods the study runs at fixed patches' allocation (no sweep of their own)."""
NAMES = {"flat": "flat", "bpe-lm": "BPE transformer", "uniform": "fixed patches", "whitespace": "whitespace",
         "bpe": "BPE-guided boundaries", "entropy": "entropy patches", "hnet": "H-Net's chunker"}
SHORT = {"flops-total": "FLOPs", "time": "clock", "flops-6n": "6N", "flops-6n-padded": "padded 6N"}
Cell = tuple[str, list[int], dict]
"""learned − a method in one column: (clock series, paired seeds, paired t-interval)."""


def _table_cells(rows: list[dict], walloc: set[str]) -> dict[tuple[float, str, bool], dict[str, Cell]]:
    """learned − each of TABLE_METHODS over `rows` where two or more seeds pair, per column (scale, what the
    budget matched, without n-grams): with the tables learned-ngrams − the method's n-gram arm, without them
    learned − its plain arm. Of a pair's clock series the one at wall-clock allocations (`walloc`), else its
    first in `_view_order`: §8 has every series."""
    cells: dict[tuple[float, str, bool], dict[str, Cell]] = {}
    for key, arms_ in sorted(_by_budget(rows).items(), key=lambda kv: _view_order(kv[0])):
        scale, match, _, series = key
        for plain in (False, True):
            tail = "" if plain else "-ngrams"
            for m in TABLE_METHODS:
                seeds, p = _paired(arms_.get("learned" + tail, {}), arms_.get(m + tail, {}))
                column = cells.setdefault((scale, match, plain), {})
                if p is not None and (m not in column or series in walloc and column[m][0] not in walloc):
                    column[m] = (series, seeds, p)
    return {k: v for k, v in cells.items() if v}


def study_table(path: Path = RECORDS) -> str | None:
    """The README's item on the study: a paragraph saying how to read it, then a table of learned − each method
    (rows) in test BPB after the first 256 KB, mean ± 95 % t half-width over paired seeds, per convention and
    budget (columns, `_table_cells`); the x1 budget's conventions first, then the pairs without n-grams, then the
    other budgets (their runs keep the x1 allocation or the width check's choice). None before any pair has two
    seeds."""
    from learntok import records

    rows = records.load(path)
    walloc = _walloc_series(rows)
    current = _current(rows)
    cells = _table_cells(current, walloc)
    if not cells:
        return None
    columns = sorted(cells, key=lambda c: (c[0] != 1, c[0], c[2], list(VIEWS).index(c[1])))
    vocab = next((f" (vocabulary {int(f['--bpe-vocab-size']):,})" for r in reversed(current)
                  if r["method"] == "bpe-lm" and "--bpe-vocab-size" in (f := _options(r["flags"]))), "")
    intro = ("- The allocation study ([§8](docs/results.md#8-every-method-at-its-own-allocation)): learned − "
             "each method, test BPB on text no earlier screen read, mean ± 95 % t half-width over paired seeds "
             "(their number); negative: learned better. Each method at its allocation chosen on validation, with "
             "hashed byte n-grams (but for *no n-grams*); total FLOPs count attention, the paper's 6N leaves it out.")
    others = [NAMES[m] for m in AT_UNIFORMS if any(m in column for column in cells.values())]
    if others:
        said = _and(others)
        intro += f" {said[0].upper()}{said[1:]}: at fixed patches' allocation."
    if (1.0, "time", False) in cells:
        series = {s for s, *_ in cells[1.0, "time", False].values()}
        intro += (" Wall-clock: the flat model's seconds" + (", each at its wall-clock width × depth"
                  if series <= walloc else "") + _clock_flops(current, (1.0, "time"), series)
                  + (f"; its rows come from {len(series)} series, each row's pair back to back in one sitting and the"
                     " sittings at different machine speeds, so read it row by row" if len(series) > 1 else "") + ".")
    scales = sorted({c[0] for c in columns if c[0] != 1})
    if scales:
        wider = sorted({_name(r["arm"]) for r in current if _wider(r) and _budget_key(r)[0] in scales})
        intro += (f" {' and '.join(f'{x:g}×' for x in scales)}: at the x1 allocation"
                  + (f" or one width step wider where validation preferred it ({_and(wider)})" if wider else "")
                  + ".")

    def title(c: tuple[float, str, bool]) -> str:
        return ("" if c[0] == 1 else f"{c[0]:g}× ") + VIEWS[c[1]] + (", *no n-grams*" if c[2] else "")

    def text(cell: Cell | None) -> str:
        if cell is None:
            return ""
        p = cell[2]
        d = 4 if 5e-5 <= p["half"] < 5e-4 else 3  # a half-width under 0.0005 is not 0.000
        return f"{p['mean']:+.{d}f} ± {p['half']:.{d}f} ({len(cell[1])}){' *tie*' if p['tie'] else ''}"

    lines = ["| learned − | " + " | ".join(map(title, columns)) + " |", "|---" * (len(columns) + 1) + "|"]
    for m in TABLE_METHODS:
        if any(m in cells[c] for c in columns):
            lines.append(f"| {NAMES[m]}{vocab if m == 'bpe-lm' else ''} | "
                         + " | ".join(text(cells[c].get(m)) for c in columns) + " |")
    return intro + "\n\n" + "\n".join(lines)


def _before_stage_2(rows: list[dict]) -> list[dict]:
    """The final runs as they stood at stage 1's allocation (the preset's byte window and rate): those `retire`
    moved aside when stage 2 gave their method a byte window, beside the current runs at that window and rate (the
    methods stage 2 gives none, flat and the BPE transformer, which they were paired with, and the arms a later
    stage 2 sent back to it); at the x1 budget, the only one stage 1's runs trained at."""
    return [r for r in rows if _at_stage_1(r) and _budget_key(r)[0] == 1
            and (not r.get("retired") or "--byte-window" in r["retired"]["now"])]


def _at_stage_1(r: dict) -> bool:
    """Whether a final run trained at the preset's byte window 8 and rate RATE (stage 1's; flat and the BPE
    transformer have neither), given or left to the preset."""
    given = _options(r.get("flags", []))
    return given.get("--byte-window", "8") == "8" and float(given.get("--target-rate", RATE)) == RATE


def _clock_flops(rows: list[dict], view: tuple[float, str], series: set[str]) -> str:
    """What the seconds of a clock view bought: the range of its `series`' runs' (among `rows`) total FLOPs as a
    fraction of the view's FLOPs budget, since a clock result on a slow machine is also a smaller budget; "" when
    no run recorded its FLOPs."""
    got = [r["flops_total"] for r in rows if r.get("flops_total") and _budget_key(r)[:2] == view
           and r["budget"].get("series", "") in series]
    if not got:
        return ""
    ref = budget(view[0])  # builds a model: once a view, not once a run
    return f" ({min(got) / ref:.2f}–{max(got) / ref:.2f}× the FLOPs budget on this CPU)"


def _name(arm: str) -> str:
    """A method's name in the README's line: NAMES', learned's own (n-gram arms by their method's)."""
    method = arm.removesuffix("-ngrams")
    return NAMES.get(method, method)


def _and(names: list[str]) -> str:
    """`a`, `a and b`, `a, b and c`."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def summary(path: Path = HERE / "records-preset.jsonl") -> str | None:
    """The README's line on issue 30 before the study has paired seeds (`study_table`): the preset-allocation
    screen's (one seed); None without its records."""
    from learntok import records

    rows = [r for r in records.load(path) if r["seed"] == 0]
    bpb = {r["arm"]: r["test"]["bpb"] for r in rows}
    needed = [f"{m}{v}" for m in ("learned", "flat", "bpe-lm", "uniform") for v in ("", "-ngrams")]
    if any(a not in bpb for a in needed):
        return None

    def d(a: str, b: str) -> str:
        return f"{bpb[a] - bpb[b]:+.3f}"

    return ("- A first screen of issue 30 (one seed, every method in the `small` preset's shape, in which flat spends "
            "three times the U-Net's FLOPs per byte; matched *total* training FLOPs: attention counted): test BPB, "
            "learned − flat byte transformer " + d("learned", "flat")
            + ", learned − BPE transformer " + d("learned", "bpe-lm") + "; with hashed byte n-grams for both (token "
            "n-grams for BPE) " + d("learned-ngrams", "flat-ngrams") + " and " + d("learned-ngrams", "bpe-lm-ngrams")
            + "; learned − fixed patches " + d("learned", "uniform") + " / " + d("learned-ngrams", "uniform-ngrams")
            + ". One seed and one shape: a lead, not yet a result ([§8](docs/results.md"
            "#8-every-method-at-its-own-allocation))"
            + _flat_so_far(next(r["val"]["bpb"] for r in rows if r["arm"] == "learned")) + ".")


def _flat_so_far(learned_val: float) -> str:
    """The README's caveat once flat's sweep has cells: its best validation BPB against learned's preset shape
    (`learned_val`), or against learned's own best once learned's sweep has cells too."""
    from learntok import records

    rows = [r for r in records.load(SWEEP_RECORDS) if r["stage"] == 1 and not r.get("clock")]
    flat = [r["val_bpb"] for r in rows if r["method"] == "flat"]
    learned = [r["val_bpb"] for r in rows if r["method"] == "learned"]
    if not flat:
        return ""
    if learned:
        return (f"; but at each one's best width and depth (stage 1: the narrowest tried, validation) learned − "
                f"flat is {min(learned) - min(flat):+.3f} before n-grams: the screen's lead came from flat's shape")
    return (f"; but flat at its best width and depth so far (stage 1) is {min(flat) - learned_val:+.3f} on "
            "validation against learned in the preset's shape, so learned's own sweep decides")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="stage 1 (width x depth) or 2 (byte window, rate) for every method")
    s.add_argument("--data", type=Path, required=True)
    s.add_argument("--out", type=Path, default=Path("runs/alloc"))
    s.add_argument("--stage", type=int, choices=(1, 2), default=1)
    s.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(SWEPT))
    s.add_argument("--seeds", type=int, nargs="+", default=[0])
    s.add_argument("--ngrams", action="store_true", help="with --stage 2: the sweep of the n-gram arms (and the "
                   "clock sweep), with the tables, in sweep2n-METHOD")
    s.add_argument("--budget-bytes", type=float, default=BUDGET_BYTES, help="the reference bytes (a smoke test: 2e4)")
    s.add_argument("--clock", action="store_true", help="stage 1 with the n-gram tables at matched seconds (the "
                   "n-gram arms' clock finals' seconds)")
    c = sub.add_parser("collect", help="copy the sweep cells' records into the repository")
    c.add_argument("--out", type=Path, default=Path("runs/alloc"))
    c.add_argument("--results", type=Path, default=SWEEP_RECORDS)
    b = sub.add_parser("best", help="the allocation each method trains with (chosen on validation)")
    b.add_argument("--out", type=Path, default=Path("runs/alloc"))
    f = sub.add_parser("final", help="every method at its allocation, with seeds, at budget x --scale")
    f.add_argument("--data", type=Path, required=True)
    f.add_argument("--out", type=Path, default=Path("runs/alloc"))
    f.add_argument("--scale", type=float, default=1.0)
    f.add_argument("--clock", action="store_true", help="train for the flat arm's seconds instead (matched time)")
    f.add_argument("--series", default="", help="with --clock: a new set of clock runs, paired only among "
                   "themselves (run directories ...-clock-NAME-seedS), for arms that must train beside each other "
                   "after the first set, e.g. learned-ngrams bpe-lm-ngrams")
    f.add_argument("--convention", choices=("total", "6n", "6n-padded"), default="total",
                   help="the FLOPs convention the budget is matched in (total: attention counted; 6n: the paper's, "
                   "the accounting lever's control; run directories ...-x1-6n-seedS)")
    f.add_argument("--allocation", choices=("flops", "clock", "wider", "chosen"), default="flops",
                   help="the allocation each arm trains at: the FLOPs sweep's; (with --clock and a --series) the "
                   "clock sweep's, each method's wall-clock optimum (run directories ...-walloc-clock-SERIES-seedS); "
                   "the FLOPs sweep's one width step wider (the width check of a budget the sweeps did not reach, "
                   "...-wider-seedS); or whichever of those two validation preferred at this budget on the seeds "
                   "both trained (chosen)")
    f.add_argument("--results", type=Path, default=RECORDS, help="where --allocation chosen reads validation")
    f.add_argument("--ngrams", action="store_true", help="also each n-gram variant, and learned-ngrams-chunks (the "
                   "chunk embedding on top, at learned-ngrams' allocation)")
    f.add_argument("--arms", nargs="+", choices=[a for a, _, _ in _arms(True)],
                   help="only these arms (e.g. learned-ngrams flat-ngrams); default: all")
    f.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    f.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    f.add_argument("--budget-bytes", type=float, default=BUDGET_BYTES, help="the reference bytes (a smoke test: 2e4)")
    f.add_argument("--few-seeds", type=int, default=3, help="seeds of the methods outside " + ", ".join(MANY_SEEDS))
    t = sub.add_parser("retire", help="move aside final runs whose method's allocation changed; mark their records")
    t.add_argument("--out", type=Path, default=Path("runs/alloc"))
    t.add_argument("--results", type=Path, default=RECORDS)
    t.add_argument("--sweep-results", type=Path, default=SWEEP_RECORDS, help="where stale clock sweeps' cells are "
                   "marked retired")
    e = sub.add_parser("evaluate", help="test split after its first 256 KB, per document; and validation")
    e.add_argument("--out", type=Path, default=Path("runs/alloc"))
    e.add_argument("--results", type=Path, default=RECORDS)
    e.add_argument("--val-bytes", type=int, default=SKIP_BYTES, help="validation bytes scored (the first ones)")
    e.add_argument("--test-bytes", type=int, default=TEST_BYTES, help="test bytes scored, after the first 256 KB")
    o = sub.add_parser("restore", help="OUT's sweep cells and finished finals from the records (a new machine)")
    o.add_argument("--out", type=Path, default=Path("runs/alloc"))
    o.add_argument("--results", type=Path, default=RECORDS)
    o.add_argument("--sweep-results", type=Path, default=SWEEP_RECORDS)
    k = sub.add_parser("classes", help="the byte arms' test bits by byte class (where learned's lead lies)")
    k.add_argument("--out", type=Path, default=Path("runs/alloc"))
    k.add_argument("--results", type=Path, default=RECORDS)
    k.add_argument("--class-results", type=Path, default=CLASS_RECORDS)
    k.add_argument("--scale", type=float, default=1.0, help="the budget's runs (x1 by default)")
    k.add_argument("--clock", action="store_true", help="its clock series' runs instead of matched total FLOPs")
    k.add_argument("--test-bytes", type=int, default=TEST_BYTES, help="test bytes scored, after the first 256 KB")
    r = sub.add_parser("report", help="the tables")
    r.add_argument("--results", type=Path, default=RECORDS)
    args = ap.parse_args()
    if args.cmd == "report":
        print(report(args.results))
    else:
        {"sweep": cmd_sweep, "collect": cmd_collect, "best": cmd_best, "final": cmd_final,
         "evaluate": cmd_evaluate, "retire": cmd_retire, "restore": cmd_restore, "classes": cmd_classes}[args.cmd](args)


if __name__ == "__main__":
    main()
