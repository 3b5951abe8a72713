"""Checkpoints: safetensors weights + a torch file of optimizer / RNG / data-position state.

Layout of a run directory:
    config.json          the TrainConfig (+ git SHA and library versions)
    metrics.jsonl        one JSON object per logged step / evaluation
    step_000200/         model.safetensors, train_state.pt
    latest               name of the newest complete checkpoint directory

A checkpoint directory is written under a temporary name and renamed when complete, and `latest` is
replaced atomically afterwards, so an interrupted write never leaves a half checkpoint behind `latest`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_model, save_file, save_model


def save_checkpoint(run_dir: Path, step: int, tensors: dict[str, torch.Tensor] | torch.nn.Module, state: dict,
                    keep: int = 2) -> Path:
    """Write step_{step:06d}/ atomically, point `latest` at it, keep the newest `keep` checkpoints.
    `tensors` is a model or a full state dict (e.g. gathered from FSDP shards)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=run_dir))
    if isinstance(tensors, torch.nn.Module):
        save_model(tensors, str(tmp / "model.safetensors"))  # save_model handles tied/shared tensors
    else:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
    torch.save(state, tmp / "train_state.pt")
    final = run_dir / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = run_dir / ".latest.tmp"
    pointer.write_text(name + "\n")
    os.replace(pointer, run_dir / "latest")
    ckpts = sorted(p for p in run_dir.glob("step_*") if p.is_dir())
    for old in ckpts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The directory `latest` names, or None if the run has no complete checkpoint."""
    pointer = run_dir / "latest"
    if not pointer.exists():
        return None
    path = run_dir / pointer.read_text().strip()
    return path if (path / "model.safetensors").exists() and (path / "train_state.pt").exists() else None


def load_checkpoint(path: Path, model: torch.nn.Module) -> dict:
    """Load weights into `model` (strict: a missing or unexpected tensor is an error) and return the state."""
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    return torch.load(path / "train_state.pt", map_location="cpu", weights_only=True)


def load_run(path: str | Path, device: str | torch.device = "cpu"):
    """(TrainConfig, ByteLM in eval mode) from a run directory (its latest checkpoint) or a checkpoint
    directory `run/step_NNNNNN`. The strategy is prepared from files saved in the run directory (e.g. a BPE
    tokenizer), so no training data is needed."""
    from learntok.config import load_json
    from learntok.model.lm import ByteLM

    path = Path(path)
    if (path / "model.safetensors").exists():
        ckpt, run_dir = path, path.parent
    else:
        run_dir = path
        if not (run_dir / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a learntok run or checkpoint directory (no config.json)")
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"{path}: the run has no complete checkpoint yet")
    cfg = load_json(str(run_dir / "config.json"))
    model = ByteLM(cfg.model, cfg.boundary)
    model.boundary.prepare([], [], run_dir)
    load_checkpoint(ckpt, model)
    model.seq_len = cfg.data.seq_len  # the context length it was trained on (used to window long texts)
    return cfg, model.to(device).eval()
