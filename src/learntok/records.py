"""Experiment records: one JSON object per trained arm and seed, kept in a JSON Lines file under version control.

A record says what ran (the command, the arm's flags, the resolved config), on which code and machine (git SHA and
whether the working tree had uncommitted changes, library versions, CPU / GPU) and what it measured (every metric,
FLOPs, seconds). Result tables in the docs are generated from records (`python experiments/report.py`), never
typed, so every number there can be traced to the line that holds it. Records a script could not write with full
provenance (transcribed from a page, or written before records carried provenance) say so in `source`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from learntok import atomic

SCHEMA = 1
REQUIRED = ("schema", "study", "arm", "seed", "command", "source", "provenance")
SOURCES = {
    "measured": "written by the experiment script from the run it trained",
    "migrated": "written by an experiment script before records carried full provenance (a git SHA at most)",
    "transcribed": "copied from a results page after the run directory was lost (numbers only)",
}
"""What `record["source"]` may say, and what it means for auditing the record."""
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
"""Environment variables that change how a run computes (thread pools, visible GPUs), recorded when set."""


def git_state(where: Path | str | None = None) -> tuple[str | None, bool | None]:
    """(commit SHA, whether tracked files differ from it) of the repository holding `where` (this package's source
    by default); (None, None) outside a git checkout."""
    cwd = Path(where) if where else Path(__file__).parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=cwd).stdout.strip()
        if not sha:
            return None, None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=30, cwd=cwd).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return sha, bool(dirty)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict:
    """The code, libraries and machine of this process: git SHA and dirty flag, versions, CPU, GPU, thread and
    device environment variables, time (UTC)."""
    import numpy
    import torch

    from learntok.version import __version__

    sha, dirty = git_state()
    return {"learntok": __version__, "git_sha": sha, "git_dirty": dirty, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
            "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run_provenance(run: Path | str) -> tuple[dict, dict]:
    """(config, provenance) of a run directory: its config.json without and with `run_info`, i.e. the provenance
    of the process that trained it (not of the script reading it)."""
    cfg = json.loads((Path(run) / "config.json").read_text())
    return {k: v for k, v in cfg.items() if k != "run_info"}, cfg.get("run_info", {})


def make(study: str, arm: str, seed: int, *, command: str | list[str], source: str = "measured",
         prov: dict | None = None, **fields) -> dict:
    """A record: the required keys first, then `fields` (metrics, flags, config, budget, curve, note, ...)."""
    if source not in SOURCES:
        raise ValueError(f"record source {source!r} is not one of {', '.join(SOURCES)}")
    cmd = command if isinstance(command, str) else " ".join(str(c) for c in command)
    return {"schema": SCHEMA, "study": study, "arm": arm, "seed": seed, "command": cmd, "source": source,
            "provenance": prov if prov is not None else provenance(), **fields}


def check(record: dict, where: str = "record") -> dict:
    """`record` if it has every required key and a known source, else ValueError naming what is missing."""
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    if record["source"] not in SOURCES:
        raise ValueError(f"{where}: source {record['source']!r} is not one of {', '.join(SOURCES)}")
    if record["source"] == "measured" and not record["provenance"].get("git_sha"):
        raise ValueError(f"{where}: a measured record without a git SHA (run experiments from a git checkout)")
    return record


def load(path: Path | str) -> list[dict]:
    """Every record in a JSON Lines file ([] when it does not exist), each checked."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e})") from None
            out.append(check(row, f"{path}:{i}"))
    return out


def write(path: Path | str, records: list[dict]) -> None:
    """Replace the file's records atomically (a kill leaves the old file or the new one, never half)."""
    atomic.write_text(path, "".join(json.dumps(check(r), separators=(",", ":")) + "\n" for r in records))


def append(path: Path | str, record: dict) -> None:
    """Add one record to the file (atomically)."""
    write(path, [*load(path), record])


def select(records: list[dict], **where) -> list[dict]:
    """The records whose fields equal every `where` value (e.g. study="planted", arm="uniform")."""
    return [r for r in records if all(r.get(k) == v for k, v in where.items())]
