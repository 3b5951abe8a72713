"""Command line: `learntok train ...` (also `python -m learntok train ...`).

Config flags come from the dataclasses in `learntok.config` through tyro, so `learntok train --help`
documents every field. `--preset NAME` picks the starting config and `--resume DIR` continues a run; any
other flag overrides one field.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

USAGE = """usage: learntok COMMAND [options]

commands:
  train     train a model (learntok train --help lists every option)
  eval      evaluate a checkpoint the paper's way (held-out BPB, PIQA, HellaSwag, ARC-Easy, LAMBADA, boundary stats)
  compare   Table 1 / Table 3 of evaluated runs (Markdown + CSV)
  export    turn a run into a shareable model directory (config.json + model.safetensors)
  segment   segment text with a model's learned boundaries
  vocab     statistics of the learned segments over a corpus
  generate  continue a prompt (batched, cached, streaming)
  train-entropy-model   train the small byte LM of the `entropy` (BLT) boundary strategy
  show      boundary map of a text (terminal / --html / --png)
  plot      training curves of runs (validation BPB vs FLOPs and bytes, rates, losses, throughput)
  report    one self-contained HTML page per run

examples:
  learntok train                                   # the tiny preset on this Python's stdlib sources
  learntok train --preset tiny --out runs/t --max-steps 200 --boundaries uniform
  learntok train --data ../shared/data/text/enwiki --max-bytes 5e6
  learntok train --resume runs/t --max-steps 400   # continue (and extend) a run
