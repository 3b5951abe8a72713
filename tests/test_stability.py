"""Boundary stability and chunk statistics (learntok.evaluation.stability): rule-based strategies give known
answers (whitespace is shift-invariant; fixed patches move with the text start), the precision variants really
change the weights, and `learntok segment --stats` prints them."""

from __future__ import annotations

import json

import pytest
import torch

from learntok.evaluation.stability import _variant, chunk_stats, stability

from .conftest import build_model

TEXTS = [b"the cat sat on the mat and looked at the dog. " * 2, b"def f(x):\n    return x + 1\n" * 2]


def test_whitespace_boundaries_do_not_move_with_the_text_start():
    st = stability(build_model("whitespace").eval(), TEXTS, 255)
    assert st["shift"]["flip_rate"] == 0 and st["shift"]["f1"] == 1
    assert st["bf16"]["flip_rate"] == 0 and st["int8"]["flip_rate"] == 0


def test_fixed_patches_move_with_the_text_start():
    """uniform at rate 0.2 puts a boundary every 5 bytes from the start: a 5-byte shift keeps every boundary, a
    1-byte shift moves every one (F1 0)."""
    model = build_model("uniform", target_rate=0.2).eval()
    st = stability(model, TEXTS, 255, shifts=(1, 5))
    assert st["shift"]["per_shift"]["5"]["f1"] == 1 and st["shift"]["per_shift"]["5"]["flip_rate"] == 0
    one = st["shift"]["per_shift"]["1"]
    assert one["f1"] == 0 and one["flip_rate"] == pytest.approx(0.4, abs=0.02)


def test_precision_variants_change_the_weights():
    model = build_model("learned").eval()
    w = model.head.weight
    q = _variant(model, "int8").head.weight
    scale = w.abs().amax(1, keepdim=True) / 127
    assert not torch.equal(q, w) and ((q - w).abs() <= scale / 2 + 1e-7).all()
    assert len(torch.unique(q[0])) <= 255
    assert _variant(model, "bf16").head.weight.dtype == torch.bfloat16 and w.dtype == torch.float32


def test_chunk_stats():
    data = b"ab cd"
    flags = [True, False, True, False, False]  # tokens "ab", " cd": the boundary at the space, as SpaceByte's rule
    st = chunk_stats([2, 3], [flags], [data])
    assert st["bytes_per_token"] == 2.5 and st["bytes_per_token_cv"] == pytest.approx(0.5 / 2.5)
    assert st["whitespace_f1"] == 1
    off = chunk_stats([3, 2], [[True, False, False, True, False]], [data])  # one byte late
    assert off["whitespace_f1"] == 0


def test_segment_stats_command(tmp_path, capsys):
    from learntok.cli import main
    from learntok.pretrained import save_pretrained

    save_pretrained(build_model("whitespace").eval(), tmp_path / "m", seq_len=64)
    assert main(["segment", str(tmp_path / "m"), "--text", TEXTS[0].decode(), "--stats"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["whitespace_f1"] == 1 and st["stability"]["shift"]["flip_rate"] == 0
    assert st["bytes"] == len(TEXTS[0])


def test_stability_text_reads_nan_back_from_eval_json():
    """eval.json stores nan as null; `learntok eval` prints the stored block again on its next run (a
    TypeError once)."""
    from learntok.evaluation.stability import format_stability

    pair = {"flip_rate": None, "f1": None}
    text = format_stability({"bytes": 5, "shifts": [1], "shift": pair, "bf16": pair, "int8": pair})
    assert text.count("flip rate n/a, F1 n/a") == 3
