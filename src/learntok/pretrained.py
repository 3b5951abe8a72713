"""Shareable models: a directory with config.json + model.safetensors (+ strategy files such as a BPE
tokenizer, + a model card README.md), loadable without training code, optimizer state or data.

    model = learntok.from_pretrained("out/tiny-export")     # or a run, a checkpoint, or a Hub id "user/name"
    learntok.save_pretrained(model, "out/copy", seq_len=512)

`load(spec)` is what every command uses: a run directory (its newest intact checkpoint), a checkpoint directory
run/step_N, an exported directory, a bundled model's name (`enwiki-small`, shipped in the package), or a Hugging
Face Hub id (`user/name[@revision]`, `download`ed into the Hub's
cache through huggingface_hub.snapshot_download, so its tokens and environment variables apply, or read from the
cache only with HF_HUB_OFFLINE=1; learntok.hub pushes). It reads the weights only. Loading is strict:
another format version, a missing or an unknown tensor, or an unknown config key is an error naming the problem,
never a silent mismatch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model

from learntok import hf_files
from learntok.boundaries import BoundaryConfig
from learntok.boundaries.rates import RATE_CALIBRATION
from learntok.card import write_model_card
from learntok.config import CONFIG_VERSION, ModelConfig, boundary_from_dict, build, upgrade
from learntok.errors import LearntokError, MissingDependency
from learntok.version import __version__

FORMAT = "learntok-pretrained"
FORMAT_VERSION = 1
TOKENIZER_SETTINGS = "learntok_tokenizer.json"
"""A saved LearnedTokenizer's settings (learntok.tokenizer), copied with its model."""


def save_pretrained(model, out_dir: str | Path, *, seq_len: int, source_dir: str | Path | None = None,
                    card: bool = True) -> Path:
    """Write config.json + model.safetensors (+ for byte-level models the transformers files, learntok.hf_files;
    + the strategy's files from `source_dir`, the run directory, or else the directory the model was loaded
    from, and
    with `card` a model card README.md from what the run recorded; learntok.card.write_model_card). `out_dir`
    is new, empty or an earlier export: a training run's directory, or one with another model's config.json, is
    refused (its config.json would be replaced: a run could not be resumed)."""
    out = Path(out_dir)
    _check_export_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config_dict(model, seq_len)
    save_model(model, str(out / "model.safetensors"))
    if not getattr(model, "predicts_tokens", False):
        hf_files.write(out, seq_len)
    src_dir = Path(source_dir or getattr(model, "files_dir", None) or out)
    sources = model.boundary.artifact_sources(src_dir)
    if (src_dir / TOKENIZER_SETTINGS).exists():  # a saved LearnedTokenizer's settings travel with its model
        sources[TOKENIZER_SETTINGS] = src_dir / TOKENIZER_SETTINGS
    for name, src in sources.items():
        dst = out / name
        if src.exists() and src.resolve() == dst.resolve():
            continue
        _remove(dst)  # a file of an earlier export into `out` that this model does not have
        if src.is_dir():
            shutil.copytree(src, dst)
        elif src.exists():
            shutil.copy2(src, dst)
    if hasattr(model.boundary, "calibration"):  # the table in memory is the model's (a copied file may be stale)
        calibration = model.boundary.calibration
        calibration.save(out) if calibration is not None else _remove(out / RATE_CALIBRATION)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if card:
        write_model_card(out, model, seq_len, run_dir=source_dir)
    return out


def _check_export_dir(out: Path) -> None:
    if not out.is_dir():
        return
    if any((out / m).exists() for m in ("metrics.jsonl", "latest")) or any(out.glob("step_*")):
        raise ValueError(f"{out}: a training run's directory; export into a new or empty directory")
    cfg = out / "config.json"
    if cfg.is_file():
        try:
            ours = json.loads(cfg.read_text()).get("format") == FORMAT
        except (ValueError, AttributeError):
            ours = False
        if not ours:
            raise ValueError(f"{cfg}: not a learntok export's config (a run's, or another model's), and an export "
                             "would replace it; export into a new or empty directory")


def _remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


def config_dict(model, seq_len: int) -> dict:
    """config.json of an exported model: learntok's sections, and for byte-level models the keys that make the
    directory a transformers model too (learntok.transformers_model)."""
    cfg = {"format": FORMAT, "format_version": FORMAT_VERSION, "config_version": CONFIG_VERSION,
           "learntok_version": __version__, "seq_len": seq_len,
           "model": dataclasses.asdict(model.cfg),
           "boundary": model.boundary.exported_config(dataclasses.asdict(model.bcfg))}
    if not getattr(model, "predicts_tokens", False):
        cfg.update(hf_files.config_keys(seq_len))
    return cfg


def read_config(path: Path) -> tuple[ModelConfig, BoundaryConfig, int]:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{path}: no config.json (not a learntok model directory)")
    d = json.loads(cfg_path.read_text())
    if d.get("format") != FORMAT:
        raise ValueError(f"{cfg_path}: not a learntok pretrained config (export a run with `learntok export`)")
    if d.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{cfg_path}: format {d.get('format_version')} is not supported (this learntok reads "
                         f"{FORMAT_VERSION})")
    if missing := [k for k in ("model", "boundary", "seq_len") if k not in d]:
        raise ValueError(f"{cfg_path}: no {', '.join(missing)} (a learntok export has model, boundary and seq_len)")
    try:
        sections = upgrade({"model": d["model"], "boundary": d["boundary"]}, d.get("config_version"))
    except ValueError as e:
        raise ValueError(f"{cfg_path}: {e}") from None
    return (build(ModelConfig, sections["model"], f"{cfg_path}: model"),
            boundary_from_dict(sections["boundary"], f"{cfg_path}: boundary"), int(d["seq_len"]))


