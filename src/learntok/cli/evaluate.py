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
  learntok eval runs/tiny --boundaries-mode average --samples 8 --tasks none
  learntok eval runs/any --rate 0.1 --tasks none        # asked for another rate (writes eval-rate0.1.json)
  learntok eval runs/any --rate-sweep --tasks none --no-heldout   # BPB and realised rate at 44 asked rates"""


@dataclass(frozen=True, kw_only=True)
class EvalArgs:
    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="MODEL")]
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
    rate: float | None = None
    """Ask a learned policy for this boundary rate (boundaries per byte) throughout: a variable-rate model
    (--rate-range) is conditioned on it, a fixed-rate one has its logits shifted; a calibration table from
    `learntok calibrate` adds its offset. The report goes to eval-rateR.json unless --out is given."""
    rate_sweep: bool = False
    """Also the authors' rate sweep: BPB and realised rate at each of --sweep-rates on the first --sweep-bytes
    held-out bytes."""
    sweep_rates: tuple[float, ...] = ()
    """Asked rates of --rate-sweep (default: 0.95^i, i = 1..44: the authors' 45 points less rate 1.0, which a
    policy cannot be asked)."""
    sweep_bytes: int = 65_536
    """Held-out bytes per point of --rate-sweep."""
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
    skip_bytes: int = 0
    """Leave out the split's first N bytes (rounded up to whole sequences) from held-out BPB, boundary statistics
    and diagnostics: score text no earlier screen read (--rate-sweep still reads the first --sweep-bytes)."""
    per_document: bool = False
    """Also store each document's held-out bits and bytes in eval.json, for `learntok compare --paired` (one
    boundary draw only)."""
    by_class: bool = False
    """Also break held-out bits down by byte class (word starts, the rest of words, spaces, punctuation), in
    eval.json and the report; `learntok compare --paired` then says how much of A − B each class carries (a model
    that predicts bytes: not --arch token)."""
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
        for name in ("limit", "samples", "seed", "max_bytes", "skip_bytes", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be non-negative, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise ValueError("--batch-size must be at least 1")
        if any(not 0 < r < 1 for r in (*self.sweep_rates, *([self.rate] if self.rate is not None else []))):
            raise ValueError("--rate and --sweep-rates must be in (0, 1)")
        if self.sweep_bytes < 1:
            raise ValueError("--sweep-bytes must be at least 1")
        if self.per_document and self.boundaries_mode == "average":
            raise ValueError("--per-document needs one boundary draw: not --boundaries-mode average")


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
    from learntok.evaluation.rates import SWEEP

    sweep = (a.sweep_rates or SWEEP) if a.rate_sweep else ()
    opts = EvalConfig(data=a.data, split=a.split, tasks=a.tasks, task_dir=a.task_dir, limit=a.limit, mode=mode,
                      batch_size=a.batch_size, max_bytes=a.max_bytes, skip_bytes=a.skip_bytes,
                      per_document=a.per_document, by_class=a.by_class, bpe_tokenizer=a.bpe_tokenizer,
                      heldout=a.heldout, robustness=a.robustness, progress=a.progress, rate=a.rate,
                      rate_sweep=tuple(sweep), sweep_bytes=a.sweep_bytes)
    loaded = load(a.checkpoint, resolve_device(a.device))
    if loaded.cfg is None and (a.heldout or a.rate_sweep) and a.data is None:
        raise UsageError(f"{a.checkpoint} is an exported model, not a training run, so it has no held-out split: "
                         "give --data PATH (any data spec learntok train accepts) or --no-heldout")
    model, ckpt, run_dir = loaded.model, loaded.checkpoint, loaded.run_dir
    if (a.rate is not None or sweep) and not model.boundary.rate_knob:
        raise UsageError(f"--rate / --rate-sweep: --boundaries {model.bcfg.boundaries} has no rate knob (a learned "
                         "policy has)")
    if a.by_class and getattr(model, "predicts_tokens", False):
        raise UsageError(f"--by-class: {a.checkpoint} is a BPE transformer, whose bits are per token, not per byte")
    cfg = loaded.cfg or TrainConfig(model=model.cfg, boundary=model.bcfg, data=DataConfig(seq_len=loaded.seq_len))
    where = ckpt or loaded.hub_id or loaded.path
    print(f"learntok eval {a.checkpoint}: {where}", file=sys.stderr)
    from learntok.pretrained import bundled

    name = "eval.json" if a.rate is None else f"eval-rate{a.rate:g}.json"
    default_dir = run_dir or (Path(".") if loaded.hub_id or bundled(str(a.checkpoint)) else loaded.path)
    path = Path(a.out) if a.out else default_dir / name  # a bundled model's directory is the installed package's
    if path.is_dir():
        path = path / name
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
class CalibrateArgs:
    """Fit the logit offsets that make a learned policy's realised boundary rate equal the asked rate on held-out
    text, at a grid of asked rates (interpolated between them, constant beyond), and save them beside the model
    as rate_calibration.json: every later `--rate` (eval, generate, segment, show) and `model.set_rate()` uses
    them. Training the run further removes the table (it would be stale).

    examples:
      learntok calibrate runs/variable                       # 9 rates over the model's --rate-range
      learntok calibrate runs/fixed --rates 0.1 0.15 0.2 0.3 # any learned model: its logits shifted, calibrated
      learntok calibrate enwiki-small --data notes.txt --out models/mine   # a calibrated copy of a bundled model"""

    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="MODEL")]
    """Run directory, checkpoint directory or exported model directory."""
    rates: tuple[float, ...] = ()
    """Asked rates to fit at (default: 9 log-spaced over the model's --rate-range, or over half to twice a
    fixed-rate model's target)."""
    data: str | None = None
    """Held-out text instead of the run's split (needed for an exported model)."""
    split: Literal["val", "test"] = "val"
    """Split of the run's data to fit on (tune on validation; report on test)."""
    max_bytes: int = 262_144
    """Held-out bytes to fit on."""
    greedy: bool = False
    """Fit for greedy boundaries (p > 0.5) instead of one sample with --seed (the paper's evaluation)."""
    seed: int = EVAL_SEED
    """Seed of the boundary noise (learntok eval's)."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto."""
    out: str | None = None
    """Write the model with its calibration table into this directory (an exported model directory) instead of
    adding the table beside the model (needed for a bundled model or one from the Hub)."""

    def __post_init__(self) -> None:
        if any(not 0 < r < 1 for r in self.rates):
            raise ValueError(f"--rates must be in (0, 1), got {list(self.rates)}")
        if self.max_bytes < 1:
            raise ValueError("--max-bytes must be at least 1")


