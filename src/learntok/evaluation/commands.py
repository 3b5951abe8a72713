"""Command-line entry points `learntok eval` and `learntok compare` (registered by learntok.cli).

Bad input raises ValueError / FileNotFoundError (or learntok.data.DataError) with a one-line message; the CLI
prints it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from learntok.argtypes import Parser, non_negative_int
from learntok.evaluation.tasks import TASKS

EVAL_EPILOG = """examples:
  learntok eval runs/tiny                               # all four tasks + held-out BPB on the run's validation split
  learntok eval runs/tiny --limit 50 --tasks piqa,lambada
  learntok eval runs/tiny/step_000500 --split test --boundaries-mode greedy
  learntok eval runs/tiny --boundaries-mode average --samples 8 --tasks none
  learntok eval runs/tiny --tasks piqa=my_piqa.jsonl.gz --bpe-tokenizer runs/bpe/bpe_tokenizer.json
"""




def eval_parser() -> argparse.ArgumentParser:
    p = Parser(prog="learntok eval", epilog=EVAL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Evaluate a trained learntok model the paper's way: downstream tasks (bits per byte "
                            "of the gold continuation, accuracy), held-out bits per byte, boundary statistics and "
                            "inference FLOPs per byte.")
    p.add_argument("checkpoint", help="run directory (its latest checkpoint) or a checkpoint directory run/step_N")
    p.add_argument("--data", default=None, help="held-out text instead of the run's split: any data spec `learntok "
                   "train` accepts (file, directory, glob, hf:NAME); all of its documents are evaluated")
    p.add_argument("--split", choices=("val", "test"), default="val",
                   help="split of the run's data for held-out BPB (test: the data directory's test* files)")
    p.add_argument("--tasks", default=",".join(TASKS),
                   help=f"comma-separated tasks from {', '.join(TASKS)}; NAME=PATH scores a file of that format; "
                        "'none' skips them (default: all four)")
    p.add_argument("--task-dir", default=None, help="directory of the task files (default: $LEARNTOK_EVAL_DIR or "
                   "shared/data/eval beside the repository)")
    p.add_argument("--limit", type=non_negative_int("--limit"), default=0,
                   help="examples per task and held-out sequences, for a quick look (0 = all)")
    p.add_argument("--no-heldout", action="store_true", help="skip held-out BPB and boundary statistics")
    p.add_argument("--boundaries-mode", choices=("sample", "greedy", "average"), default="sample",
                   help="boundaries at evaluation: one sample with --seed (the paper), greedy (p > 0.5), or "
                        "--samples draws averaged in probability space")
    p.add_argument("--samples", type=non_negative_int("--samples"), default=4, help="k for --boundaries-mode average")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=1234, help="seed of the boundary noise")
    p.add_argument("--batch-size", type=non_negative_int("--batch-size"), default=16, help="rows per forward pass")
    p.add_argument("--max-bytes", type=non_negative_int("--max-bytes"), default=0,
                   help="held-out bytes to evaluate (0 = the whole split)")
    p.add_argument("--bpe-tokenizer", default=None,
                   help="tokenizer.json of a byte-level BPE: also compare boundaries with its token starts")
    p.add_argument("--out", default=None, help="where to write the report (default: RUN_DIR/eval.json)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--threads", type=non_negative_int("--threads"), default=0,
                   help="CPU threads (0 = PyTorch's default; on a busy shared machine 1 can be much faster)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _run_dir(path: Path) -> Path:
    return path.parent if (path / "model.safetensors").exists() else path


def cmd_eval(argv: list[str]) -> int:
    """`learntok eval CHECKPOINT [options]`: print the report and write eval.json."""
    args = eval_parser().parse_args(argv)
    if args.batch_size < 1:
        raise ValueError("--batch-size must be at least 1")
    import torch

    from learntok.checkpoint import latest_checkpoint, load_run
    from learntok.evaluation.bpb import BoundaryMode
    from learntok.evaluation.report import EvalOptions, evaluate_model, format_report, write_eval
    from learntok.train import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    mode = BoundaryMode(args.boundaries_mode, args.samples if args.boundaries_mode == "average" else 1, args.seed)
    opts = EvalOptions(data=args.data, split=args.split, tasks=args.tasks, task_dir=args.task_dir, limit=args.limit,
                       mode=mode, batch_size=args.batch_size, max_bytes=args.max_bytes,
                       bpe_tokenizer=args.bpe_tokenizer, heldout=not args.no_heldout, progress=not args.no_progress)
    path = Path(args.checkpoint)
    cfg, model = load_run(path, resolve_device(args.device))
    run_dir = _run_dir(path)
    ckpt = path if run_dir != path else latest_checkpoint(run_dir)
    print(f"learntok eval {path}: checkpoint {ckpt}", file=sys.stderr)
    report = evaluate_model(cfg, model, opts, log=lambda s: print(s, file=sys.stderr))
    report["checkpoint"] = str(ckpt)
    report["run"] = str(run_dir)
    out = write_eval(Path(args.out) if args.out else run_dir / "eval.json", report)
    print(format_report(report, title=f"\n{run_dir} ({ckpt.name if ckpt else '?'}, boundaries "
                                       f"{cfg.boundary.boundaries})"))
    print(f"written: {out}")
    return 0


def cmd_compare(argv: list[str]) -> int:
    """`learntok compare RUN_DIR... [--out DIR]`: Table 1 and Table 3 as Markdown and CSV."""
    from learntok.evaluation.compare import compare

    p = Parser(prog="learntok compare",
                description="Put evaluated runs side by side in the layout of the paper's Table 1 and Table 3 "
                            "(reads each run's eval.json from `learntok eval` and its config.json).")
    p.add_argument("runs", nargs="+", help="run directories (or eval.json files)")
    p.add_argument("--out", default=".", help="directory for comparison.md, table1.csv, table3.csv (default: .)")
    args = p.parse_args(argv)
    md, paths = compare(args.runs, args.out)
    print(md)
    print("written: " + ", ".join(str(x) for x in paths))
    return 0
