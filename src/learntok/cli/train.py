"""`learntok train`, `learntok train-entropy-model`, `learntok export` and `learntok push`.

`learntok train` starts from a preset (`--preset`, default tiny) or a run to continue (`--resume DIR`), switches
to another boundary strategy with `--boundaries NAME` (options both strategies have, such as the target rate
and pooling, carry over), and then applies every other flag as an override. The options offered are those of
the chosen strategy, so `--boundaries uniform --gamma 0.9` is an error that says gamma belongs to `learned`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import tyro

from learntok.cli import UsageError, parse

TRAIN_DESCRIPTION = """Train a byte-level U-Net whose tokenization is learned end to end.

Starts from --preset NAME (tiny, small, paper-147m, paper-90m-code, paper-aspect-N; default tiny) or from the run
in --resume DIR; every other flag overrides one setting. --boundaries NAME picks the boundary strategy (learned,
uniform, uniform-random, whitespace, bpe, dynamic, hnet, entropy, flat); the options listed below under "boundary" are
those of the strategy in effect: `learntok train --boundaries NAME --help` lists another's.

--config FILE (.yaml, .toml or .json) applies a run config file on top of the preset before the flags;
--write-config FILE writes the effective config (preset, file and flags) as such a file and exits without
training ("-" prints TOML). docs/operations.md describes both."""


def _flags(cls: type) -> set[str]:
    """Command-line flags of a flat dataclass's fields (and --no-X, the negative form of a boolean)."""
    names = ["--" + f.name.replace("_", "-") for f in dataclasses.fields(cls)]
    return {*names, *("--no-" + n[2:] for n in names)}


def _check_strategy_flags(argv: list[str], name: str) -> None:
    """A flag of another boundary strategy is an error naming the strategies that have it."""
    from learntok.boundaries import available, config_class

    own = _flags(config_class(name))
    for arg in argv:
        flag = arg.split("=")[0]
        if not flag.startswith("--") or flag in own:
            continue
        owners = [s for s in available() if flag in _flags(config_class(s))]
        if owners:
            raise UsageError(f"{flag} is an option of --boundaries {' / '.join(owners)}, not of --boundaries {name}")


FILE_FLAGS = ("--config", "--write-config")
"""Options of the command, not of the config: taken out of argv before tyro parses the rest."""


