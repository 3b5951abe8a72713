"""Scoring: exact BPB of a model with known predictions, batching/padding invariance, boundary modes,
left truncation, and greedy decoding against the teacher-forced shortcut."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learntok.data import ByteSequences
from learntok.evaluation.bpb import (
    BoundaryMode,
    evaluating,
    forward_nll,
    greedy_decode,
    heldout_bpb,
    score_pairs,
    text_noise,
)
from learntok.vocab import IGNORE, VOCAB_SIZE

from .conftest import build_model, sample_docs

STRATEGIES = ["learned", "uniform", "uniform-random", "whitespace"]
PAIRS = [(b"def forward(self, x):\n    return", b" x + 1"), (b"", b"import torch"), (b"a", b"b"),
         (b"The quick brown fox jumps over the lazy dog. " * 2, b" Again."), (b"x = [", b"1, 2, 3]\n")]


def patch_logits(model, fn):
    """Replace the model's next-byte logits by fn(ids) (B,T,V); boundaries and everything else run as usual."""
    orig = model.forward

    def forward(ids, targets=None, **kw):
        out = orig(ids, targets, **kw)
        out.logits = fn(ids)
        return out

    model.forward = forward
    return model


def uniform_logits(ids: torch.Tensor) -> torch.Tensor:
    """Exactly uniform over the 256 bytes, impossible specials."""
    logits = torch.zeros(*ids.shape, VOCAB_SIZE)
    logits[..., 256:] = -math.inf
    return logits


def successor_logits(ids: torch.Tensor) -> torch.Tensor:
    """Prefers byte (x_t + 1) mod 256 after x_t: a model whose greedy continuation is known."""
    logits = 5.0 * torch.nn.functional.one_hot((ids % 256 + 1) % 256, VOCAB_SIZE).float()
    logits[..., 256:] = -math.inf
    return logits


def heldout_seqs(model=None, seq_len: int = 64) -> ByteSequences:
    docs = [d[:150] for d in sample_docs()]  # short documents, so packed sequences hold EOS separators
    return ByteSequences(docs, seq_len, True, annotate=model.boundary.annotator if model is not None else None)


def test_uniform_model_is_exactly_8_bits_per_byte():
    model = patch_logits(build_model("learned"), uniform_logits)
    res = heldout_bpb(model, heldout_seqs(), BoundaryMode(), batch_size=4, max_bytes=64 * 10)
    assert res["sequences"] == 10 and abs(res["bpb"] - 8.0) < 1e-6 and res["bpb_se"] < 1e-6
    scores = score_pairs(model, PAIRS, list(range(len(PAIRS))), 64, BoundaryMode())
    for s, (_, cont) in zip(scores, PAIRS):
        assert s.n_bytes == len(cont)
        assert abs(s.nll / (math.log(2) * s.n_bytes) - 8.0) < 1e-6


def test_heldout_bpb_counts_bytes_not_eos_and_matches_a_direct_sum():
    """Reference: one forward per sequence with the same noise; BPB = sum NLL over byte targets / ln2 / bytes."""
    model = build_model("learned")
    seqs = heldout_seqs()
    bm = BoundaryMode(seed=7)
    res = heldout_bpb(model, seqs, bm, batch_size=3, max_bytes=64 * 5)
    tot = n = 0.0
    with evaluating(model, bm):
        for i in range(5):
            row = torch.from_numpy(seqs.batch([i]))
            ids, tg = row[:, :-1], row[:, 1:]
            u = torch.from_numpy(text_noise(bm, i, 0, 64))[None]
            nll, *_ = forward_nll(model, ids, tg, u, None)
            tot += float(nll[tg < 256].sum())
            n += float((tg < 256).sum())
    assert n < 5 * 64  # the packed stream has EOS separators, which are not counted
    assert res["bytes"] == n and res["bpb"] == pytest.approx(tot / math.log(2) / n, rel=1e-6)


