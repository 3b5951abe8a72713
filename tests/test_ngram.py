"""Hashed byte n-gram embeddings (--ngram-sizes): causal by construction, exact in cached generation, and a model
that starts as the one without them."""

from __future__ import annotations

import pytest
import torch

from learntok.config import ModelConfig
from learntok.nn.ngram import HashedNgrams, ngram_rows

from .conftest import build_model
from .test_generate import assert_cached_steps_equal_full_forward
from .test_model import _ids, assert_no_lookahead


def test_a_row_is_a_function_of_the_last_n_ids_only():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (3, 40), generator=g)
    rows = ngram_rows(ids, 4, 1000)
    later = ids.clone()
    later[:, 20:] = torch.randint(0, 256, (3, 20), generator=g)
    assert torch.equal(ngram_rows(later, 4, 1000)[:, :20], rows[:, :20])  # nothing reads ahead
    early = ids.clone()
    early[:, :10] = torch.randint(0, 256, (3, 10), generator=g)
    assert torch.equal(ngram_rows(early, 4, 1000)[:, 13:], rows[:, 13:])  # nor further back than n - 1
    assert not torch.equal(ngram_rows(early, 4, 1000)[:, 10:13], rows[:, 10:13])
    assert rows.min() >= 0 and rows.max() < 1000 and len(rows.unique()) > 50  # spread over the table


@pytest.mark.parametrize("sparse", [False, True])
def test_the_fused_lookup_sums_each_size_row_and_its_gradient(sparse):
    """HashedNgrams' one embedding_bag equals size-by-size lookups of ngram_rows, forward and backward."""
    torch.manual_seed(0)
    ngrams = HashedNgrams(6, (2, 3, 5), 50)
    ngrams.emb.sparse = sparse
    torch.nn.init.normal_(ngrams.emb.weight)
    ids = torch.randint(0, 256, (2, 30))
    w = ngrams.emb.weight.detach().clone().requires_grad_()
    want = sum(w[i * 50 + ngram_rows(ids, n, 50)] for i, n in enumerate((2, 3, 5)))
    got = ngrams(ids)
    assert torch.allclose(got, want, atol=1e-6)
    probe = torch.randn_like(want)
    (want * probe).sum().backward()
    (got * probe).sum().backward()
    grad = ngrams.emb.weight.grad
    assert grad.is_sparse == sparse
    assert torch.allclose(grad.to_dense(), w.grad, atol=1e-5)


def _ngram_model(tmp_path, strategy="learned", **kw):
    m = build_model(strategy, tmp_path, model_kw={"ngram_sizes": (2, 3, 5), "ngram_table": 97, **kw})
    with torch.no_grad():
        m.ngrams.emb.weight.normal_(0, 1.0)  # trained-like tables
    return m


@pytest.mark.parametrize("strategy", ["learned", "uniform", "flat"])
def test_no_lookahead_with_ngram_embeddings(strategy, tmp_path):
    assert_no_lookahead(_ngram_model(tmp_path, strategy), 19)


def test_cached_generation_reads_the_same_ngrams(tmp_path):
    assert_cached_steps_equal_full_forward(_ngram_model(tmp_path, byte_window=8).eval())


def test_a_model_with_ngram_tables_starts_as_the_model_without(tmp_path):
    plain = build_model("learned", tmp_path)
    with_ngrams = build_model("learned", tmp_path, model_kw={"ngram_sizes": (3, 4), "ngram_table": 64})
    shared = plain.state_dict()
    assert all(torch.equal(v, shared[k]) for k, v in with_ngrams.state_dict().items() if k in shared)
    ids = _ids(2, 32, 0)[:, :-1]
    noise = torch.rand(2, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(plain(ids, noise=noise).logits, with_ngrams(ids, noise=noise).logits)


def test_ngram_settings_are_checked_and_kept_as_a_tuple():
    with pytest.raises(ValueError, match="ngram_sizes must be >= 2"):
        ModelConfig(ngram_sizes=(1, 3))
    assert ModelConfig(ngram_sizes=[3, 4]).ngram_sizes == (3, 4)


def test_chunk_hashes_are_the_running_hash_of_each_open_chunk():
    """Vectorised prefix-sum hashes equal the streaming hash that cached generation keeps (restarted after every
    boundary); equal chunks hash equally wherever they stand; no hash reads a later byte."""
    from learntok.nn.ngram import ChunkEmbedding, chunk_hashes

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (3, 50), generator=g)
    ids[:, 0] = 256
    mask = torch.rand(3, 50, generator=g) < 0.25
    mask[:, 0] = True
    h = chunk_hashes(ids, mask)
    running, reset = torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool)
    for t in range(50):
        running = ChunkEmbedding.extend(running, ids[:, t], reset)
        assert torch.equal(h[:, t], running), t
        reset = mask[:, t]
    word = torch.tensor([[256, 5, 6, 7, 9, 5, 6, 7]])
    cut = torch.tensor([[True, False, False, True, True, False, False, True]])
    hw = chunk_hashes(word, cut)
    assert hw[0, 3] == hw[0, 7] and hw[0, 3] != hw[0, 4]  # "5 6 7" twice: one row
    later = ids.clone()
    later[:, 30:] = 0
    assert torch.equal(chunk_hashes(later, mask)[:, :30], h[:, :30])


