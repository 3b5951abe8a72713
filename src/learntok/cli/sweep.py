"""`learntok sweep`: one training run per cell of a grid of settings, every cell at the same FLOPs or time budget.

    learntok sweep runs/alloc --flops-budget 1.6e13 --axis d-model=96,128,192 --axis n-mid=2,3,4 \
        -- --preset small --data DATA/enwiki --boundaries uniform

An axis is a `learntok train` flag (without its dashes) and its values; axes multiply. `FLAG1,FLAG2=A1:B1,A2:B2` moves
two flags together (the paper's aspect-ratio study: `--axis n-mid,target-rate=2:0.5,3:0.3333,5:0.2`). Every cell trains
`learntok train` with the flags after `--`, its axis values, `--seed S`, and `--flops-budget` on a FLOPs schedule (the
cosine decays fully at the budget, in `--flops-convention`) or `--time-budget` on a time schedule (every cell trains for
the same seconds: the matched wall-clock view, which is only as fair as the machine is quiet), in its own run directory
under OUT; cells run one at a time in child processes. The sweep is resumable: a finished cell (its record in
OUT/sweep.jsonl) is skipped and an interrupted one continues from its checkpoint. Each finished cell appends a record
(learntok.records: the command, config, git SHA, versions, machine, the three FLOPs counts, seconds, validation BPB and
rate); OUT/sweep.md (a table, best first) and OUT/sweep.png (validation BPB against each axis, with [viz]) are rewritten
after every cell. Validation BPB is the run's own final evaluation: settings are chosen on validation, never on test.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from learntok.cli import UsageError, parse
from learntok.errors import TrainingError

RECORDS = "sweep.jsonl"
CONVENTION_KEYS = {"6n": "flops", "6n-padded": "flops_padded", "total": "flops_total"}


@dataclass(frozen=True, kw_only=True)
class SweepArgs:
    out: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")]
    """Directory of the sweep: a run directory per cell, sweep.jsonl, sweep.md, sweep.png."""
    axis: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """FLAG=V1,V2,... : a `learntok train` flag without its dashes and its values (repeat for more axes; they
    multiply); FLAG1,FLAG2=A1:B1,A2:B2 moves two flags together."""
    flops_budget: float = 0.0
    """Training FLOPs of every cell."""
    time_budget: float = 0.0
    """Training seconds of every cell (a time schedule), instead of --flops-budget."""
    flops_convention: Literal["6n", "6n-padded", "total"] = "6n"
    """What the budget counts: the paper's 6N, 6N with padded token slots, or 6N + attention (docs/method.md §6)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds: every cell trains once per seed."""
    report: bool = False
    """Only rewrite sweep.md and sweep.png from the finished cells (no training)."""

    def __post_init__(self) -> None:
        if not self.report and (self.flops_budget > 0) == (self.time_budget > 0):
            raise ValueError("give --flops-budget FLOPS or --time-budget SECONDS (one of them): every cell trains "
                             "to the same budget")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"--seeds: give one or more distinct seeds (got {' '.join(map(str, self.seeds))})")

    def budget(self) -> tuple[str, float]:
        """(the metrics key the budget is counted in, the budget)."""
        if self.time_budget:
            return "time", self.time_budget
        return CONVENTION_KEYS[self.flops_convention], self.flops_budget

    def matched(self) -> dict:
        """What every cell is matched in, for its record."""
        if self.time_budget:
            return {"time_budget": self.time_budget}
        return {"flops_budget": self.flops_budget, "flops_convention": self.flops_convention}

    def budget_flags(self) -> list[str]:
        if self.time_budget:
            return ["--time-budget", f"{self.time_budget:.6g}", "--schedule", "time"]
        return ["--flops-budget", f"{self.flops_budget:.6g}", "--flops-convention", self.flops_convention,
                "--schedule", "flops"]


SWEEP_SETS = ("seed", "out", "flops-budget", "flops-convention", "time-budget", "schedule", "max-bytes", "max-steps",
              "progress-style", "resume", "overwrite")
"""Train flags the sweep sets for every cell itself: an axis or a train flag naming one would be overridden."""


def check_train_flags(train_flags: list[str]) -> None:
    """Refuse train flags (after --) that the sweep sets itself (SWEEP_SETS)."""
    named = [f for f in train_flags if f.startswith("--") and f[2:].partition("=")[0] in SWEEP_SETS]
    if named:
        raise UsageError(f"{' '.join(named)}: the sweep sets these for every cell (use --seeds, OUT and the budget "
                         "options of `learntok sweep`)")