@pytest.mark.parametrize("strategy, mode", [(s, "sample") for s in STRATEGIES + ["bpe", "dynamic", "hnet"]]
                         + [("learned", "greedy"), ("hnet", "greedy")])
def test_batched_and_unbatched_scores_agree(strategy, mode, tmp_path):
    from learntok.boundaries import available

    if strategy not in available():
        pytest.skip(f"the {strategy} strategy is not in this installation")
    model = build_model(strategy, run_dir=tmp_path, **({"bpe_vocab_size": 400} if strategy == "bpe" else {}))
    keys = list(range(len(PAIRS)))
    one = score_pairs(model, PAIRS, keys, 64, BoundaryMode(mode), batch_size=1)
    many = score_pairs(model, PAIRS, keys, 64, BoundaryMode(mode), batch_size=8)
    for a, b in zip(one, many):
        assert a.nll == pytest.approx(b.nll, rel=1e-5, abs=1e-5)
        assert (a.greedy, a.next_byte, a.n_bytes) == (b.greedy, b.next_byte, b.n_bytes)


@pytest.mark.parametrize("strategy", ["learned", "whitespace"])
def test_padding_never_changes_a_score(strategy):
    """A short row scored alone, then beside a long row (so it is right-padded by 60 positions), then with its
    padding filled by garbage bytes instead of PAD: identical scores."""
    model = build_model(strategy)
    short, long = (b"def f(", b"x):"), (b"y" * 40, b" z" * 10)
    alone = score_pairs(model, [short], [0], 64, BoundaryMode())[0]
    padded = score_pairs(model, [short, long], [0, 1], 64, BoundaryMode(), batch_size=2)[0]
    assert padded.nll == pytest.approx(alone.nll, rel=1e-5, abs=1e-5) and padded.next_byte == alone.next_byte
    # Direct check on the forward pass: garbage after a row's end does not move its per-position NLL.
    ids = torch.tensor([[256, *b"def f(x):", *[258] * 20]])
    tg = torch.tensor([[*b"def f(x):", *[IGNORE] * 21]])
    noisy = ids.clone()
    noisy[0, 10:] = torch.randint(0, 256, (20,))
    u = torch.rand(1, 30)
    with evaluating(model, BoundaryMode()):
        a, *_ = forward_nll(model, ids, tg, u, None)
        b, *_ = forward_nll(model, noisy, tg, u, None)
    assert torch.allclose(a, b, atol=1e-5) and float(a[0, 10:].abs().sum()) == 0.0


@pytest.mark.parametrize("strategy", ["learned", "dynamic"])
def test_greedy_mode_uses_p_above_half_and_restores_the_config(strategy):
    from learntok.boundaries import available

    if strategy not in available():
        pytest.skip(f"the {strategy} strategy is not in this installation")
    model = build_model(strategy)
    old = model.boundary.cfg
    ids = torch.from_numpy(heldout_seqs().batch([0, 1]))[:, :-1]
    with evaluating(model, BoundaryMode("greedy")):
        out = model(ids)
        assert model.boundary.cfg.eval_boundaries == "greedy" and not model.training
    assert torch.equal(out.boundaries.mask[:, 1:], out.boundaries.probs[:, 1:] > 0.5)
    assert model.boundary.cfg is old and model.training


def test_greedy_mode_is_refused_for_random_boundaries():
    from learntok.evaluation.bpb import check_mode

    with pytest.raises(ValueError, match="random boundaries"):
        check_mode(build_model("uniform-random"), BoundaryMode("greedy"))