"""


class UsageError(Exception):
    pass


def _fail(msg: str) -> int:
    print(f"learntok: error: {msg}", file=sys.stderr)
    return 2


def parse_train_args(argv: list[str]):
    """Build the TrainConfig for `learntok train argv...`: preset (or the resumed run's config.json), then
    every flag as an override."""
    import tyro

    from learntok.config import TrainConfig, from_dict
    from learntok.presets import get_preset

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", default=None)
    pre.add_argument("--resume", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.resume:
        cfg_path = Path(known.resume) / "config.json"
        if not cfg_path.exists():
            raise UsageError(f"--resume {known.resume}: no config.json there (not a learntok run directory)")
        data = json.loads(cfg_path.read_text())
        data.pop("run_info", None)
        base = replace(from_dict(data), out=known.resume)
    else:
        base = get_preset(known.preset or "tiny")
    cfg = tyro.cli(TrainConfig, default=base, args=argv, prog="learntok train",
                   description="Train a byte-level U-Net whose tokenization is learned end to end.",
                   config=(tyro.conf.OmitArgPrefixes,))
    given = {a.split("=")[0] for a in argv}
    if "--max-bytes" in given and "--max-steps" not in given:
        cfg = replace(cfg, max_steps=0)  # a length in bytes replaces the preset's length in steps
    return cfg


def cmd_train(argv: list[str]) -> int:
    from learntok.train import train

    cfg = parse_train_args(argv)
    out = Path(cfg.out)
    if not cfg.resume and not cfg.overwrite and (out / "metrics.jsonl").exists():
        n = 2
        while (out.parent / f"{out.name}-{n}" / "metrics.jsonl").exists():
            n += 1
        fresh = out.parent / f"{out.name}-{n}"
        print(f"{out} already holds a run; writing to {fresh} (continue the old one with --resume {out}, "
              "replace it with --overwrite)", file=sys.stderr)
        cfg = replace(cfg, out=str(fresh))
    result = train(cfg, resume=bool(cfg.resume))
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return 0
    print(f"\ndone: {result.steps} steps, {result.bytes_seen / 1e6:.2f} MB in {result.seconds:.0f} s "
          f"({result.bytes_per_s / 1e3:.1f} kB/s)")
    print(f"validation bits per byte: {result.val_bpb:.4f}")
    print(f"boundary rate: {result.val_rate:.3f} (target {cfg.boundary.target_rate:.3f})")
    print(f"run directory: {result.out}")
    print("held-out sample, boundaries marked:\n" + result.sample)
    return 0


def cmd_export(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="learntok export",
                                 description="Convert a training run into a shareable model directory "
                                             "(config.json + model.safetensors).")
    ap.add_argument("run_dir")
    ap.add_argument("out_dir")
    args = ap.parse_args(argv)
    from learntok.pretrained import export_run

    print(f"wrote {export_run(args.run_dir, args.out_dir)}")
    return 0


def _read_text(args) -> bytes:
    if args.text is not None:
        return args.text.encode()
    if args.file is not None:
        path = Path(args.file)
        if not path.exists():
            raise FileNotFoundError(f"--file {path}: no such file")
        return path.read_bytes()
    return sys.stdin.buffer.read()


def cmd_segment(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="learntok segment", description="Segment text with a model's learned "
                                 "boundaries (a boundary byte starts a segment).")
    ap.add_argument("checkpoint", help="run directory or exported model directory")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--text")
    src.add_argument("--file")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="a boundary where p > 0.5")
    mode.add_argument("--sample", action="store_true", help="sample the boundaries with --seed (the default, as "
                      "the paper evaluates)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=["text", "jsonl"], default="text")
    ap.add_argument("--sep", default="|", help="separator for --format text")
    ap.add_argument("--out", help="write here instead of stdout")
    args = ap.parse_args(argv)
    from learntok.segment import Segmenter

    seg = Segmenter.from_pretrained(args.checkpoint, greedy=args.greedy, seed=args.seed)
    spans = seg.segment(_read_text(args))
    if args.format == "jsonl":
        text = "".join(json.dumps({"start": s.start, "end": s.end, "text": s.text}) + "\n" for s in spans)
    else:
        text = args.sep.join(s.text for s in spans) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_vocab(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="learntok vocab", description="Statistics of the learned segments over a "
                                 "corpus: most frequent segments, mean length, share of whole words.")
    ap.add_argument("checkpoint")
    ap.add_argument("--data", required=True, help="any data spec `learntok train --data` accepts")
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--max-bytes", type=int, default=200_000)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    from learntok.data import iter_documents
    from learntok.segment import Segmenter, vocab_stats

    seg = Segmenter.from_pretrained(args.checkpoint)
    docs, total = [], 0
    for _, doc in iter_documents(args.data, args.text_field):
        docs.append(doc[: args.max_bytes - total])
        total += len(docs[-1])
        if total >= args.max_bytes:
            break
    stats = vocab_stats(docs, [seg.segment(d) for d in docs], top=args.top)
    print(f"{stats['segments']:,} segments ({stats['distinct']:,} distinct) over {total:,} bytes; "
          f"mean {stats['mean_bytes']:.2f} bytes; whole words {100 * stats['whole_word_share']:.1f}%")
    for text, count in stats["most_frequent"]:
        print(f"{count:8d}  {text!r}")
    return 0


def cmd_generate(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="learntok generate", description="Continue a prompt, streaming bytes as "
                                 "they are produced (cached at the byte and token levels).")
    ap.add_argument("checkpoint", help="run directory or exported model directory")
    ap.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    ap.add_argument("--max-new-bytes", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop", action="append", default=[], help="stop a row when its output ends with this")
    ap.add_argument("--no-cache", action="store_true", help="recompute the full forward pass every byte")
    args = ap.parse_args(argv)
    from learntok.generate import generate
    from learntok.pretrained import from_pretrained

    model = from_pretrained(args.checkpoint)
    single = len(args.prompt) == 1
    if single:
        sys.stdout.write(args.prompt[0])
    outs = generate(model, args.prompt, args.max_new_bytes, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, stop=[s.encode() for s in args.stop],
                    use_cache=not args.no_cache,
                    on_text=(lambda _b, text: (sys.stdout.write(text), sys.stdout.flush())) if single else None)
    if single:
        sys.stdout.write("\n")
    else:
        for prompt, out in zip(args.prompt, outs):
            print(json.dumps({"prompt": prompt, "output": out.decode("utf-8", errors="replace")}))
    return 0


def cmd_train_entropy_model(argv: list[str]) -> int:
    from learntok.boundaries.entropy import main_train_entropy_model

    return main_train_entropy_model(argv)


COMMANDS = {"train": cmd_train, "export": cmd_export, "segment": cmd_segment, "vocab": cmd_vocab,
            "generate": cmd_generate, "train-entropy-model": cmd_train_entropy_model}


def _register_optional_commands() -> None:
    from learntok.evaluation.commands import cmd_compare, cmd_eval
    from learntok.viz.commands import COMMANDS as VIZ_COMMANDS

    COMMANDS.update(VIZ_COMMANDS)
    COMMANDS.update({"eval": cmd_eval, "compare": cmd_compare})


_register_optional_commands()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] not in COMMANDS:
        return _fail(f"unknown command {argv[0]!r}\n{USAGE}")
    from learntok.data import DataError

    try:
        return COMMANDS[argv[0]](argv[1:])
    except (UsageError, DataError, ValueError, FileNotFoundError) as e:
        return _fail(str(e))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
