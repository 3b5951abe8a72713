"""Command line: `learntok train ...` (also `python -m learntok train ...`).

Config flags come from the dataclasses in `learntok.config` through tyro, so `learntok train --help`
documents every field. `--preset NAME` picks the starting config and `--resume DIR` continues a run; any
other flag overrides one field.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

USAGE = """usage: learntok COMMAND [options]

commands:
  train     train a model (learntok train --help lists every option)

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
    return tyro.cli(TrainConfig, default=base, args=argv, prog="learntok train",
                    description="Train a byte-level U-Net whose tokenization is learned end to end.",
                    config=(tyro.conf.OmitArgPrefixes,))


def cmd_train(argv: list[str]) -> int:
    from learntok.train import train

    cfg = parse_train_args(argv)
    result = train(cfg, resume=bool(cfg.resume))
    print(f"\ndone: {result.steps} steps, {result.bytes_seen / 1e6:.2f} MB in {result.seconds:.0f} s "
          f"({result.bytes_per_s / 1e3:.1f} kB/s)")
    print(f"validation bits per byte: {result.val_bpb:.4f}")
    print(f"boundary rate: {result.val_rate:.3f} (target {cfg.boundary.target_rate:.3f})")
    print(f"run directory: {result.out}")
    print("held-out sample, boundaries marked:\n" + result.sample)
    return 0


COMMANDS = {"train": cmd_train}


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
