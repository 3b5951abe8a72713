"""Byte classes: each byte's class from it and the byte before; held-out bits broken down by class add up to the
whole, a uniform model spends 8 bits in every class, and two runs' class differences add up to their BPB
difference; each class splits again by the bytes that begin one of the model's tokens (the byte after a boundary)."""

from __future__ import annotations

import pytest
import torch

from learntok.evaluation.bpb import BoundaryMode, heldout_bpb
from learntok.evaluation.byteclass import CLASSES, ClassBits, byte_classes, class_difference, token_split
from learntok.vocab import BOS, EOS, IGNORE

from .conftest import build_model
from .test_eval_bpb import heldout_seqs, patch_logits, successor_logits, uniform_logits


def test_each_byte_is_classed_by_itself_and_the_byte_before():
    text = "ab c,é\n9".encode()  # é is two bytes: a lead byte and a continuation byte
    ids = torch.tensor([[BOS, *text]])
    targets = torch.tensor([[*text, EOS]])
    names = [CLASSES[i] if i >= 0 else None for i in byte_classes(ids, targets)[0].tolist()]
    assert names == ["word start", "word inside", "space", "word start", "punctuation", "word start",
                     "word inside", "space", "word start", None]
    assert byte_classes(torch.tensor([[97]]), torch.tensor([[IGNORE]])).item() == -1


@pytest.mark.parametrize("logits", [uniform_logits, successor_logits])
def test_class_bits_add_up_to_the_held_out_bits(logits):
    model = patch_logits(build_model("learned"), logits)
    res = heldout_bpb(model, heldout_seqs(), BoundaryMode(), batch_size=4, max_bytes=64 * 10, by_class=True)
    c = res["by_class"]
    assert c["classes"] == list(CLASSES) and sum(c["bytes"]) == res["bytes"] and min(c["bytes"]) > 0
    assert sum(c["bits"]) / res["bytes"] == pytest.approx(res["bpb"], rel=1e-6)
    if logits is uniform_logits:  # 8 bits for every byte, whatever its class
        assert all(bits / n == pytest.approx(8.0) for bits, n in zip(c["bits"], c["bytes"]))
    assert "by_class" not in heldout_bpb(model, heldout_seqs(), BoundaryMode(), max_bytes=64 * 2)


def test_class_differences_add_up_to_the_bpb_difference_and_need_the_same_bytes():
    a = {"classes": list(CLASSES), "bits": [40.0, 30.0, 5.0, 5.0], "bytes": [10, 20, 5, 5]}
    b = {"classes": list(CLASSES), "bits": [50.0, 30.0, 4.0, 6.0], "bytes": [10, 20, 5, 5]}
    rows = class_difference(a, b)
    assert [r["class"] for r in rows] == list(CLASSES)
    assert rows[0]["diff"] == pytest.approx(-1.0) and rows[0]["share"] == pytest.approx(0.25)
    assert sum(r["contribution"] for r in rows) == pytest.approx((sum(a["bits"]) - sum(b["bits"])) / 40)
    with pytest.raises(ValueError, match="counted different bytes"):
        class_difference(a, {**b, "bytes": [11, 19, 5, 5]})


def test_a_model_that_predicts_tokens_has_no_byte_classes():
    model = build_model("learned")
    model.predicts_tokens = True
    with pytest.raises(ValueError, match="needs a model that predicts bytes"):
        heldout_bpb(model, heldout_seqs(), BoundaryMode(), max_bytes=64, by_class=True)


def test_a_tokens_first_byte_is_the_byte_after_a_boundary():
    text = b"ab cd"
    ids, targets = torch.tensor([[BOS, *text]]), torch.tensor([[*text, EOS]])
    bits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 0.0]])
    boundaries = torch.tensor([[True, False, True, True, False, True]])  # a_t: tokens BOS, "ab", " ", "cd"
    c = ClassBits()
    c.add(ids, targets, bits, boundaries)
    rows = {r["class"]: r for r in token_split(c.result())}
    # first bytes: "a" (after BOS), " " (after "b"), "c" (after " "); "b" and "d" are inside their tokens
    assert rows["word start"] == {"class": "word start", "bytes": 2, "first": 1.0, "bpb_first": 2.5, "bpb_rest": None}
    assert rows["word inside"] == {"class": "word inside", "bytes": 2, "first": 0.0, "bpb_first": None,
                                   "bpb_rest": 3.5}
    assert rows["space"]["first"] == 1.0 and rows["space"]["bpb_first"] == 3.0
    assert rows["all"] == {"class": "all", "bytes": 5, "first": 0.6, "bpb_first": 8 / 3, "bpb_rest": 3.5}
    plain = ClassBits()
    plain.add(ids, targets, bits)
    assert "token_first" not in plain.result()


@pytest.mark.parametrize("strategy", ["uniform", "flat"])
def test_held_out_first_bytes_are_where_the_models_boundaries_are(strategy):
    model = patch_logits(build_model(strategy), successor_logits)
    seqs = heldout_seqs()
    res = heldout_bpb(model, seqs, BoundaryMode(), batch_size=4, max_bytes=64 * 6, by_class=True)
    c = res["by_class"]
    if strategy == "flat":  # every byte a token
        assert c["token_first"] == {"bits": c["bits"], "bytes": c["bytes"]}
        return
    stride, last = model.boundary.stride, model.boundary.cfg.force_last
    expected = torch.zeros(len(CLASSES), dtype=torch.int64)
    for i in range(6):
        row = torch.from_numpy(seqs.batch([i]))
        cls = byte_classes(row[:, :-1], row[:, 1:])[0]
        t = torch.arange(cls.numel())
        first = (t % stride == 0) | ((t == cls.numel() - 1) & last)
        expected += torch.bincount(cls[first & (cls >= 0)], minlength=len(CLASSES))
    assert c["token_first"]["bytes"] == expected.tolist() and 0 < sum(expected) < sum(c["bytes"])
    split = token_split(c)
    assert all(r["bpb_first"] is None or r["bpb_first"] > 0 for r in split)
    assert split[-1]["first"] == pytest.approx(sum(expected).item() / res["bytes"])


def test_a_paired_class_row_says_where_each_runs_tokens_begin():
    a = {"classes": list(CLASSES), "bits": [40.0, 30.0, 5.0, 5.0], "bytes": [10, 20, 5, 5],
         "token_first": {"bits": [36.0, 3.0, 5.0, 1.0], "bytes": [9, 2, 5, 1]}}
    b = {"classes": list(CLASSES), "bits": [50.0, 30.0, 4.0, 6.0], "bytes": [10, 20, 5, 5]}
    rows = class_difference(a, b)
    assert [r["first_a"] for r in rows] == [0.9, 0.1, 1.0, 0.2] and all("first_b" not in r for r in rows)
