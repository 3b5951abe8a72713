"""Shareable checkpoints: a directory with config.json + model.safetensors (+ strategy files such as a BPE
tokenizer), loadable without training code, optimizer state or data.

    model = learntok.from_pretrained("out/tiny-export")
    learntok.save_pretrained(model, "out/copy", seq_len=512)

Loading is strict: another format version, a missing or an unknown tensor, or an unknown config key is an
error naming the problem, never a silent mismatch.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from learntok import __version__
from learntok.boundaries import BoundaryConfig
from learntok.config import CONFIG_VERSION, ModelConfig, boundary_from_dict, build, upgrade_v1

FORMAT = "learntok-pretrained"
FORMAT_VERSION = 1


def save_pretrained(model, out_dir: str | Path, *, seq_len: int, source_dir: str | Path | None = None) -> Path:
    """Write config.json + model.safetensors (+ the strategy's files from `source_dir`, the run directory)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"format": FORMAT, "format_version": FORMAT_VERSION, "config_version": CONFIG_VERSION,
           "learntok_version": __version__, "seq_len": seq_len,
           "model": dataclasses.asdict(model.cfg), "boundary": dataclasses.asdict(model.bcfg)}
    save_model(model, str(out / "model.safetensors"))
    for name in model.boundary.artifacts():
        src = Path(source_dir or out) / name
        if src.resolve() == (out / name).resolve():
            continue
        if src.is_dir():
            shutil.copytree(src, out / name, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, out / name)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def read_config(path: Path) -> tuple[ModelConfig, BoundaryConfig, int]:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{path}: no config.json (not a learntok model directory)")
    d = json.loads(cfg_path.read_text())
    if d.get("format") != FORMAT:
        raise ValueError(f"{cfg_path}: not a learntok pretrained config (export a run with `learntok export`)")
    if d.get("format_version") != FORMAT_VERSION or d.get("config_version") not in (1, CONFIG_VERSION):
        raise ValueError(f"{cfg_path}: format {d.get('format_version')} / config {d.get('config_version')} is not "
                         f"supported (this learntok reads {FORMAT_VERSION} / 1 and {CONFIG_VERSION})")
    sections = {"model": d["model"], "boundary": d["boundary"]}
    if d["config_version"] == 1:
        sections = upgrade_v1(sections)
    return (build(ModelConfig, sections["model"], f"{cfg_path}: model"),
            boundary_from_dict(sections["boundary"], f"{cfg_path}: boundary"), int(d["seq_len"]))


def from_pretrained(path: str | Path, device: str | torch.device = "cpu"):
    """A ByteLM in eval mode from a `save_pretrained` directory (or a training run directory)."""
    from learntok.model.lm import ByteLM

    path = Path(path)
    if (path / "latest").exists() and not (path / "model.safetensors").exists():
        from learntok.checkpoint import load_run

        return load_run(path, device)[1]
    mcfg, bcfg, seq_len = read_config(path)
    model = ByteLM(mcfg, bcfg)
    model.seq_len = seq_len
    model.boundary.prepare([], [], path)
    tensors = load_file(str(path / "model.safetensors"))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing or unknown:
        raise ValueError(f"{path}/model.safetensors does not match its config: missing {missing[:5]}, "
                         f"unknown {unknown[:5]}")
    bad = [k for k in expected if expected[k].shape != tensors[k].shape]
    if bad:
        raise ValueError(f"{path}/model.safetensors: shape mismatch for {bad[:5]}")
    model.load_state_dict(tensors)
    return model.to(device).eval()


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Convert a training run's latest checkpoint into a `save_pretrained` directory."""
    from learntok.checkpoint import load_run

    cfg, model = load_run(run_dir)
    return save_pretrained(model, out_dir, seq_len=cfg.data.seq_len, source_dir=run_dir)