def parse_axes(specs: tuple[str, ...]) -> list[tuple[tuple[str, ...], list[tuple[str, ...]]]]:
    """[(flags, [values per point])] of the --axis specs; a bad spec is a UsageError naming it."""
    axes = []
    for spec in specs:
        names, eq, values = spec.partition("=")
        flags = tuple(n.strip().lstrip("-") for n in names.split(","))
        points = [tuple(v.strip() for v in point.split(":")) for point in values.split(",") if point.strip()]
        if not eq or not all(flags) or not points or any(len(p) != len(flags) for p in points):
            raise UsageError(f"--axis {spec}: write FLAG=V1,V2 (or FLAG1,FLAG2=A1:B1,A2:B2, one value per flag)")
        if set(flags) & set(SWEEP_SETS):
            raise UsageError(f"--axis {spec}: the sweep sets --{', --'.join(sorted(set(flags) & set(SWEEP_SETS)))} "
                             "for every cell itself (seeds: --seeds; the budget: one sweep per budget)")
        if len(set(points)) != len(points):
            raise UsageError(f"--axis {spec}: a value is repeated")
        axes.append((flags, points))
    return axes


def cells(axes) -> list[dict[str, str]]:
    """Every combination of the axes' points: flag -> value."""
    grid = itertools.product(*[[dict(zip(flags, p)) for p in points] for flags, points in axes])
    return [{k: v for part in combo for k, v in part.items()} for combo in grid]


def cell_name(cell: dict[str, str], seed: int) -> str:
    parts = [f"{k}_{v}".replace("/", "-") for k, v in cell.items()]
    return "__".join([*parts, f"seed{seed}"])


def cell_argv(train_flags: list[str], cell: dict[str, str], seed: int, out: Path, a: SweepArgs) -> list[str]:
    more = [x for k, v in cell.items() for x in (f"--{k}", v)]
    return [*train_flags, *more, "--seed", str(seed), "--out", str(out), *a.budget_flags(), "--max-bytes", "0",
            "--progress-style", "lines"]


def _finished(run: Path, budget: float, key: str) -> dict | None:
    """The run's final evaluation line if it trained to the budget (its last metrics line is an evaluation at or
    beyond the budget, counted in the metrics' `key`: FLOPs in a convention, or seconds), else None."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return None
    lines = []
    for x in path.read_text().splitlines():
        try:
            lines.append(json.loads(x))
        except ValueError:  # a line cut short by a kill (truncate_metrics drops it when the run resumes)
            continue
    evals = [r for r in lines if "val/bpb" in r]
    if not evals or lines[-1] is not evals[-1] or evals[-1].get(key, 0) < budget * (1 - 1e-9):
        return None
    return evals[-1]


def _same_cell(run: Path, argv: list[str]) -> None:
    """Keep each cell's command in RUN.cell.json beside its run directory; a cell started with other flags (the
    train flags or the budget changed between invocations) is an error instead of a silent mix."""
    path = run.with_name(run.name + ".cell.json")
    if path.exists() and _canonical(json.loads(path.read_text())) != _canonical(argv):
        raise UsageError(f"{run} was started with other flags ({' '.join(json.loads(path.read_text()))}); give the "
                         "sweep the flags it began with, another OUT, or remove that cell's directory")
    path.write_text(json.dumps(argv) + "\n")


def _canonical(argv: list[str]) -> list[str]:
    """`argv` with the values of path flags resolved, so that OUT or DATA spelled another way (relative, through
    a link) is the same cell."""
    out = list(argv)
    for i, flag in enumerate(out[:-1]):
        if flag in ("--out", "--data", "--val-data") and (flag == "--out" or Path(out[i + 1]).exists()):
            out[i + 1] = str(Path(out[i + 1]).resolve())
    return out


def record(run: Path, cell: dict, seed: int, command: list[str], wall: float | None, final: dict,
           budget: dict | None = None) -> dict:
    """A finished cell's record; `budget` says what every cell of its sweep was matched in."""
    from learntok import records
    from learntok.config import from_dict
    from learntok.model import build_model

    config, prov = records.run_provenance(run)
    cfg = from_dict(config)
    byte, token = build_model(cfg.model, cfg.boundary).matrix_params()
    return records.make("sweep", cell_name(cell, seed).rsplit("__seed", 1)[0] or "cell", seed,
                        command="learntok " + " ".join(command), prov=prov, axes=cell, budget=budget or {},
                        config=config, byte_params=byte, token_params=token, bytes=final["bytes"], steps=final["step"],
                        **{k: final[k] for k in CONVENTION_KEYS.values() if k in final},
                        train_seconds=final["time"], wall_seconds=wall, val_bpb=final["val/bpb"],
                        val_rate=final["val/rate"])