def _chunk_model(tmp_path, strategy="learned", **kw):
    m = build_model(strategy, tmp_path, model_kw={"chunk_table": 101, **kw})
    with torch.no_grad():
        m.chunks.emb.weight.normal_(0, 1.0)
    return m


@pytest.mark.parametrize("strategy", ["learned", "uniform", "whitespace"])
def test_no_lookahead_with_the_chunk_embedding(strategy, tmp_path):
    assert_no_lookahead(_chunk_model(tmp_path, strategy), 23)


def test_cached_generation_keeps_the_running_chunk_hash(tmp_path):
    assert_cached_steps_equal_full_forward(_chunk_model(tmp_path, byte_window=8, ngram_sizes=(3,), ngram_table=31)
                                           .eval())


def test_the_chunk_embedding_changes_the_tokens_not_the_start(tmp_path):
    plain = build_model("learned", tmp_path)
    chunked = build_model("learned", tmp_path, model_kw={"chunk_table": 64})
    ids = _ids(2, 32, 0)[:, :-1]
    noise = torch.rand(2, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(plain(ids, noise=noise).logits, chunked(ids, noise=noise).logits)
    with torch.no_grad():
        chunked.chunks.emb.weight.normal_(0, 1.0)
    assert not torch.allclose(plain(ids, noise=noise).logits, chunked(ids, noise=noise).logits)


def test_sparse_table_gradients_are_clipped_with_the_rest():
    from learntok.train.schedule import clip_gradients

    torch.manual_seed(0)
    emb, lin = torch.nn.Embedding(50, 8, sparse=True), torch.nn.Linear(8, 1)
    (lin(emb(torch.tensor([1, 2, 2, 7]))) ** 2).sum().mul(10).backward()
    dense = [emb.weight.grad.to_dense().clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    total = torch.cat([g.flatten() for g in dense]).norm()
    norm = clip_gradients([*emb.parameters(), *lin.parameters()], 0.1)
    torch.testing.assert_close(norm, total)
    for g, p in zip(dense, [emb.weight, lin.weight, lin.bias]):
        got = p.grad.to_dense() if p.grad.is_sparse else p.grad
        torch.testing.assert_close(got, g * 0.1 / (total + 1e-6))


def test_training_gives_the_tables_sparse_gradients_and_resumes_exactly(tmp_path, text_corpus):
    """One eager process: the hashed tables take sparse gradients and SparseAdam (JointOptimizer); the run trains
    them (they leave zero), checkpoints both optimizers and resumes bit-exactly."""
    from dataclasses import replace

    from learntok.config import ModelConfig, OptimConfig
    from learntok.train.schedule import JointOptimizer, make_optimizer

    from .conftest import tiny_train_config
    from .test_distributed import _assert_same, _run, _weights, run_resumed

    m = build_model("learned", tmp_path, model_kw={"ngram_sizes": (3, 4), "ngram_table": 64, "chunk_table": 32})
    assert isinstance(make_optimizer(m, OptimConfig(), sparse=True), JointOptimizer)
    assert m.ngrams.emb.sparse and m.chunks.emb.sparse
    cfg = tiny_train_config(tmp_path / "x", text_corpus, max_steps=4,
                            model=ModelConfig(d_model=32, n_heads=2, n_down=1, n_mid=1, n_up=1, byte_window=8,
                                              ngram_sizes=(3, 4), ngram_table=64, chunk_table=32))
    _run(replace(cfg, out=str(tmp_path / "full")), world=1)
    part = run_resumed(replace(cfg, out=str(tmp_path / "part")), at=2)
    full, resumed = _weights(tmp_path / "full"), _weights(part)
    _assert_same(full, resumed, atol=1e-7)
    assert float(full["ngrams.emb.weight"].abs().sum()) > 0 and float(full["chunks.emb.weight"].abs().sum()) > 0
