"""The command line: `learntok COMMAND [options]` (also `python -m learntok ...`).

Every command's options are a frozen dataclass with attribute docstrings, parsed by tyro, so `--help` documents
each flag the same way. Bad input never ends in a traceback: a parse error or a problem found later (a missing
file, bad data, an inconsistent setting) is one line `learntok: error: ...` on stderr and exit status 2; with the
environment variable LEARNTOK_DEBUG=1 the original exception is raised instead, with its traceback.

    train.py     train, train-entropy-model, export
    sweep.py     sweep
    use.py       generate, segment, vocab
    evaluate.py  eval, calibrate, compare
    viz.py       show, plot, report
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import os
import re
import sys
import warnings
from collections.abc import Sequence
from typing import TypeVar

from learntok.errors import LearntokError, LearntokWarning

USAGE = """usage: learntok COMMAND [options]      (learntok COMMAND --help lists a command's options)

commands:
  train     train a model (presets tiny, small, paper-147m, ...; --boundaries NAME picks the strategy)
  sweep     a grid of training settings, every cell at one FLOPs budget (resumable; a table and a plot)
  eval      evaluate a checkpoint the paper's way (held-out BPB, PIQA, HellaSwag, ARC-Easy, LAMBADA, boundary stats)
  compare   Table 1 / Table 3 of evaluated runs (Markdown + CSV)
  calibrate fit a learned policy's logit offsets so that any asked rate (--rate) is the rate it draws
  diagnose  diagnose variance RUN: the policy gradient's variance under the paper's variance reductions
  generate  continue a prompt (batched, cached, streaming)
  segment   segment text with a model's learned boundaries
  vocab     statistics of the learned segments over a corpus
  show      boundary map of a text (terminal / --html / --png)
  plot      training curves of runs (validation BPB vs FLOPs and bytes, rates, losses, throughput)
  report    one self-contained HTML page per run
  prepare   convert a data source into memory-mapped byte shards (for corpora larger than memory)
  export    turn a run into a shareable model directory (config.json + model.safetensors + model card)
  push      upload a model to the Hugging Face Hub (then: learntok.from_pretrained("user/name"))
  eval-data fetch the evaluation tasks (PIQA, HellaSwag, ARC-Easy, LAMBADA) into a local cache
  train-entropy-model   train the small byte LM of the `entropy` (BLT) boundary strategy

examples:
  learntok train                                   # the tiny preset on this Python's stdlib sources
  learntok train --out runs/t --max-steps 200 --boundaries uniform
  learntok train --boundaries learned --help       # every option of the learned strategy
  learntok train --resume runs/t --max-steps 400   # continue (and extend) a run
  learntok train --config run.yaml --lr 1e-3       # a run config file, flags override (--write-config FILE)
"""

COMMANDS = {
    "train": "learntok.cli.train:cmd_train", "train-entropy-model": "learntok.cli.train:cmd_train_entropy_model",
    "export": "learntok.cli.train:cmd_export", "prepare": "learntok.cli.data:cmd_prepare",
    "eval": "learntok.cli.evaluate:cmd_eval", "compare": "learntok.cli.evaluate:cmd_compare",
    "calibrate": "learntok.cli.evaluate:cmd_calibrate", "sweep": "learntok.cli.sweep:cmd_sweep",
    "eval-data": "learntok.cli.evaluate:cmd_eval_data", "push": "learntok.cli.train:cmd_push",
    "generate": "learntok.cli.use:cmd_generate", "segment": "learntok.cli.use:cmd_segment",
    "vocab": "learntok.cli.use:cmd_vocab",
    "diagnose": "learntok.cli.diagnose:cmd_diagnose",
    "show": "learntok.cli.viz:cmd_show", "plot": "learntok.cli.viz:cmd_plot", "report": "learntok.cli.viz:cmd_report",
}
"""Command -> "module:function" taking the command's argv and returning an exit status."""


class UsageError(ValueError):
    """Bad command-line input; the message is printed as one line."""


T = TypeVar("T")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RULE = re.compile(r"^[\s\-─━═│╭╮╰╯┌┐└┘]*$")


def one_line(tyro_error: str) -> str:
    """tyro's boxed error text -> one line: its title and the first paragraph of its message."""
    lines = [ln.strip(" │|\t") for ln in _ANSI.sub("", tyro_error).splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        return "invalid arguments"
    title, body = lines[0].strip("─╭╮ -"), []
    for ln in lines[1:]:
        if _RULE.match(ln):
            if body:
                break
            continue
        body.append(ln)
    message = re.sub(r"^Error parsing (?!-)\S+: ", "", " ".join(body))
    if not message or message.lower().startswith(title.lower()):
        return message or title
    return f"{title.lower()}: {message}"


def parse(cls: type[T], argv: Sequence[str], prog: str, description: str, default: T | None = None) -> T:
    """Parse `argv` into dataclass `cls` with tyro (`--help` prints and exits 0); a parse error raises
    UsageError with tyro's message as one line."""
    import tyro

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return tyro.cli(cls, args=list(argv), prog=prog, description=description, default=default,
                            config=(tyro.conf.OmitArgPrefixes,))
    except SystemExit as e:
        if e.code in (0, None):
            raise
        raise UsageError(f"{prog}: {one_line(err.getvalue())}") from None


def main(argv: list[str] | None = None) -> int:
    """Run `learntok argv...`; returns the exit status. Bad input (ValueError, OSError, LearntokError) is one line
    and status 2, or with LEARNTOK_DEBUG=1 set, the original exception with its traceback. Output to a reader that
    has gone (`learntok --help | head`) ends quietly with status 0."""
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, not at interpreter exit, so that a closed pipe is caught below
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "--version":
        from learntok.version import __version__

        print(f"learntok {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"learntok: error: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    module, func = COMMANDS[argv[0]].split(":")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            warnings.simplefilter("always", LearntokWarning)
            return getattr(importlib.import_module(module), func)(argv[1:])
    except BrokenPipeError:
        raise
    except ModuleNotFoundError as e:  # an optional dependency the command needs: name the extra to install
        extra = EXTRAS.get((e.name or "").split(".")[0])
        if extra is None or debug():
            raise
        print(f"learntok: error: learntok {argv[0]} needs {e.name.split('.')[0]} here: pip install "
              f"'learntok[{extra}]'", file=sys.stderr)
        return 2
    except (ValueError, OSError, LearntokError) as e:  # UsageError, DataError, a missing file, a full disk, ...
        if debug():
            raise
        print(f"learntok: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


_ERRNO_HINTS = {errno.EEXIST: " (a file is where a directory must be)",
                errno.ENOTDIR: " (part of the path is a file)",
                errno.EISDIR: " (a directory, where a file was expected)"}


def _one_line(e: BaseException) -> str:
    """The error message a user reads: an OSError of the system as `PATH: what went wrong` (not `[Errno N] ...`),
    anything else as its own text."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        path = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
        return f"{path}: {e.strerror}{_ERRNO_HINTS.get(e.errno, '')}"
    return str(e).strip() or type(e).__name__


EXTRAS = {"matplotlib": "viz", "tensorboard": "tensorboard", "wandb": "wandb", "huggingface_hub": "hub",
          "datasets": "hf", "pyarrow": "parquet", "lm_eval": "eval", "yaml": "yaml", "transformers": "transformers",
          "accelerate": "transformers"}
"""Optional dependency (top-level module) -> the pip extra that installs it (pyproject.toml)."""


def debug() -> bool:
    """Whether LEARNTOK_DEBUG is set to 1 (or true / yes / on): errors keep their traceback."""
    return os.environ.get("LEARNTOK_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """learntok's own warnings as one line `learntok: warning: ...`; others as Python prints them."""
    if issubclass(category, LearntokWarning):
        print(f"learntok: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
