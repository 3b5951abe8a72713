"""Statistics: standard errors, token lengths, agreement with whitespace / BPE boundaries, policy terms, FLOPs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learntok.boundaries.base import BoundaryOutput
from learntok.data import ByteSequences
from learntok.evaluation.bpb import BoundaryMode, evaluating, heldout_bpb, text_noise
from learntok.evaluation.report import inference_flops
from learntok.evaluation.stats import BoundaryStats, mean_se, prf, ratio_se, token_lengths

from .conftest import build_model, sample_docs


def test_mean_se_and_ratio_se():
    v = [1.0, 2.0, 4.0, 7.0]
    m = mean_se(v)
    assert m["mean"] == 3.5 and m["se"] == pytest.approx(np.std(v, ddof=1) / 2) and m["n"] == 4
    assert mean_se([5.0])["se"] == 0.0
    # Equal denominators: the ratio estimator is the plain mean of the per-unit ratios, with the same SE.
    num = np.array([3.0, 5.0, 9.0])
    r = ratio_se(num, [2.0, 2.0, 2.0])
    assert r["mean"] == pytest.approx(17 / 6) and r["se"] == pytest.approx(mean_se(num / 2)["se"])
    # Unequal: pooled ratio, delta-method SE by hand.
    a, b = np.array([1.0, 4.0]), np.array([1.0, 3.0])
    R = 5 / 4
    se = math.sqrt(((a - R * b) ** 2).sum() / 2) / 2
    assert ratio_se(a, b)["mean"] == R and ratio_se(a, b)["se"] == pytest.approx(se)


def test_prf_and_token_lengths_worked_examples():
    assert prf(3, 1, 2) == {"precision": 0.75, "recall": 0.6, "f1": 6 / 9, "tp": 3, "fp": 1, "fn": 2}
    mask = torch.tensor([[1, 0, 0, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert sorted(token_lengths(mask).tolist()) == [1, 1, 2, 3]  # row 0: 3, 2, 1; row 1: 1 (tails not counted)


def test_boundary_stats_counts():
    ids = torch.tensor([[256, *b"ab cd, e"]])  # positions 0..8
    mask = torch.zeros(1, 9, dtype=torch.bool)
    mask[0, [0, 3, 4, 8]] = True
    lp = torch.full((1, 9), -0.5)
    free = torch.ones(1, 9, dtype=torch.bool)
    free[0, 0] = False
    s = BoundaryStats()
    s.add(ids, BoundaryOutput(mask=mask, probs=torch.full((1, 9), 0.25), log_prob=lp, free=free))
    r = s.result()
    # whitespace (SpaceByte) boundaries: ' ' at 3, ',' at 6 -> model hits 3, misses 6, false 4 and 8
    w = r["agreement"]["whitespace"]
    assert (w["tp"], w["fp"], w["fn"]) == (1, 2, 1) and w["reference_rate"] == 2 / 8
    assert r["rate"] == 4 / 9 and r["neg_log_pi"] == 0.5 and r["bytes_per_token"] == pytest.approx(8 / 3)
    assert r["policy_entropy"] == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert r["bytes_per_token_hist"][:4] == [1, 0, 1, 1]


def _seqs(model=None):
    docs = [d[:300] for d in sample_docs()]
    return docs, ByteSequences(docs, 64, True, annotate=model.boundary.annotator if model is not None else None)


def test_whitespace_strategy_agrees_exactly_with_whitespace():
    model = build_model("whitespace")
    stats = BoundaryStats()
    heldout_bpb(model, _seqs()[1], BoundaryMode(), max_bytes=64 * 8, stats=stats)
    r = stats.result()
    assert r["agreement"]["whitespace"]["f1"] == 1.0 and r["neg_log_pi"] is None
    # Negative control: evenly spaced boundaries agree only partly, near the chance level.
    stats = BoundaryStats()
    heldout_bpb(build_model("uniform"), _seqs()[1], BoundaryMode(), max_bytes=64 * 8, stats=stats)
    a = stats.result()["agreement"]["whitespace"]
    assert a["f1"] < 0.6 and abs(a["f1"] - a["f1_chance"]) < 0.15


def test_learned_policy_statistics_match_a_direct_forward():
    model = build_model("learned")
    seqs = _seqs()[1]
    bm = BoundaryMode()
    stats = BoundaryStats()
    heldout_bpb(model, seqs, bm, max_bytes=64 * 3, stats=stats)
    nlp, n, bound = 0.0, 0, 0
    with evaluating(model, bm):
        for i in range(3):
            ids = torch.from_numpy(seqs.batch([i]))[:, :-1]
            out = model(ids, noise=torch.from_numpy(text_noise(bm, i, 0, 64))[None]).boundaries
            nlp += float(-out.log_prob.detach()[out.free].sum())
            n += int(out.free.sum())
            bound += int(out.mask.sum())
    r = stats.result()
    assert r["neg_log_pi"] == pytest.approx(nlp / n, rel=1e-6) and r["rate"] == bound / (3 * 64)


def test_bpe_strategy_agrees_exactly_with_its_own_tokenizer(tmp_path):
    """The BPE reference of `learntok eval --bpe-tokenizer` is the BPE strategy's own rule: a BPE-guided model
    compared with its tokenizer file gets F1 = 1; whitespace boundaries agree only partly."""
    pytest.importorskip("tokenizers", reason="the tokenizers package is not installed")
    from learntok.boundaries.bpe import TOKENIZER_FILE
    from learntok.evaluation.report import _bpe_reference

    model = build_model("bpe", run_dir=tmp_path, bpe_vocab_size=400)
    docs, seqs = _seqs(model)
    ref = ByteSequences(docs, 64, True, annotate=_bpe_reference(str(tmp_path / TOKENIZER_FILE)))
    for strategy, f1 in (("bpe", 1.0), ("whitespace", None)):
        m = model if strategy == "bpe" else build_model("whitespace")
        stats = BoundaryStats()
        heldout_bpb(m, seqs if strategy == "bpe" else _seqs()[1], BoundaryMode(), max_bytes=64 * 8,
                    references={"bpe": ref}, stats=stats)
        a = stats.result()["agreement"]
        if f1 is not None:
            assert a["bpe"]["f1"] == f1
        else:
            assert 0 < a["bpe"]["f1"] < 1 and a["bpe"]["reference_rate"] > a["whitespace"]["reference_rate"]


def test_inference_flops_by_hand():
    model = build_model("learned")
    byte = token = 0
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.startswith(("embed", "head_early")):
            continue
        if name.startswith("mid."):
            token += p.numel()
        else:
            byte += p.numel()
    f = inference_flops(model, 0.25)
    assert (f["byte_params"], f["token_params"]) == (byte, token)
    assert f["per_byte"] == 2 * byte + 2 * token * 0.25


def test_agreement_at_a_shift_reveals_boundaries_one_byte_off():
    """A model whose boundaries sit one byte before the reference's scores F1 0 at shift 0 and 1 at shift +1,
    so an off-by-one convention reads as such, not as a strategy that ignores the text."""
    ids = torch.full((2, 40), 97)
    ref = torch.zeros(2, 40, dtype=torch.bool)
    ref[:, 5::6] = True
    early = torch.roll(ref, -1, 1)  # every boundary one byte early
    stats = BoundaryStats()
    stats.add(ids, BoundaryOutput(mask=early, probs=early.float()), {"ref": ref})
    a = stats.result()["agreement"]["ref"]
    assert a["f1"] == 0.0 and a["f1_by_shift"]["1"] == 1.0 and a["best_shift"] == 1
    assert a["f1_by_shift"]["-1"] == 0.0
    assert (a["at_best_shift"]["precision"], a["at_best_shift"]["recall"]) == (1.0, 1.0)
    sparse = early.clone()
    sparse[:, 10::12] = False  # every other boundary dropped: still all at word ends, half of them
    stats = BoundaryStats()
    stats.add(ids, BoundaryOutput(mask=sparse, probs=sparse.float()), {"ref": ref})
    a = stats.result()["agreement"]["ref"]
    assert a["best_shift"] == 1 and a["at_best_shift"]["precision"] == 1.0 and a["at_best_shift"]["recall"] == 0.5
    stats = BoundaryStats()  # the reference itself: best at 0
    stats.add(ids, BoundaryOutput(mask=ref, probs=ref.float()), {"ref": ref})
    assert stats.result()["agreement"]["ref"]["best_shift"] == 0


def test_paired_bootstrap_reads_what_two_models_share_as_shared():
    """Identical scores: a zero difference with a zero-width interval. B = A + 0.1 bits per byte on every
    document: every resample's difference is exactly 0.1, however hard the documents are (what both share
    cancels). A difference on one document of many: the interval covers the true difference and 0 is a tie.
    Units of unequal count are refused."""
    from learntok.evaluation.stats import paired_bootstrap

    rng = np.random.default_rng(0)
    n_bytes = rng.integers(100, 2000, 50)
    bits = n_bytes * rng.uniform(1.0, 3.0, 50)  # documents of very different difficulty
    same = paired_bootstrap(bits, bits, n_bytes, resamples=500)
    assert (same["mean"], same["lo"], same["hi"], same["tie"]) == (0.0, 0.0, 0.0, True)
    worse = paired_bootstrap(bits + 0.1 * n_bytes, bits, n_bytes, resamples=500)
    assert worse["mean"] == pytest.approx(0.1) and worse["lo"] == pytest.approx(0.1) and not worse["tie"]
    one = bits.copy()
    one[0] += 50.0
    r = paired_bootstrap(one, bits, n_bytes, resamples=2000)
    assert r["lo"] <= 0.0 <= r["hi"] and r["lo"] <= r["mean"] <= r["hi"] and r["tie"]
    assert r["mean"] == pytest.approx(50.0 / n_bytes.sum())
    noisy = bits + rng.normal(0.0, 20.0, 50)  # every document a little different
    wide, half = (paired_bootstrap(noisy, bits, n_bytes, resamples=2000, level=q) for q in (0.95, 0.5))
    assert wide["lo"] < half["lo"] < half["hi"] < wide["hi"]  # the same draws, inner quantiles
    with pytest.raises(ValueError, match="same >= 2 units"):
        paired_bootstrap(bits, bits[:-1], n_bytes)