def cmd_calibrate(argv: list[str]) -> int:
    """`learntok calibrate CHECKPOINT [options]`: fit and save the model's rate calibration table."""
    a = parse(CalibrateArgs, argv, "learntok calibrate", CalibrateArgs.__doc__ or "")
    from learntok.config import DataConfig, TrainConfig
    from learntok.data import ByteSequences
    from learntok.device import resolve_device
    from learntok.evaluation.bpb import BoundaryMode
    from learntok.evaluation.rates import calibrate, default_rates
    from learntok.evaluation.report import heldout_documents
    from learntok.pretrained import load

    loaded = load(a.checkpoint, resolve_device(a.device))
    model = loaded.model
    if not model.boundary.rate_knob:
        raise UsageError(f"{a.checkpoint}: --boundaries {model.bcfg.boundaries} has no rate knob to calibrate (a "
                         "learned policy has)")
    if loaded.cfg is None and a.data is None:
        raise UsageError(f"{a.checkpoint} is an exported model, not a training run: give --data PATH to fit on")
    from learntok.pretrained import bundled, save_pretrained

    if (loaded.hub_id or bundled(str(a.checkpoint))) and a.out is None:
        raise UsageError(f"{a.checkpoint} is {'a Hub model' if loaded.hub_id else 'bundled with learntok'}: give --out "
                         "DIR to write a calibrated copy of it there")
    cfg = loaded.cfg or TrainConfig(model=model.cfg, boundary=model.bcfg, data=DataConfig(seq_len=loaded.seq_len))
    desc, docs = heldout_documents(cfg, a.data, a.split)
    seqs = ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, name=f"held-out data {desc}")
    bm = BoundaryMode("greedy" if a.greedy else "sample", 1, a.seed)
    model.boundary.calibration = None  # fit from the model's own logits
    table = calibrate(model, seqs, a.rates or default_rates(model), bm, max_bytes=a.max_bytes,
                      source=f"{desc}, first {a.max_bytes:,} bytes", log=lambda s: print(s, file=sys.stderr))
    table.info["checkpoint"] = loaded.checkpoint.name if loaded.checkpoint else None
    if a.out:  # a calibrated copy: the model and its table
        save_pretrained(model, a.out, seq_len=loaded.seq_len, source_dir=loaded.run_dir or loaded.path)
    path = table.save(Path(a.out) if a.out else (loaded.run_dir or loaded.path))
    worst = max(abs(r - g) for r, g in zip(table.rates, table.info["realised"]))
    print(f"wrote {path}: {len(table.rates)} asked rates from {table.rates[0]:.4f} to {table.rates[-1]:.4f}, largest "
          f"|realised - asked| {worst:.4f} on the text it was fitted on")
    return 0


@dataclass(frozen=True, kw_only=True)
class CompareArgs:
    """Put evaluated runs side by side in the layout of the paper's Table 1 and Table 3 (reads each run's
    eval.json from `learntok eval` and its config.json)."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN [RUN ...]")]
    """Run directories (or eval.json files)."""
    out: str = "."
    """Directory for comparison.md, table1.csv, table3.csv (with --paired: paired.json)."""
    paired: bool = False
    """Two runs evaluated with `learntok eval --per-document` on the same text: their held-out BPB difference
    with a 95 % paired bootstrap interval over documents (over sequences when the text has fewer than 20)."""
    resamples: int = 10_000
    """Bootstrap resamples for --paired."""
    seed: int = 0
    """Seed of the bootstrap for --paired."""


def cmd_compare(argv: list[str]) -> int:
    """`learntok compare RUN_DIR... [--out DIR]`: Table 1 and Table 3 as Markdown and CSV; `--paired A B`: the
    held-out BPB difference with a paired bootstrap interval."""
    from learntok.evaluation.compare import compare, format_paired, paired_bpb

    a = parse(CompareArgs, argv, "learntok compare", CompareArgs.__doc__ or "")
    if not a.runs:
        raise UsageError("learntok compare: give at least one run directory")
    if a.paired:
        if len(a.runs) != 2:
            raise UsageError(f"learntok compare --paired: give exactly two runs, got {len(a.runs)}")
        p = paired_bpb(*a.runs, resamples=a.resamples, seed=a.seed)
        print(format_paired(p))
        from learntok.evaluation.report import write_eval  # an atomic JSON write

        print(f"written: {write_eval(Path(a.out) / 'paired.json', p)}")
        return 0
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
