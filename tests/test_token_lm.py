"""The BPE-tokenized baseline (--arch token): its bits per byte are the tokens' NLL over the bytes they cover, it
cannot see later tokens, and it trains, evaluates and resumes like the U-Net."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from learntok.boundaries import boundary_config
from learntok.data import ByteSequences
from learntok.model import build_model
from learntok.vocab import BOS, EOS

from .conftest import prescribed_for, sample_docs, tiny_model, tiny_train_config


def _model(tmp_path, **model_kw):
    torch.manual_seed(0)
    m = build_model(tiny_model(arch="token", n_mid=2, **model_kw), boundary_config("bpe", bpe_vocab_size=300))
    docs = sample_docs()
    m.boundary.prepare(docs[:-2], docs[-2:], tmp_path)
    return m.train()


def _row(text: bytes) -> torch.Tensor:
    return torch.tensor([[BOS, *text]])


def test_bits_per_byte_are_the_tokens_nll_over_their_bytes(tmp_path):
    m = _model(tmp_path)
    docs = [b"def forward(self, x):\n    return x\n", b"import torch\nimport numpy as np\n"]
    seqs = ByteSequences(docs, 60, annotate=m.boundary.annotator)  # as the data pipeline cuts and flags them
    seq, flags = torch.from_numpy(seqs.batch([0])), torch.from_numpy(seqs.flag_batch([0]))
    assert (seq == EOS).any()
    ids, targets = seq[:, :-1], seq[:, 1:]
    out = m(ids, targets, prescribed=flags[:, :-1])
    tokens = int(out.n_tokens[0])
    assert 5 < tokens < 58  # BPE merges some bytes into tokens (a 300-token vocabulary: not many)
    tflags, t = flags[0, 1:].tolist(), targets[0].tolist()  # the flags of the target bytes: token starts
    ends = [e for e in range(len(t)) if e == len(t) - 1 or tflags[e + 1] or EOS in (t[e], t[e + 1])]
    assert out.nll[0].nonzero().flatten().tolist() == ends  # each token's NLL sits at its last byte
    assert torch.equal(out.boundaries.mask, flags[:, :-1].bool())  # reported as the U-Net's bpe arm reports them
    with torch.no_grad():  # a model whose every logit is equal pays log2(V) bits per token
        m.head.weight.zero_()
        flat = m(ids, targets, prescribed=flags[:, :-1])
    assert float(flat.nll.sum()) == pytest.approx(tokens * math.log(m.vocab), rel=1e-5)
    assert float(flat.terms["loss/token"]) == pytest.approx(math.log(m.vocab), rel=1e-5)


@pytest.mark.parametrize("ngrams", [False, True])
def test_no_token_sees_a_later_one(tmp_path, ngrams):
    """Also with hashed token n-gram embeddings (--ngram-sizes: the BPE transformer's control for byte n-grams)."""
    m = _model(tmp_path, **({"ngram_sizes": (2, 3), "ngram_table": 97} if ngrams else {}))
    if ngrams:
        with torch.no_grad():
            m.ngrams.emb.weight.normal_(0, 1.0)
        assert m.matrix_params() == _model(tmp_path).matrix_params()  # a lookup: no FLOPs
    a = _row(b"the quick brown fox jumps over the lazy dog and then some")
    b = a.clone()
    b[0, 30:] = torch.tensor(list(b"XYZXYZXYZXYZXYZXYZXYZXYZXYZXYZ"[: a.shape[1] - 30]))
    outs = [m(s[:, :-1], s[:, 1:], prescribed=prescribed_for(m, s[:, :-1])) for s in (a, b)]
    last = outs[0].nll[0].nonzero().flatten()  # each token's last byte
    early = last[last < 27]  # tokens ending well before the change (their bytes and all before are equal)
    assert len(early) > 3
    torch.testing.assert_close(outs[0].nll[0, early], outs[1].nll[0, early], rtol=0, atol=1e-6)
    assert not torch.allclose(outs[0].nll[0, 35:], outs[1].nll[0, 35:])


def test_token_arch_needs_bpe_with_a_fixed_vocabulary():
    with pytest.raises(ValueError, match="--boundaries bpe and a fixed --bpe-vocab-size"):
        build_model(tiny_model(arch="token"), boundary_config("bpe"))
    with pytest.raises(ValueError, match="--boundaries bpe"):
        build_model(tiny_model(arch="token"), boundary_config("uniform"))


def test_the_bpe_baseline_trains_resumes_and_evaluates(tmp_path, text_corpus):
    from learntok.cli import main
    from learntok.train import train

    cfg = tiny_train_config(tmp_path / "run", text_corpus, max_steps=4, ckpt_every=2,
                            model=tiny_model(arch="token", n_mid=2),
                            boundary=boundary_config("bpe", bpe_vocab_size=400))
    first = train(replace(cfg, max_steps=2), log=lambda *_: None)
    train(replace(cfg, resume=str(tmp_path / "run")), log=lambda *_: None)
    whole = train(replace(cfg, out=str(tmp_path / "whole")), log=lambda *_: None)
    rows = {r: [json.loads(x) for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
            for r in ("run", "whole")}
    assert [x.get("loss/auto") for x in rows["run"] if "loss/auto" in x] == \
        [x.get("loss/auto") for x in rows["whole"] if "loss/auto" in x]
    assert math.isfinite(first.val_bpb) and 0 < whole.val_rate < 1
    assert main(["eval", str(tmp_path / "run"), "--tasks", "none", "--no-progress", "--limit", "2"]) == 0
    assert main(["generate", str(tmp_path / "run"), "--prompt", "x"]) == 2  # tokens, not bytes
    assert main(["show", str(tmp_path / "run"), "--text", "x y"]) == 2  # no boundaries to draw (was a traceback)
    # export writes a card that says what the model is (it crashed drawing a boundary map) and loads again
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "exp")]) == 0
    card = (tmp_path / "exp" / "README.md").read_text()
    assert "BPE-tokenized transformer (vocabulary 400)" in card and "learntok generate" not in card
    import learntok
    assert learntok.from_pretrained(tmp_path / "exp").predicts_tokens


def test_lambada_scores_the_bpe_baseline_by_bpb_only(tmp_path):
    """It predicts tokens, so there is no greedy continuation to check: LAMBADA's accuracies are n/a and its BPB
    stands (the task used to crash `learntok eval` at bytes([-1]))."""
    from learntok.evaluation.bpb import BoundaryMode
    from learntok.evaluation.tasks import Example, score_task

    m = _model(tmp_path).eval()
    res = score_task(m, "lambada", [Example(b"import torch and", (b" numpy",), 0, "x")] * 2, 64, BoundaryMode())
    assert res["acc"] is None and res["greedy_prefix"] is None and math.isfinite(res["bpb"])