def table(rows: list[dict]) -> str:
    """Markdown: one line per cell (mean ± standard error over its seeds), best validation BPB first."""
    if not rows:
        return "(no finished cells yet)\n"
    axes = list(dict.fromkeys(k for r in rows for k in r["axes"]))
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r["axes"].get(k, "") for k in axes), []).append(r)

    def ms(xs: list[float], fmt: str) -> str:
        if len(xs) == 1:
            return format(xs[0], fmt)
        return f"{format(statistics.mean(xs), fmt)} ± {format(statistics.stdev(xs) / math.sqrt(len(xs)), fmt)}"

    order = sorted(groups, key=lambda g: statistics.mean(r["val_bpb"] for r in groups[g]))
    lines = ["| " + " | ".join(axes) + " | seeds | val BPB | val rate | matrix params (byte + token) | MB | "
             "GFLOPs 6N / padded / total | train s |", "|" + "---|" * (len(axes) + 7)]
    for g in order:
        rs = groups[g]
        fl = " / ".join(f"{statistics.mean(r.get(k, math.nan) for r in rs) / 1e9:.1f}"
                        for k in CONVENTION_KEYS.values())
        lines.append("| " + " | ".join(g) + f" | {len(rs)} | {ms([r['val_bpb'] for r in rs], '.4f')} | "
                     f"{ms([r['val_rate'] for r in rs], '.3f')} | {rs[0]['byte_params']:,} + {rs[0]['token_params']:,}"
                     f" | {statistics.mean(r['bytes'] for r in rs) / 1e6:.2f} | {fl} | "
                     f"{statistics.mean(r['train_seconds'] for r in rs):.0f} |")
    return "\n".join(lines) + "\n"


def _matched(rows: list[dict]) -> str:
    """What the cells were matched in, for the plot's title (records older than `budget` were all FLOPs)."""
    return "training time" if any("time_budget" in r.get("budget", {}) for r in rows) else "FLOPs budget"


def plot(rows: list[dict], path: Path) -> Path | None:
    """Validation BPB against each axis (every cell a point; the line joins the best cell at each value)."""
    from learntok.viz.mpl import pyplot, save

    axes = list(dict.fromkeys(k for r in rows for k in r["axes"]))
    if not rows or not axes:
        return None
    plt = pyplot()
    fig, subs = plt.subplots(1, len(axes), figsize=(4.5 * len(axes), 4), squeeze=False)
    for ax, name in zip(subs[0], axes):
        values = list(dict.fromkeys(r["axes"][name] for r in rows))
        try:
            xs = {v: float(v) for v in values}
        except ValueError:
            xs = {v: float(i) for i, v in enumerate(values)}
            ax.set_xticks(list(xs.values()), values)
        ax.scatter([xs[r["axes"][name]] for r in rows], [r["val_bpb"] for r in rows], s=14, alpha=0.6)
        best = sorted((xs[v], min(r["val_bpb"] for r in rows if r["axes"][name] == v)) for v in values)
        ax.plot(*zip(*best), "-", lw=1.2)
        ax.set_xlabel(name)
        ax.set_ylabel("validation BPB")
        ax.grid(alpha=0.3)
    fig.suptitle(f"learntok sweep: every cell at the same {_matched(rows)}")
    fig.tight_layout()
    return save(fig, path, dpi=110)


def write_reports(out: Path, rows: list[dict]) -> None:
    (out / "sweep.md").write_text(table(rows))
    try:
        plot(rows, out / "sweep.png")
    except ImportError:  # matplotlib is optional ([viz]): the table is enough
        pass