@dataclass
class Loaded:
    """A model and where it came from."""

    model: object
    """The ByteLM, in eval mode."""
    seq_len: int
    """The sequence length it was trained on."""
    path: Path
    """The local directory it was read from (for a Hub id: its snapshot in the cache)."""
    cfg: object | None = None
    """The run's TrainConfig (a run or checkpoint directory), or None (an exported model)."""
    run_dir: Path | None = None
    checkpoint: Path | None = None
    hub_id: str | None = None


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def hub_package():
    """The huggingface_hub package, or a MissingDependency saying how to install it."""
    try:
        import huggingface_hub
    except ImportError as e:
        raise MissingDependency("the Hugging Face Hub needs the huggingface_hub package: pip install "
                                "'learntok[hub]'") from e
    return huggingface_hub


def offline() -> bool:
    """Whether HF_HUB_OFFLINE is set (the Hub's cache only, never the network)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot of Hub model `repo_id` (from the cache, or downloaded into it)."""
    hub = hub_package()
    try:
        return Path(hub.snapshot_download(repo_id, revision=revision, local_files_only=offline(),
                                          library_name="learntok", library_version=__version__))
    except Exception as e:  # not cached offline, no such repository, no network, no access
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = "is not in the local Hub cache (HF_HUB_OFFLINE is set)" if offline() else \
            "could not be loaded from the Hugging Face Hub"
        raise LearntokError(f"{repo_id}: no such local directory, and the model {where}: {why}") from e


def is_pretrained_dir(path: Path) -> bool:
    """Whether `path` holds an exported model (a config.json of this format)."""
    try:
        return json.loads((path / "config.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


BUNDLED = ("enwiki-small",)
"""Models shipped inside the package (src/learntok/models/NAME, trained by experiments/bundled/run.py), loaded by
NAME or learntok/NAME with no network."""


def bundled(name: str) -> Path | None:
    """The directory of a bundled model named `name` (or `learntok/name`), or None."""
    name = name.removeprefix("learntok/")
    if name not in BUNDLED:
        return None
    path = Path(__file__).resolve().parent / "models" / name
    if not is_pretrained_dir(path):
        raise FileNotFoundError(f"{name}: the bundled model is missing from this installation ({path}); "
                                "rebuild it with experiments/bundled/run.py")
    return path


def resolve(spec: str | Path) -> tuple[Path, str | None]:
    """(a local directory, the Hub id it came from or None): `spec` itself if it exists, else a Hub id's
    snapshot."""
    path = Path(spec)
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"{spec}: not a directory (give a run, checkpoint or model directory)")
        return path, None
    text = str(spec)
    if (here := bundled(text)) is not None:  # a bundled model's name, whatever directories sit around it
        return here, None
    if path.parent.is_dir() and path.parent != Path("."):  # runs/tyop: a typo in a local path, not a Hub id
        near = sorted(p.name for p in path.parent.iterdir() if p.is_dir())[:8]
        raise FileNotFoundError(f"{spec}: no such directory ({path.parent} has: {', '.join(near) or 'nothing'}; "
                                "a Hub id USER/NAME is tried only when no local directory USER exists)")
    if HUB_ID.match(text) and not text.startswith("."):
        repo, _, revision = text.partition("@")
        return download(repo, revision or None), text
    raise FileNotFoundError(f"{spec}: no such directory (nor a Hugging Face Hub id user/name)")


def load(spec: str | Path, device: str | torch.device = "cpu") -> Loaded:
    """A model from a run directory, a checkpoint directory, an exported directory or a Hub id (weights only)."""
    path, hub_id = resolve(spec)
    try:
        json.loads((path / "config.json").read_text())
    except ValueError as e:  # else an exported model with a damaged config.json reads as "not a training run"
        raise ValueError(f"{path / 'config.json'}: not valid JSON ({e})") from None
    except OSError:
        pass  # no config.json: the loaders below say what is missing
    if is_pretrained_dir(path):
        model = _load_exported(path)
        return Loaded(model.to(device).eval(), model.seq_len, path, hub_id=hub_id)
    from learntok.checkpoint import checkpoint_and_run, load_run

    ckpt, run_dir = checkpoint_and_run(path)
    cfg, model = load_run(ckpt, device)
    return Loaded(model, cfg.data.seq_len, path, cfg=cfg, run_dir=run_dir, checkpoint=ckpt, hub_id=hub_id)


def _load_exported(path: Path):
    from learntok.model import build_model

    mcfg, bcfg, seq_len = read_config(path)
    model = build_model(mcfg, bcfg)
    model.seq_len = seq_len
    model.boundary.prepare([], [], path)
    model.files_dir = path  # where its strategy's files are (save_pretrained copies them from there)
    try:
        tensors = load_file(str(path / "model.safetensors"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no model.safetensors") from None
    except Exception as e:  # SafetensorError on a truncated or damaged file
        raise ValueError(f"{path}/model.safetensors cannot be read: {str(e).splitlines()[0]}") from e
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
    return model


def from_pretrained(path: str | Path, device: str | torch.device = "cpu"):
    """A ByteLM in eval mode from a `save_pretrained` directory, a training run or checkpoint directory, or a
    Hugging Face Hub id (weights only)."""
    return load(path, device).model


def export_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Convert a training run's newest intact checkpoint (or any model `load` reads) into a `save_pretrained`
    directory with a model card."""
    loaded = load(run_dir)
    return save_pretrained(loaded.model, out_dir, seq_len=loaded.seq_len,
                           source_dir=loaded.run_dir or loaded.path)