def test_average_mode_is_the_log_mean_of_sample_probabilities():
    """Reference: per sequence, log (1/k) sum_i p(x | a_i) from k explicit draws; Jensen: <= mean of the logs."""
    model = build_model("learned")
    seqs, bm = heldout_seqs(), BoundaryMode("average", samples=3, seed=5)
    res = heldout_bpb(model, seqs, bm, batch_size=2, max_bytes=64 * 4)
    num = den = 0.0
    with evaluating(model, bm):
        for i in range(4):
            row = torch.from_numpy(seqs.batch([i]))
            tg = row[:, 1:]
            lls = []
            for k in range(3):
                u = torch.from_numpy(text_noise(bm, i, k, 64))[None]
                nll, *_ = forward_nll(model, row[:, :-1], tg, u, None)
                lls.append(-float(nll[tg < 256].sum()))
            num += -(torch.logsumexp(torch.tensor(lls, dtype=torch.float64), 0).item() - math.log(3))
            den += float((tg < 256).sum())
    assert res["bpb"] == pytest.approx(num / math.log(2) / den, rel=1e-6)
    assert res["bpb"] <= res["bpb_mean_over_samples"] + 1e-12
    # A prescribed strategy draws identical boundaries k times: the average equals one sample exactly.
    uni = build_model("uniform")
    avg = heldout_bpb(uni, seqs, bm, max_bytes=64 * 4)["bpb"]
    assert avg == pytest.approx(heldout_bpb(uni, seqs, BoundaryMode(), max_bytes=64 * 4)["bpb"], rel=1e-6)


def test_average_mode_for_continuations_is_self_normalised():
    """With k draws, log p(y | c) = logsumexp(ll(c, y)) - logsumexp(ll(c)); for a prescribed strategy this is the
    single-sample score."""
    uni = build_model("uniform")
    a = score_pairs(uni, PAIRS, list(range(5)), 64, BoundaryMode("average", samples=3))
    b = score_pairs(uni, PAIRS, list(range(5)), 64, BoundaryMode())
    assert [x.nll for x in a] == pytest.approx([x.nll for x in b], rel=1e-6)
    learned = build_model("learned")
    c = score_pairs(learned, PAIRS, list(range(5)), 64, BoundaryMode("average", samples=3))
    d = score_pairs(learned, PAIRS, list(range(5)), 64, BoundaryMode())
    assert all(np.isfinite(x.nll) for x in c) and [x.nll for x in c] != [x.nll for x in d]


def test_choices_of_one_context_share_its_boundaries():
    model = build_model("learned")
    ctx = b"for i in range(10):\n    total += i * i\n"
    bm = BoundaryMode()
    rows = []
    with evaluating(model, bm):
        for cont in (b" a", b" bcd"):
            full = ctx + cont
            ids = torch.tensor([[256, *full]])
            u = torch.from_numpy(np.concatenate([[1.0], text_noise(bm, 3, 0, len(full))]).astype(np.float32))[None]
            rows.append(model(ids, noise=u).boundaries.mask[0, : len(ctx) + 1])
    assert torch.equal(rows[0], rows[1])


def test_long_contexts_are_left_truncated():
    model = build_model("uniform")
    ctx, cont = bytes(range(97, 123)) * 10, b" end"
    s = score_pairs(model, [(ctx, cont)], [0], 64, BoundaryMode())[0]
    ref = score_pairs(model, [(ctx[-(63 - len(cont)):], cont)], [0], 64, BoundaryMode())[0]
    assert s.truncated and not ref.truncated and s.nll == pytest.approx(ref.nll, rel=1e-6)
    # A continuation longer than the window is still scored whole (with no context).
    big = score_pairs(model, [(ctx, ctx)], [0], 64, BoundaryMode())[0]
    assert big.n_bytes == len(ctx)


def test_teacher_forced_greedy_equals_byte_by_byte_decoding():
    model = patch_logits(build_model("learned"), successor_logits)
    out = greedy_decode(model, [b"abc", b"xy"], [0, 1], 4, 64, BoundaryMode())
    assert out == [b"defg", b"z{|}"]
    real = build_model("learned")
    ctxs = [c for c, _ in PAIRS]
    dec = greedy_decode(real, ctxs, list(range(5)), 3, 64, BoundaryMode())
    tf = score_pairs(real, [(c, d[:2]) for c, d in zip(ctxs, dec)], list(range(5)), 64, BoundaryMode())
    for d, s in zip(dec, tf):
        assert s.greedy and s.next_byte == d[2]
