"""Shared fixtures: tiny CPU configs and small on-disk corpora."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learntok.config import BoundaryConfig, DataConfig, ModelConfig, TrainConfig

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

torch.set_num_threads(1)  # tiny test models: threads cost more than they give, most of all on a busy machine


def sample_docs() -> list[bytes]:
    """Small real documents (PyTorch's own source) for strategies that need preparing (BPE, entropy)."""
    lines = Path(torch.__file__).read_text(encoding="utf-8").splitlines()
    return ["\n".join(lines[i:i + 60]).encode() for i in range(0, 1200, 60)]


def build_model(strategy: str, run_dir: Path | None = None, model_kw: dict | None = None, **boundary_kw):
    """A seeded tiny ByteLM in train mode with its strategy prepared on `sample_docs()`."""
    from learntok.model.lm import ByteLM

    torch.manual_seed(0)
    bkw = dict(boundaries=strategy, policy_window=3)
    bkw.update(boundary_kw)
    m = ByteLM(tiny_model(**(model_kw or {})), BoundaryConfig(**bkw))
    docs = sample_docs()
    m.boundary.prepare(docs[:-2], docs[-2:], run_dir)
    return m.train()


def prescribed_for(model, ids: torch.Tensor) -> torch.Tensor | None:
    """Flags the data pipeline would attach to input rows `ids` (B,T) (BOS first), or None."""
    from learntok.boundaries import BoundaryStrategy

    if type(model.boundary).annotate is BoundaryStrategy.annotate:
        return None
    rows = []
    for row in ids.tolist():
        data = bytes(b for b in row[1:] if b < 256)
        flags = [True] + [bool(f) for f in model.boundary.annotate(data)]
        rows.append(flags[: len(row)])
    return torch.tensor(rows)


def tiny_model(**kw) -> ModelConfig:
    base = dict(d_model=32, n_heads=2, n_down=1, n_mid=1, n_up=1, byte_window=8)
    base.update(kw)
    return ModelConfig(**base)


@pytest.fixture
def text_corpus(tmp_path: Path) -> Path:
    """A directory with train/valid .txt files of real-looking English and code."""
    d = tmp_path / "corpus"
    (d / "train").mkdir(parents=True)
    (d / "valid").mkdir()
    src = Path(torch.__file__).read_text(encoding="utf-8")  # real text that is always there
    lines = src.splitlines()
    for i in range(8):
        (d / "train" / f"{i}.txt").write_text("\n".join(lines[i * 200:(i + 1) * 200]) + "\n")
    (d / "valid" / "0.txt").write_text("\n".join(lines[1600:1800]) + "\n")
    return d


def tiny_train_config(out: Path, data: Path | str, **kw) -> TrainConfig:
    base = dict(
        out=str(out), model=tiny_model(), boundary=BoundaryConfig(),
        data_cfg=DataConfig(data=str(data), seq_len=64, val_bytes=64 * 8),
        batch_size=4, max_steps=6, warmup_bytes=256, lr=3e-3, log_every=1, eval_every=0, ckpt_every=0,
        progress=False, seed=0,
    )
    base.update(kw)
    return TrainConfig(**base)