def sweep(out: str | Path, axes: dict[str, Sequence], *, train_flags: Sequence[str] = (), flops_budget: float = 0.0,
          time_budget: float = 0.0, flops_convention: Literal["6n", "6n-padded", "total"] = "6n",
          seeds: Sequence[int] = (0,)) -> list[dict]:
    """`learntok sweep` from Python: every cell of `axes` ({"d-model": [64, 96], "n-mid,target-rate": [(2, 0.5),
    (3, 0.333)]}: a `learntok train` flag without its dashes, or flags moved together, and its values) trained with
    `train_flags` to one budget, resumable as the command is; returns the sweep's records, one per finished cell
    and seed (OUT/sweep.jsonl)."""
    from learntok import records

    spec = tuple(f"{flag}=" + ",".join(":".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
                                       for v in values) for flag, values in axes.items())
    a = SweepArgs(out=str(out), axis=spec, flops_budget=flops_budget, time_budget=time_budget,
                  flops_convention=flops_convention, seeds=tuple(seeds))
    run_sweep(a, list(train_flags))
    return records.load(Path(out) / RECORDS)


def cmd_sweep(argv: list[str]) -> int:
    """`learntok sweep OUT --axis FLAG=V1,V2 ... --flops-budget F | --time-budget S [-- TRAIN FLAGS]`."""
    from learntok import records

    own, train_flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    a = parse(SweepArgs, own, "learntok sweep", __doc__ or "")
    if a.report:
        out = Path(a.out)
        if not (out / RECORDS).is_file():
            raise FileNotFoundError(f"{out}: not a sweep directory (no {RECORDS}; run the sweep first)")
        rows = records.load(out / RECORDS)
        write_reports(out, rows)
        print(table(rows), end="")
        return 0
    run_sweep(a, train_flags)
    return 0


def run_sweep(a: SweepArgs, train_flags: list[str]) -> None:
    """Train every cell of `a`'s grid not yet recorded (one child `learntok train` at a time), record each, rewrite
    the table and plot after each; every cell's flags are checked before anything trains."""
    from learntok import records
    from learntok.cli.train import parse_train_args
    from learntok.train.schedule import check_config

    out = Path(a.out)
    path = out / RECORDS
    if not a.axis:
        raise UsageError("give at least one --axis FLAG=V1,V2")
    check_train_flags(train_flags)
    grid = cells(parse_axes(a.axis))
    for cell in grid:  # every cell's flags are checked before anything trains
        try:
            check_config(parse_train_args(cell_argv(train_flags, cell, a.seeds[0], out / "check", a)))
        except (ValueError, SystemExit) as e:
            raise UsageError(f"cell {cell}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    key, amount = a.budget()
    done = {(json.dumps(r["axes"], sort_keys=True), r["seed"]) for r in records.load(path)}
    for seed in a.seeds:
        for cell in grid:
            run = out / cell_name(cell, seed)
            argv_cell = ["train", *cell_argv(train_flags, cell, seed, run, a)]
            _same_cell(run, argv_cell)  # a recorded cell too: another budget or flags would mix in the table
            if (json.dumps(cell, sort_keys=True), seed) in done:
                continue
            final = _finished(run, amount, key)
            t0, trained = time.time(), final is None
            if final is None:
                resume = (run / "latest").exists()
                child = ["train", "--resume", str(run), "--progress-style", "lines"] if resume else \
                    [*argv_cell, "--overwrite"]
                print(f"cell {cell_name(cell, seed)}: {'resuming' if resume else 'training'}", flush=True)
                with open(out / f"{cell_name(cell, seed)}.log", "a") as log:
                    code = subprocess.run([sys.executable, "-m", "learntok", *child], stdout=log,
                                          stderr=subprocess.STDOUT).returncode
                final = _finished(run, amount, key)
                if code != 0 or final is None:
                    raise TrainingError(f"cell {cell_name(cell, seed)} stopped before its budget (exit {code}); see "
                                        f"{out / (cell_name(cell, seed) + '.log')}; run the sweep again to resume it")
            rec = record(run, cell, seed, argv_cell, time.time() - t0 if trained else None, final, a.matched())
            records.append(path, rec)
            write_reports(out, records.load(path))
            print(f"cell {cell_name(cell, seed)}: val BPB {rec['val_bpb']:.4f}, rate {rec['val_rate']:.3f}, "
                  f"{rec['bytes'] / 1e6:.2f} MB", flush=True)
    rows = records.load(path)
    print(table(rows), end="")
    print(f"written: {path}, {out / 'sweep.md'}" + (f", {out / 'sweep.png'}" if (out / "sweep.png").exists() else ""))
