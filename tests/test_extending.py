"""docs/extending.md's worked example: a strategy with two options added by one module and one registry line
trains from the command line, resumes, generates and keeps its options to itself."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from learntok.boundaries import REGISTRY, boundary_config
from learntok.cli import main
from learntok.vocab import BOS

from .conftest import build_model

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture
def every_k(tmp_path, monkeypatch):
    """The module of docs/extending.md, written to a file and registered (the registry line)."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    (tmp_path / "every_k_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(REGISTRY, "every-k", "every_k_example:EveryK")
    yield
    sys.modules.pop("every_k_example", None)


def test_the_new_strategy_places_its_boundaries(every_k, tmp_path):
    m = build_model("every-k", tmp_path, k=3, offset=1)
    ids = torch.full((2, 12), 97)
    ids[:, 0] = BOS
    mask = m(ids).boundaries.mask[0]
    assert mask.nonzero().squeeze(1).tolist() == [0, 1, 4, 7, 10]
    state = m.eval().init_state(2, torch.rand(2, 12))
    stepped = torch.stack([m.step(ids[:, t], state)[1] for t in range(12)], 1)
    assert torch.equal(stepped[0], mask)
    with pytest.raises(ValueError, match="offset < k"):
        boundary_config("every-k", k=3, offset=3)


def test_the_new_strategy_trains_from_the_command_line(every_k, tmp_path, text_corpus, capsys):
    run = tmp_path / "run"
    base = ["train", "--out", str(run), "--data", str(text_corpus), "--max-steps", "2", "--seq-len", "64",
            "--batch-size", "2", "--d-model", "32", "--val-bytes", "128", "--no-progress", "--boundaries", "every-k"]
    assert main([*base, "--k", "3", "--offset", "1"]) == 0
    assert "boundary rate" in capsys.readouterr().out
    boundary = json.loads((run / "config.json").read_text())["boundary"]
    assert boundary["boundaries"] == "every-k" and boundary["k"] == 3 and boundary["offset"] == 1
    assert main(["train", "--resume", str(run), "--max-steps", "3", "--no-progress"]) == 0
    # Its options are its own, and other strategies' options are not its.
    assert main([*base, "--gamma", "0.9"]) == 2
    assert "--gamma is an option of --boundaries learned" in capsys.readouterr().err
    assert main(["train", "--boundaries", "uniform", "--k", "3"]) == 2
    assert "--k is an option of --boundaries every-k, not of --boundaries uniform" in capsys.readouterr().err
