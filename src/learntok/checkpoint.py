"""Checkpoints: safetensors weights + a torch file of optimizer / RNG / data-position state, with a manifest.

Layout of a run directory:
    config.json          the TrainConfig (+ git SHA and library versions)
    metrics.jsonl        one JSON object per logged step / evaluation
    step_000200/         model.safetensors, train_state.pt, manifest.json (size and SHA-256 of each file)
    latest               name of the newest complete checkpoint directory

A checkpoint directory is written under a temporary name (`.step_000200.XXXX`) and renamed when complete, and
`latest` is replaced atomically afterwards, so an interrupted write never leaves a half checkpoint behind
`latest`. A write that fails (disk full, I/O error) removes its temporary directory and raises one
`CheckpointError` naming the directory and the space it needs; the previous checkpoint is untouched.

Reading never trusts a checkpoint blindly: `find_checkpoint` checks the newest one (sizes against the manifest,
the safetensors header, and for training state the checksums) and falls back to the newest intact one with a
warning. Inference reads the weights only (`load_weights`); only resuming reads the optimizer state.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_model, save_file, save_model

from learntok.errors import CheckpointError, LearntokWarning

WEIGHTS, STATE, MANIFEST = "model.safetensors", "train_state.pt", "manifest.json"


def _nbytes(obj) -> int:
    """Bytes of the tensors in a nested state (an estimate of what writing it needs)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def save_checkpoint(run_dir: Path, step: int, tensors: dict[str, torch.Tensor] | torch.nn.Module, state: dict,
                    keep: int = 2) -> Path:
    """Write step_{step:06d}/ atomically, point `latest` at it, keep the newest `keep` checkpoints.
    `tensors` is a model or a full state dict (e.g. gathered from FSDP shards). A failed write raises
    CheckpointError after removing its temporary files."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    module = isinstance(tensors, torch.nn.Module)
    need = _nbytes(dict(tensors.state_dict()) if module else tensors) + _nbytes(state)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=run_dir))
        if module:
            save_model(tensors, str(tmp / WEIGHTS))  # save_model handles tied/shared tensors
        else:
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS))
        torch.save(state, tmp / STATE)
        files = {f: {"size": (tmp / f).stat().st_size, "sha256": sha256(tmp / f)} for f in (WEIGHTS, STATE)}
        (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1) + "\n")
        final = run_dir / name
        if final.exists():  # the same step again: move the old copy aside, so `latest` never names a gap
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old.", dir=run_dir))
            os.replace(final, old / name)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        tmp = None
        pointer = run_dir / ".latest.tmp"
        pointer.write_text(name + "\n")
        os.replace(pointer, run_dir / "latest")
    except Exception as e:  # OSError, torch's RuntimeError and SafetensorError all wrap I/O failures
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        (run_dir / ".latest.tmp").unlink(missing_ok=True)
        try:
            free = f"{_mb(shutil.disk_usage(run_dir).free)} free"
        except OSError:
            free = "free space unknown"
        prev = latest_checkpoint(run_dir, verify=False)
        raise CheckpointError(
            f"could not write checkpoint {name} in {run_dir}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            f" (it needs about {_mb(need)}; {free}); its temporary files were removed, "
            + (f"the previous checkpoint {prev.name} is untouched" if prev else "there is no earlier checkpoint")
        ) from e
    for old_ckpt in _steps(run_dir)[:-keep]:
        shutil.rmtree(old_ckpt, ignore_errors=True)
    return final


def clean_stale(run_dir: Path) -> list[str]:
    """Remove temporary checkpoint directories and pointer files left by an interrupted or failed write."""
    stale = [p for p in run_dir.glob(".step_*") if p.is_dir()] + [p for p in [run_dir / ".latest.tmp"] if p.exists()]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return [p.name for p in stale]


def _safetensors_problem(path: Path, size: int) -> str | None:
    """Why a safetensors file is unreadable (its header and the data length it declares), or None."""
    if size < 8:
        return f"{path.name} is truncated ({size} bytes)"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            return f"{path.name} is truncated ({size:,} bytes, its header alone needs {n + 8:,})"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"{path.name} has a damaged header"
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        return f"{path.name} is truncated ({size:,} of {8 + n + end:,} bytes)"
    return None


def checkpoint_problem(path: Path, *, weights_only: bool = False, checksums: bool = True) -> str | None:
    """What is wrong with checkpoint directory `path`, or None when it is intact. Checks the files' sizes (and,
    with `checksums`, their SHA-256) against manifest.json when there is one, and always the safetensors header;
    `weights_only` checks model.safetensors alone (enough for inference)."""
    files = [WEIGHTS] if weights_only else [WEIGHTS, STATE]
    try:
        manifest = json.loads((path / MANIFEST).read_text())["files"] if (path / MANIFEST).exists() else {}
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is damaged"
    for f in files:
        p = path / f
        if not p.is_file():
            return f"{f} is missing"
        size = p.stat().st_size
        want = manifest.get(f)
        if want and size != want["size"]:
            return f"{f} has {size:,} bytes, its manifest says {want['size']:,}"
        if f == WEIGHTS and (problem := _safetensors_problem(p, size)):
            return problem
        if f == STATE and not want and not zipfile.is_zipfile(p):  # torch.save writes a zip archive
            return f"{f} is truncated or damaged"
        if checksums and want and sha256(p) != want["sha256"]:
            return f"{f} does not match its checksum"
    return None


def _steps(run_dir: Path) -> list[Path]:
    """Checkpoint directories oldest to newest, by step number (names sort wrongly from step 1,000,000: 7 digits)."""
    ckpts = [p for p in run_dir.glob("step_*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(ckpts, key=lambda p: int(p.name[5:]))


def _candidates(run_dir: Path) -> list[Path]:
    """Checkpoint directories, the one `latest` names first, then newest to oldest."""
    ckpts = _steps(run_dir)[::-1]
    pointer = run_dir / "latest"
    named = run_dir / pointer.read_text().strip() if pointer.is_file() else None
    return ([named] if named is not None and named.is_dir() else []) + [p for p in ckpts if p != named]


def find_checkpoint(run_dir: Path, *, weights_only: bool = False, checksums: bool = True
                    ) -> tuple[Path | None, list[str]]:
    """(the newest intact checkpoint of a run or None, one message per damaged newer one)."""
    skipped: list[tuple[Path, str]] = []
    for path in _candidates(run_dir):
        problem = checkpoint_problem(path, weights_only=weights_only, checksums=checksums)
        if problem is None:
            return path, [f"checkpoint {bad} is damaged ({why}); using {path.name}" for bad, why in skipped]
        skipped.append((path, problem))
    if skipped:
        return None, [f"no intact checkpoint in {run_dir} ({'; '.join(f'{p.name}: {w}' for p, w in skipped)})"]
    return None, []


def latest_checkpoint(run_dir: Path, *, verify: bool = True, weights_only: bool = True) -> Path | None:
    """The newest intact checkpoint of a run (None if it has none); a damaged newer one is skipped with a
    LearntokWarning. Without `verify`: the directory `latest` names, if it exists."""
    if not verify:
        named = _candidates(run_dir)
        return named[0] if named and (run_dir / "latest").is_file() else None
    path, notes = find_checkpoint(run_dir, weights_only=weights_only, checksums=False)
    for note in notes:
        warnings.warn(note, LearntokWarning, stacklevel=2)
    return path


def load_weights(path: Path, model: torch.nn.Module) -> None:
    """Load a checkpoint's weights into `model` (strict: a missing or unexpected tensor is an error)."""
    problem = checkpoint_problem(path, weights_only=True, checksums=False)
    if problem:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
    try:
        missing, unexpected = load_model(model, str(path / WEIGHTS), strict=False)
    except RuntimeError as e:  # a tensor of another shape: the config does not describe these weights
        last = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()
        raise CheckpointError(f"checkpoint {path} does not match its config's model ({last})") from e
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")


