"""Optional TensorBoard logging: scalars and a boundary-map image round-trip through the event files; a missing
tensorboard package is reported with the extra to install."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from learntok.train.logs import TensorBoardLogger


def test_missing_tensorboard_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'learntok\[tensorboard\]'"):
        TensorBoardLogger(tmp_path)


def test_scalars_and_boundary_image_are_written(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'learntok[tensorboard]')")
    pytest.importorskip("matplotlib")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoardLogger(tmp_path)
    rec = {"step": 3, "bytes": 768, "val/bpb": 7.5, "loss/auto": float("nan"), "note": "text", "flag": True}
    assert tb.scalars(3, rec) == 2  # bytes and val/bpb: not step, NaN, strings or booleans
    data = "Grüße 東京\n".encode()
    from learntok.viz import from_arrays, map_image

    tb.image(3, map_image(from_arrays(data, np.linspace(0, 1, len(data)), np.arange(len(data)) % 3 == 0)))
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0, "scalars": 0}).Reload()
    assert sorted(acc.Tags()["scalars"]) == ["bytes", "val/bpb"]
    assert [(e.step, e.value) for e in acc.Scalars("val/bpb")] == [(3, 7.5)]
    (img,) = acc.Images("boundaries/map")
    assert img.step == 3 and img.width > 100 and img.height > 20


def test_training_with_tensorboard_logs_scalars_and_maps(tmp_path, text_corpus):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'learntok[tensorboard]')")
    pytest.importorskip("matplotlib")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from learntok.train import train
    from learntok.viz.boundary_map import preview_hook

    from .conftest import tiny_train_config

    train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=4, eval_every=2, tensorboard=True),
          log=lambda *_: None, on_eval=preview_hook)
    acc = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    acc.Reload()
    assert "loss/auto" in acc.Tags()["scalars"] and "val/bpb" in acc.Tags()["scalars"]
    assert acc.Tags()["images"]