def split_file_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(argv without --config / --write-config, their values)."""
    rest, found, i = [], {}, 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag in FILE_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{flag} needs a file name")
                value, i = argv[i + 1], i + 1
            found[flag] = value
        else:
            rest.append(argv[i])
        i += 1
    return rest, found


def parse_train_args(argv: list[str], config_file: str | None = None):
    """The TrainConfig of `learntok train argv...` (`config_file`: applied before the flags)."""
    from learntok.boundaries import config_class
    from learntok.config import TrainConfig, load_json
    from learntok.presets import get_preset

    argv, files = split_file_flags(argv)
    config_file = files.get("--config", config_file)
    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--preset", "--resume", "--boundaries"):
        pre.add_argument(flag, default=None)
    known, _ = pre.parse_known_args(argv)
    if config_file and not known.preset and not known.resume:
        from learntok.config_file import preset_of

        known.preset = preset_of(config_file)
    if known.resume:
        cfg_path = Path(known.resume) / "config.json"
        if not cfg_path.exists():
            raise UsageError(f"--resume {known.resume}: no config.json there (not a learntok run directory)")
        base = replace(load_json(str(cfg_path)), resume=known.resume, out=known.resume, overwrite=False)
        if known.boundaries and known.boundaries != base.boundary.boundaries:
            raise UsageError(f"--resume {known.resume}: the run trains --boundaries {base.boundary.boundaries}; "
                             f"a run cannot switch to {known.boundaries} (start a new run instead)")
    else:
        base = get_preset(known.preset or "tiny")
        if known.boundaries and known.boundaries != base.boundary.boundaries:
            base = replace(base, boundary=base.boundary.converted(config_class(known.boundaries)))
    run = base if known.resume else None  # the resumed run's own config
    if config_file:
        from learntok.config_file import apply_file

        base = apply_file(base, config_file)
        if run is not None and base.boundary.boundaries != run.boundary.boundaries:
            raise UsageError(f"--config {config_file}: the run {known.resume} trains --boundaries "
                             f"{run.boundary.boundaries}; a run cannot switch to {base.boundary.boundaries}")
        if known.boundaries and known.boundaries != base.boundary.boundaries:
            base = replace(base, boundary=base.boundary.converted(config_class(known.boundaries)))
    cls = type(base.boundary)
    _check_strategy_flags(argv, base.boundary.boundaries)
    cfg = parse(TrainConfig[cls], argv, "learntok train", TRAIN_DESCRIPTION, default=base)
    if run is not None:
        _check_same_weights(base, cfg)
        _check_resume_settings(run, cfg, known.preset)
    return cfg


def _check_resume_settings(run, cfg, preset: str | None) -> None:
    """Settings a resumed run cannot take: they would be half applied (the data order keeps the run's seed, the
    schedule counts its steps in its batch) or name another run, so they are one line, not ignored."""
    bad = [f"--preset {preset} (a resumed run keeps its settings)"] if preset else []
    bad += ["--overwrite (it would delete the run being resumed)"] if cfg.overwrite else []
    bad += [f"--out {cfg.out} (a resumed run trains in its own directory)"] if cfg.out != run.out else []
    bad += [f"--{flag} {new} (the run has {old})" for flag, old, new in (
        ("seed", run.seed, cfg.seed), ("batch-size", run.batch_size, cfg.batch_size),
        ("seq-len", run.data.seq_len, cfg.data.seq_len)) if old != new]
    if bad:
        raise UsageError(f"--resume {cfg.resume}: {'; '.join(bad)}: start a new run instead")


def _check_same_weights(base, cfg) -> None:
    """A resumed run keeps its weights' shapes: a flag that changes them (`--d-model 256`, `--n-mid 4`,
    `--policy-window 3`, ...) is one line naming it, not a size-mismatch traceback at the checkpoint."""
    import torch

    from learntok.model import build_model

    def shapes(c) -> dict:
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in build_model(c.model, c.boundary).state_dict().items()}

    if shapes(base) == shapes(cfg):
        return
    changed = [f"--{f.name.replace('_', '-')} {getattr(new, f.name)} (the run has {getattr(old, f.name)})"
               for old, new in ((base.model, cfg.model), (base.boundary, cfg.boundary))
               for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)]
    raise UsageError(f"--resume {cfg.resume}: {', '.join(changed) or 'these flags'} would change the shape of the "
                     "run's weights; a run cannot change its model (start a new run instead)")


def fresh_out(cfg):
    """cfg itself, or with --out moved to OUT-2, OUT-3, ... when OUT already holds a run (never overwritten
    silently; --resume continues it, --overwrite replaces it)."""
    out = Path(cfg.out)
    if cfg.resume or cfg.overwrite or not (out / "metrics.jsonl").exists():
        return cfg
    n = 2
    while (out.parent / f"{out.name}-{n}" / "metrics.jsonl").exists():
        n += 1
    fresh = out.parent / f"{out.name}-{n}"
    print(f"{out} already holds a run; writing to {fresh} (continue the old one with --resume {out}, "
          "replace it with --overwrite)", file=sys.stderr)
    return replace(cfg, out=str(fresh))


def cmd_train(argv: list[str]) -> int:
    from learntok.train import check_config, train
    from learntok.viz.boundary_map import preview_hook

    _, files = split_file_flags(argv)
    if "--write-config" in files:
        from learntok.config_file import write_file

        write_file(parse_train_args(argv), files["--write-config"])
        if files["--write-config"] != "-":
            print(f"wrote {files['--write-config']}", file=sys.stderr)
        return 0
    cfg = parse_train_args(argv)
    check_config(cfg)  # a bad flag is the first line the user sees, before any note about --out
    result = train(fresh_out(cfg), on_eval=preview_hook)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return 0
    if result.stopped:  # preempted: the checkpoint is saved, the job may be requeued
        print(f"\nstopped by {result.stopped} after {result.steps} steps; checkpoint saved in {result.out} "
              f"(continue with: learntok train --resume {result.out})")
        return 0
    print(f"\ndone: {result.steps} steps, {result.bytes_seen / 1e6:.2f} MB in {result.seconds:.0f} s "
          f"({result.bytes_per_s / 1e3:.1f} kB/s)")
    print(f"validation bits per byte: {result.val_bpb:.4f}")
    target = getattr(cfg.boundary, "target_rate", None)
    print(f"boundary rate: {result.val_rate:.3f}" + (f" (target {target:.3f})" if target is not None else ""))
    print(f"run directory: {result.out}")
    print("held-out sample, boundaries marked:\n" + result.sample)
    return 0


@dataclass(frozen=True, kw_only=True)
class EntropyModelArgs:
    """Train the small byte LM whose next-byte entropy places the boundaries of --boundaries entropy (BLT entropy
    patching)."""

    out: str
    """Output directory (config.json + model.safetensors)."""
    data: str = "stdlib"
    """Training data (same spellings as learntok train --data)."""
    val_data: str | None = None
    """Validation data (default: a split of --data)."""
    steps: int = 600
    """Optimizer steps."""
    seq_len: int = 256
    """Bytes per training sequence."""
    batch_size: int = 16
    """Sequences per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate."""
    seed: int = 0
    """Seed for initialisation and data order."""


def cmd_train_entropy_model(argv: list[str]) -> int:
    from learntok.config import DataConfig
    from learntok.data import describe, load_splits
    from learntok.entropy_model import train_entropy_model

    a = parse(EntropyModelArgs, argv, "learntok train-entropy-model", EntropyModelArgs.__doc__ or "")
    if min(a.steps, a.seq_len - 1, a.batch_size) < 1 or not 0 < a.lr < math.inf:  # NaN fails too
        raise UsageError("--steps and --batch-size must be >= 1, --seq-len >= 2 and --lr finite and > 0")
    train_docs, val_docs = load_splits(DataConfig(source=a.data, val_data=a.val_data))
    print(describe(train_docs, val_docs))
    out = train_entropy_model(train_docs, val_docs, a.out, steps=a.steps, seq_len=a.seq_len,
                              batch_size=a.batch_size, lr=a.lr, seed=a.seed)
    print(f"saved to {out}; use it with: learntok train --boundaries entropy --entropy-model {out}")
    return 0


@dataclass(frozen=True, kw_only=True)
class ExportArgs:
    """Convert a training run into a shareable model directory (config.json + model.safetensors, plus the
    strategy's files such as a BPE tokenizer), loadable with learntok.from_pretrained."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]
    """The run directory (its newest intact checkpoint), a checkpoint directory run/step_N, an exported model
    directory or a Hugging Face Hub id."""
    out_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")]
    """Where to write the model directory (with a model card, README.md)."""


def cmd_export(argv: list[str]) -> int:
    from learntok.pretrained import export_run

    a = parse(ExportArgs, argv, "learntok export", ExportArgs.__doc__ or "")
    print(f"wrote {export_run(a.run_dir, a.out_dir)}")
    return 0


@dataclass(frozen=True, kw_only=True)
class PushArgs:
    """Upload a model to the Hugging Face Hub (config.json, model.safetensors, the strategy's files and a generated
    model card), creating the repository if needed; load it anywhere with learntok.from_pretrained("USER/NAME").
    Needs pip install 'learntok[hub]' and a token (huggingface-cli login, or HF_TOKEN)."""

    source: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SOURCE")]
    """Run directory, checkpoint directory run/step_N or exported model directory."""
    repo_id: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="USER/NAME")]
    """Hub repository, USER/NAME."""
    private: bool = False
    """Create the repository as private."""
    message: str | None = None
    """Commit message."""
    revision: str | None = None
    """Branch to push to, created from main if it does not exist (default: main)."""


def cmd_push(argv: list[str]) -> int:
    from learntok.hub import push_to_hub
    from learntok.pretrained import HUB_ID

    a = parse(PushArgs, argv, "learntok push", PushArgs.__doc__ or "")
    if not HUB_ID.match(a.repo_id) or "@" in a.repo_id:
        raise UsageError(f"{a.repo_id!r} is not a Hub repository id (USER/NAME)")
    if not Path(a.source).exists():
        raise FileNotFoundError(f"{a.source}: no such directory")
    url = push_to_hub(a.source, a.repo_id, private=a.private, commit_message=a.message, revision=a.revision)
    print(f"pushed to {a.repo_id}: {url}")
    return 0