def load_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """Load weights into `model` and return the training state (optimizer, data position, RNG, counters)."""
    load_weights(path, model)
    try:
        return torch.load(path / STATE, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path}: {STATE} cannot be read ({e})") from e


def checkpoint_and_run(path: Path) -> tuple[Path, Path]:
    """(checkpoint directory, run directory) of a run directory (its newest intact checkpoint, with a warning for
    each damaged newer one) or a checkpoint directory `run/step_NNNNNN`."""
    if (path / WEIGHTS).exists() and (path.parent / "config.json").exists():
        return path, path.parent
    if (path / WEIGHTS).exists() and (path / "config.json").exists():
        raise ValueError(f"{path}: an exported model directory, not a training run (load it with "
                         "learntok.from_pretrained)")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a learntok run or checkpoint directory (no config.json)")
    ckpt, notes = find_checkpoint(path, weights_only=True, checksums=False)
    if ckpt is None:  # the error says it once (not also as a warning)
        raise CheckpointError(notes[0] if notes else f"{path}: the run has no complete checkpoint yet")
    for note in notes:
        warnings.warn(note, LearntokWarning, stacklevel=2)
    return ckpt, path


def load_run(path: str | Path, device: str | torch.device = "cpu"):
    """(TrainConfig, ByteLM in eval mode) from a run directory (its newest intact checkpoint) or a checkpoint
    directory `run/step_NNNNNN`: weights only, no optimizer state. The strategy is prepared from files saved in
    the run directory (e.g. a BPE tokenizer), so no training data is needed."""
    from learntok.config import load_json
    from learntok.model import build_model

    ckpt, run_dir = checkpoint_and_run(Path(path))
    cfg = load_json(str(run_dir / "config.json"))
    model = build_model(cfg.model, cfg.boundary)
    model.boundary.prepare([], [], run_dir)
    model.files_dir = run_dir  # where its strategy's files are (save_pretrained copies them from there)
    load_weights(ckpt, model)
    model.seq_len = cfg.data.seq_len  # the context length it was trained on (used to window long texts)
    from learntok.boundaries.rates import warn_mismatch

    warn_mismatch(model, checkpoint=ckpt.name)  # a calibration table fitted on another checkpoint
    return cfg, model.to(device).eval()
