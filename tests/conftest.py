"""Shared fixtures: tiny CPU configs and small on-disk corpora."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learntok.boundaries import boundary_config
from learntok.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

torch.set_num_threads(1)  # tiny test models: threads cost more than they give, most of all on a busy machine


def sample_docs() -> list[bytes]:
    """Small real documents (PyTorch's own source) for strategies that need preparing (BPE, entropy)."""
    lines = Path(torch.__file__).read_text(encoding="utf-8").splitlines()
    return ["\n".join(lines[i:i + 60]).encode() for i in range(0, 1200, 60)]


def build_model(strategy: str, run_dir: Path | None = None, model_kw: dict | None = None, **boundary_kw):
    """A seeded tiny U-Net (a HierLM with inner_layers in model_kw) in train mode with its strategy prepared on
    `sample_docs()` (the learned policy conditions on 3 previous boundaries unless told otherwise)."""
    from learntok.model import build_model as build

    torch.manual_seed(0)
    bkw = dict(policy_window=3) if strategy == "learned" else {}
    bkw.update(boundary_kw)
    m = build(tiny_model(**(model_kw or {})), boundary_config(strategy, **bkw))
    docs = sample_docs()
    m.boundary.prepare(docs[:-2], docs[-2:], run_dir)
    return m.train()


def prescribed_for(model, ids: torch.Tensor) -> torch.Tensor | None:
    """Flags the data pipeline would attach to input rows `ids` (B,T) (BOS first), or None."""
    annotate = model.boundary.annotator
    if annotate is None:
        return None
    rows = []
    for row in ids.tolist():
        data = bytes(b for b in row[1:] if b < 256)
        flags = [True] + [bool(f) for f in annotate(data)]
        rows.append(flags[: len(row)])
    return torch.tensor(rows)


def tiny_model(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=2, n_down=1, n_mid=1, n_up=1, byte_window=8)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture
def text_corpus(tmp_path: Path) -> Path:
    """A directory with train/valid .txt files of real-looking English and code."""
    return write_text_corpus(tmp_path / "corpus")


def write_text_corpus(d: Path) -> Path:
    """Write text_corpus's files into `d` (for fixtures of a wider scope)."""
    (d / "train").mkdir(parents=True)
    (d / "valid").mkdir()
    src = Path(torch.__file__).read_text(encoding="utf-8")  # real text that is always there
    lines = src.splitlines()
    for i in range(8):
        (d / "train" / f"{i}.txt").write_text("\n".join(lines[i * 200:(i + 1) * 200]) + "\n")
    (d / "valid" / "0.txt").write_text("\n".join(lines[1600:1800]) + "\n")
    return d


def tiny_train_config(out: Path, data: Path | str, **kw) -> TrainConfig:
    """A few-step run of a tiny model on `data`; keyword arguments override TrainConfig fields, and `lr` /
    `warmup_bytes` the optimizer's."""
    optim = {k: kw.pop(k) for k in ("lr", "warmup_bytes") if k in kw}
    base = dict(
        out=str(out), model=tiny_model(), boundary=boundary_config("learned"),
        data=DataConfig(source=str(data), seq_len=64, val_bytes=64 * 8),
        optim=OptimConfig(**{"warmup_bytes": 256, "lr": 3e-3, **optim}),
        batch_size=4, max_steps=6, log_every=1, eval_every=0, ckpt_every=0, progress=False, seed=0,
    )
    base.update(kw)
    return TrainConfig(**base)
