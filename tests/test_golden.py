"""A golden loss curve: 50 steps of a tiny learned-boundary model on fixed text, seed 0, one thread, compared
step by step with tests/golden/tiny_curve.json. Any numerical change to the model, the estimator, the sampler, the
optimizer or the data path moves these numbers, so a change that was meant to be behaviour-preserving (a refactor)
must leave them as they are.

Tolerance: 1e-5 relative (and 1e-8 absolute) on each logged loss and rate. On one CPU type a run is bit-exact;
the margin only absorbs benign reordering of float sums (another BLAS build), and a real change moves a 50-step
curve by far more (a 1 % change of the learning rate moves its losses by 0.4 % at the second step).

To change the numbers deliberately (a change of model or estimator that is meant to change them), regenerate the
file and commit it with the change, saying why:

    LEARNTOK_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from learntok.train import train

from .conftest import tiny_train_config

GOLDEN = Path(__file__).parent / "golden" / "tiny_curve.json"
KEYS = ("loss/auto", "loss/early", "loss/policy", "boundary/rate")
WORDS = ("the river tokens learn bytes model a of to in is that boundary word policy gradient estimate early exit "
         "reward batch relative discount patch flat sample seed").split()


def _text(n_words: int, seed: int) -> str:
    """Deterministic English-like text that depends on nothing installed (random.Random.random is stable)."""
    rng = random.Random(seed)
    words = [WORDS[int(rng.random() * len(WORDS))] for _ in range(n_words)]
    return "\n".join(" ".join(words[i:i + 12]) + "." for i in range(0, n_words, 12)) + "\n"


def _curve(tmp_path: Path) -> list[dict]:
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "valid").mkdir()
    (data / "train" / "0.txt").write_text(_text(12_000, 0))
    (data / "valid" / "0.txt").write_text(_text(600, 1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(tiny_train_config(tmp_path / "run", data, max_steps=50), log=lambda *_: None)
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], **{k: r[k] for k in KEYS}} for r in rows if "loss/auto" in r]


def test_the_tiny_loss_curve_is_the_golden_one(tmp_path):
    curve = _curve(tmp_path)
    assert len(curve) == 50
    if os.environ.get("LEARNTOK_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({"note": "tests/test_golden.py; regenerate with LEARNTOK_UPDATE_GOLDEN=1",
                                      "torch": torch.__version__, "curve": curve}, indent=1) + "\n")
        pytest.skip(f"rewrote {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())["curve"]
    assert [r["step"] for r in curve] == [r["step"] for r in golden]
    for got, want in zip(curve, golden):
        for k in KEYS:
            assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-8), (got["step"], k)
