"""`learntok eval` (the paper's evaluation of one checkpoint) and `learntok compare` (runs side by side)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from learntok.cli import UsageError, parse
from learntok.draw import EVAL_SEED

EVAL_DESCRIPTION = """Evaluate a trained learntok model the paper's way: downstream tasks (bits per byte of the gold
continuation, accuracy), held-out bits per byte, boundary statistics and inference FLOPs per byte.

examples:
  learntok eval runs/tiny                               # all four tasks + held-out BPB on the run's validation split
  learntok eval runs/tiny --limit 50 --tasks piqa,lambada
  learntok eval runs/tiny/step_000500 --split test --boundaries-mode greedy
  learntok eval runs/tiny --boundaries-mode average --samples 8 --tasks none"""


@dataclass(frozen=True, kw_only=True)
class EvalArgs:
    checkpoint: Annotated[str, tyro.conf.Positional]
    """Run directory (its newest intact checkpoint), checkpoint directory run/step_N, exported model directory or
    Hugging Face Hub id user/name (those two need --data for held-out BPB)."""
    data: str | None = None
    """Held-out text instead of the run's split: any data spec `learntok train` accepts (all its documents)."""
    split: Literal["val", "test"] = "val"
    """Split of the run's data for held-out BPB (test: the data directory's test* files)."""
    tasks: str = "piqa,hellaswag,arc_easy,lambada"
    """Comma-separated tasks; NAME=PATH scores a file of that format; 'none' skips them."""
    task_dir: str | None = None
    """Directory of the task files (default: $LEARNTOK_EVAL_DIR)."""
    limit: int = 0
    """Examples per task and held-out sequences, for a quick look (0 = all)."""
    heldout: bool = True
    """Held-out BPB and boundary statistics (--no-heldout skips them)."""
    robustness: bool = False
    """Also character-level robustness on the held-out text: CUTE-style tasks (spell, insert, delete, ...) and
    BPB of text with 1-10 % random byte edits (learntok.evaluation.robustness)."""
    boundaries_mode: Literal["sample", "greedy", "average"] = "sample"
    """Boundaries at evaluation: one sample with --seed (the paper), greedy (p > 0.5), or --samples draws averaged
    in probability space."""
    samples: int = 4
    """k for --boundaries-mode average."""
    seed: int = EVAL_SEED
    """Seed of the boundary noise."""
    batch_size: int = 16
    """Rows per forward pass."""
    max_bytes: int = 0
    """Held-out bytes to evaluate (0 = the whole split)."""
    bpe_tokenizer: str | None = None
    """tokenizer.json of a byte-level BPE: also compare boundaries with its token starts."""
    out: str | None = None
    """Where to write the report (default: RUN_DIR/eval.json)."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto."""
    threads: int = 0
    """CPU threads (0 = PyTorch's default; on a busy shared machine 1 can be much faster)."""
    progress: bool = True
    """Progress bars."""

    def __post_init__(self) -> None:
        for name in ("limit", "samples", "seed", "max_bytes", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise ValueError("--batch-size must be at least 1")


def cmd_eval(argv: list[str]) -> int:
    """`learntok eval CHECKPOINT [options]`: print the report and write eval.json."""
    a = parse(EvalArgs, argv, "learntok eval", EVAL_DESCRIPTION)
    import torch

    from learntok.config import DataConfig, TrainConfig
    from learntok.device import resolve_device
    from learntok.evaluation.bpb import BoundaryMode
    from learntok.evaluation.report import EvalConfig, evaluate_model, format_report, merge_eval, read_eval, write_eval
    from learntok.pretrained import load

    if a.threads:
        torch.set_num_threads(a.threads)
    mode = BoundaryMode(a.boundaries_mode, a.samples if a.boundaries_mode == "average" else 1, a.seed)
    opts = EvalConfig(data=a.data, split=a.split, tasks=a.tasks, task_dir=a.task_dir, limit=a.limit, mode=mode,
                      batch_size=a.batch_size, max_bytes=a.max_bytes, bpe_tokenizer=a.bpe_tokenizer,
                      heldout=a.heldout, robustness=a.robustness, progress=a.progress)
    loaded = load(a.checkpoint, resolve_device(a.device))
    if loaded.cfg is None and a.heldout and a.data is None:
        raise UsageError(f"{a.checkpoint} is an exported model, not a training run, so it has no held-out split: "
                         "give --data PATH (any data spec learntok train accepts) or --no-heldout")
    model, ckpt, run_dir = loaded.model, loaded.checkpoint, loaded.run_dir
    cfg = loaded.cfg or TrainConfig(model=model.cfg, boundary=model.bcfg, data=DataConfig(seq_len=loaded.seq_len))
    where = ckpt or loaded.hub_id or loaded.path
    print(f"learntok eval {a.checkpoint}: {where}", file=sys.stderr)
    default_dir = run_dir or (Path(".") if loaded.hub_id else loaded.path)
    path = Path(a.out) if a.out else default_dir / "eval.json"
    try:
        previous = read_eval(path) if path.exists() else None
    except ValueError:
        previous = None  # another version or a damaged file: replaced
    ident = {"checkpoint": str(where), "run": str(run_dir or loaded.hub_id or loaded.path)}

    def save(part: dict) -> Path:  # after every task: an interrupted evaluation keeps what finished
        return write_eval(path, merge_eval(previous, {**part, **ident}))

    report = evaluate_model(cfg, model, opts, log=lambda s: print(s, file=sys.stderr), on_part=save)
    report = merge_eval(previous, {**report, **ident})
    out = write_eval(path, report)
    print(format_report(report, title=f"\n{run_dir or loaded.hub_id or loaded.path} ({ckpt.name if ckpt else 'model'}, "
                                       f"boundaries {cfg.boundary.boundaries})"))
    print(f"written: {out}")
    return 0


@dataclass(frozen=True, kw_only=True)
class CompareArgs:
    """Put evaluated runs side by side in the layout of the paper's Table 1 and Table 3 (reads each run's
    eval.json from `learntok eval` and its config.json)."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional]
    """Run directories (or eval.json files)."""
    out: str = "."
    """Directory for comparison.md, table1.csv, table3.csv."""


def cmd_compare(argv: list[str]) -> int:
    """`learntok compare RUN_DIR... [--out DIR]`: Table 1 and Table 3 as Markdown and CSV."""
    from learntok.evaluation.compare import compare

    a = parse(CompareArgs, argv, "learntok compare", CompareArgs.__doc__ or "")
    if not a.runs:
        raise UsageError("learntok compare: give at least one run directory")
    md, paths = compare(list(a.runs), a.out)
    print(md)
    print("written: " + ", ".join(str(x) for x in paths))
    return 0


@dataclass(frozen=True, kw_only=True)
class EvalDataArgs:
    """Get the evaluation data `learntok eval` reads: fetch downloads PIQA, HellaSwag, ARC-Easy and LAMBADA from
    the Hugging Face Hub with `datasets` (pip install 'learntok[hf]') and converts them to its task files, with
    checksums (checksums.json); verify re-checks the files against them.

    examples:
      learntok eval-data fetch                      # all four, into ~/.cache/learntok/eval ($LEARNTOK_EVAL_DIR)
      learntok eval-data fetch --tasks piqa,lambada --dir data/eval
      learntok eval-data verify"""

    action: Annotated[Literal["fetch", "verify"], tyro.conf.Positional]
    """fetch or verify."""
    tasks: str = "piqa,hellaswag,arc_easy,lambada"
    """Comma-separated tasks to fetch."""
    dir: str | None = None
    """Directory of the task files (default: $LEARNTOK_EVAL_DIR, else ~/.cache/learntok/eval); learntok eval reads
    it by default."""


def cmd_eval_data(argv: list[str]) -> int:
    from learntok.evaluation import fetch
    from learntok.evaluation.tasks import eval_cache_dir

    a = parse(EvalDataArgs, argv, "learntok eval-data", EvalDataArgs.__doc__ or "")
    out = Path(a.dir) if a.dir else eval_cache_dir()
    if a.action == "verify":
        problems = fetch.verify(out)
        if problems:
            raise ValueError("; ".join(problems))
        print(f"{out}: every task file matches {fetch.CHECKSUMS}")
        return 0
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    fetch.fetch(tasks, out, log=lambda s: print(s, file=sys.stderr))
    hint = "" if a.dir is None else f" --task-dir {out}"
    print(f"wrote {len(tasks)} task file(s) to {out}; evaluate with: learntok eval RUN_DIR{hint}")
    return 0
