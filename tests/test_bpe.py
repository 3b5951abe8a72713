"""BPE guidance: the paper's worked example byte for byte, exact byte spans over multi-byte UTF-8, the vocabulary
search, save / load through the run directory, the measured lookahead leak, and a tiny end-to-end run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")

from tokenizers import pre_tokenizers  # noqa: E402

from learntok.boundaries.bpe import (  # noqa: E402
    META_FILE,
    TOKENIZER_FILE,
    BPEBoundaries,
    BPEConfig,
    bpe_boundaries,
    bpe_tokenizer,
    byte_chars,
    heldout_rate,
    lookahead_leak_rate,
    prefix_last_token_lengths,
    token_lengths,
    train_tokenizer,
    truncate,
)

from .conftest import sample_docs, tiny_train_config  # noqa: E402

PAPER = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
MULTI = ("日本語のテキストです。東京都と大阪府。 emoji 😀😀 👍🏽 café naïve Ωμέγα\n"
         "    x = 'it''s'  don't 123456 ... 中文字符串\t\t end  ").encode()


def _tiny(merges: list[tuple[str, str]]):
    """A tokenizer from explicit merges over the 256-byte ByteLevel alphabet."""
    vocab = {c: i for i, c in enumerate(byte_chars())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return bpe_tokenizer(vocab, merges)


def _chain(word: str) -> list[tuple[str, str]]:
    """Merges that build `word` left to right."""
    return [(word[:i], word[i]) for i in range(1, len(word))]


def _strategy(**kw) -> BPEBoundaries:
    return BPEBoundaries(BPEConfig(**kw), dim=32)


def _trained():
    """A tokenizer trained on the sample documents plus some multi-byte text (merges inside CJK characters)."""
    return train_tokenizer([d.decode() for d in sample_docs()[:-2]] + [MULTI.decode()[:40]] * 4, 3000)


def test_paper_worked_example(tmp_path):
    """'hello_tokenization' = hello | _token | ization (the paper writes the space as '_', ByteLevel as 'Ġ')."""
    tok = _tiny(_chain("hello") + _chain("Ġtoken") + _chain("ization"))
    text = b"hello tokenization"
    assert tok.encode(text.decode()).tokens == ["hello", "Ġtoken", "ization"]
    assert bpe_boundaries(tok, text).astype(int).tolist() == PAPER
    raw = bpe_boundaries(tok, text, shift=False)  # last byte of each token: the leaking rule
    assert raw.astype(int).tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert np.array_equal(bpe_boundaries(tok, text)[1:], raw[:-1])  # shifted right by one byte
    tok.save(str(tmp_path / TOKENIZER_FILE))  # the strategy's annotate, loaded as an evaluation would
    s = _strategy()
    s.prepare([], [], tmp_path)
    assert s.annotate(text).astype(int).tolist() == PAPER
    # Negative control: without the "ization" merges the tail is single bytes, each flagged.
    other = _tiny(_chain("hello") + _chain("Ġtoken"))
    assert bpe_boundaries(other, text).astype(int).tolist() == PAPER[:12] + [1] * 6


def test_byte_table_is_the_bytelevel_alphabet():
    table = byte_chars()
    assert len(set(table)) == 256 and set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    s = "".join(chr(c) for c in range(1, 0x800)) + "日本😀"  # every byte value valid UTF-8 can hold but 13
    mapped = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(s)
    assert "".join(table[b] for b in s.encode()) == "".join(p for p, _ in mapped)


def test_spans_tile_exactly_on_multibyte_text():
    tok = _trained()
    inverse = {c: b for b, c in enumerate(byte_chars())}
    for text in [MULTI, "😀 👍🏽 🇨🇭".encode(), "東京都と大阪府".encode(), b"plain ascii", b""]:
        tokens = tok.encode(text.decode(), add_special_tokens=False).tokens
        lengths = token_lengths(tok, text)
        assert lengths.tolist() == [len(t) for t in tokens]
        ends = np.cumsum(lengths)
        pieces = [text[a:b] for a, b in zip(np.r_[0, ends[:-1]], ends)]
        assert pieces == [bytes(inverse[c] for c in t) for t in tokens]  # each span is exactly its token's bytes
        assert b"".join(pieces) == text
    # The case the byte lengths exist for: a token boundary inside a character. Character offsets cannot express
    # it (both pieces of the emoji get the same offsets); our flags land on continuation bytes.
    emoji = "🦜🐙 🧪".encode()  # not in the training text: split into single bytes
    enc = tok.encode(emoji.decode(), add_special_tokens=False)
    assert len(set(enc.offsets)) < len(enc.offsets)
    flags = bpe_boundaries(tok, emoji)
    assert (flags & ((np.frombuffer(emoji, np.uint8) & 0xC0) == 0x80)).any()
    # Invalid UTF-8 (synthetic data only): each invalid byte is a one-byte token; spans still tile.
    junk = b"ab\xff\xfe cd \xe6\x97"
    assert token_lengths(tok, junk).sum() == len(junk)
    assert bpe_boundaries(tok, junk)[[2, 3, 8, 9]].all()


def test_truncation_equals_fresh_training():
    """The vocabulary search truncates one large training: check that this is what training smaller gives."""
    texts = [d.decode() for d in sample_docs()[:-2]]
    big = train_tokenizer(texts, 1200)
    held = sample_docs()[-1].decode()
    for v in (300, 700):
        fresh = train_tokenizer(texts, v)
        cut = truncate(big, v)
        assert cut.get_vocab() == fresh.get_vocab()
        assert cut.encode(held).ids == fresh.encode(held).ids
    assert truncate(big, 300).encode(held).ids != big.encode(held).ids  # truncation does change the tokenizer


def test_vocab_search_on_sample_docs():
    docs = sample_docs()
    held = [d.decode() for d in docs[-2:]]
    found = {}
    for target in (0.4, 0.2):
        s = _strategy(target_rate=target)
        s.prepare(docs[:-2], docs[-2:], None)
        tried = {int(v): r for v, r in s.meta["search"].items()}
        print(f"target {target}: vocab {s.vocab_size}, held-out rate {s.rate:.4f}, tried {len(tried)} sizes, "
              f"{s.meta['seconds']} s")
        assert s.rate == pytest.approx(heldout_rate(s.tokenizer, held))  # measured on the held-out documents
        assert s.vocab_size in tried and all(abs(s.rate - target) <= abs(r - target) for r in tried.values())
        found[target] = s
    # 0.4 is reachable: the bisection brackets it with sizes 1 % apart and lands close.
    s = found[0.4]
    tried = {int(v): r for v, r in s.meta["search"].items()}
    above = min(v for v, r in tried.items() if r <= 0.4)
    below = max(v for v, r in tried.items() if r > 0.4)
    assert above - below <= max(1, below // 100) and abs(s.rate - 0.4) < 0.01
    # 0.2 is not reachable from 37 KB of training text (unseen words): the largest vocabulary is the closest.
    s = found[0.2]
    full = train_tokenizer([d.decode() for d in docs[:-2]], 1 << 18)
    assert s.vocab_size == full.get_vocab_size() and s.rate == pytest.approx(heldout_rate(full, held))
    assert 0.2 < s.rate < 0.35
    assert found[0.4].vocab_size < found[0.2].vocab_size
    # A fixed size skips the search.
    fixed = _strategy(bpe_vocab_size=500)
    fixed.prepare(docs[:-2], docs[-2:], None)
    assert fixed.vocab_size == 500 and fixed.rate > found[0.4].rate


def test_save_load_round_trip(tmp_path):
    docs = sample_docs()
    s = _strategy()
    s.prepare(docs[:-2], docs[-2:], tmp_path)
    meta = json.loads((tmp_path / META_FILE).read_text())
    assert (tmp_path / TOKENIZER_FILE).exists() and meta["vocab_size"] == s.vocab_size
    loaded = _strategy()
    loaded.prepare([], [], tmp_path)  # what checkpoint.load_run does: no documents
    assert (loaded.vocab_size, loaded.rate) == (s.vocab_size, s.rate)
    for doc in [*docs, MULTI, b"ab\xff\xfe"]:
        assert np.array_equal(loaded.annotate(doc), s.annotate(doc))
    with pytest.warns(UserWarning, match="target_rate"):
        _strategy(target_rate=0.3).prepare(docs[:-2], docs[-2:], tmp_path)  # reused, but said so
    with pytest.raises(FileNotFoundError, match="no training documents"):
        _strategy().prepare([], [], tmp_path / "empty")
    with pytest.raises(RuntimeError, match="prepare"):
        _strategy().annotate(b"abc")


def test_propose_uses_the_prescribed_flags_and_requires_them():
    s = _strategy()
    ids = torch.randint(0, 256, (2, 12))
    with pytest.raises(ValueError, match="prescribed boundary flags"):
        s.propose(None, ids, noise=None, generator=None)
    flags = torch.rand(2, 12, generator=torch.Generator().manual_seed(0)) < 0.3
    flags[:, 0] = True
    out = s.propose(None, ids, noise=None, generator=None, prescribed=flags)
    assert torch.equal(out.mask, flags) and torch.equal(out.probs, flags.float())
    with pytest.raises(ValueError, match="do not match"):
        s.propose(None, ids, noise=None, generator=None, prescribed=flags[:, :5])


def test_leak_of_conflicting_merges_is_detected_exactly():
    """Merge 'b c' ranked above 'a b' (baselines.md §2d): 'abc' = a|bc but 'abd' = ab|d, so the flag at the 'b' of
    'abc' is set only because 'c' follows."""
    tok = _tiny([("b", "c"), ("a", "b")])
    doc = b"abd abc"
    assert tok.encode(doc.decode()).tokens == ["ab", "d", "Ġ", "a", "bc"]
    assert bpe_boundaries(tok, doc).astype(int).tolist() == [0, 0, 1, 1, 1, 1, 0]
    assert prefix_last_token_lengths(tok, doc).tolist() == [1, 2, 1, 1, 1, 2, 2]  # prefix "abd ab" ends in "ab"
    r = lookahead_leak_rate(tok, [doc])
    assert r["shifted"] == pytest.approx(1 / 7) and r["shifted_missed"] == pytest.approx(1 / 7)
    assert r["unshifted"] == pytest.approx(2 / 7)  # t = 0 ("a" continues) and t = 5 ("ab" continues with "c")
    # Negative control: without the conflicting merge the shifted flags of this text are all prefix-decidable.
    assert lookahead_leak_rate(_tiny([("a", "b")]), [doc])["shifted"] == 0.0


def test_windowed_prefix_tokenisation_matches_whole_prefix():
    tok = _trained()
    doc = MULTI + sample_docs()[-1][:400]
    ref = prefix_last_token_lengths(tok, doc, context=None)  # every prefix tokenised whole: O(n^2)
    assert np.array_equal(prefix_last_token_lengths(tok, doc, context=2), ref)
    assert not np.array_equal(prefix_last_token_lengths(tok, doc, context=0), ref)  # the window matters


def test_leak_rates_on_sample_docs():
    docs = sample_docs()
    s = _strategy()
    s.prepare(docs[:-2], docs[-2:], None)
    r = s.lookahead_leak_rate(docs[-2:], max_bytes=3000)
    print(f"leak on sample docs (vocab {s.vocab_size}): {r}")
    assert r["bytes"] == 3000
    assert 0 < r["shifted"] < r["unshifted"] / 3 and r["unshifted"] > 0.5
    assert r["shifted"] == pytest.approx(r["shifted_extra"] + r["shifted_missed"])
    # From a prefix every byte ends the last token, so the unshifted rule is wrong exactly where no token ends.
    ends = np.concatenate([bpe_boundaries(s.tokenizer, d, shift=False) for d in docs[-2:]])[:3000]
    assert r["unshifted"] == pytest.approx(1 - ends.mean())


def test_tiny_training_run_with_bpe(tmp_path, text_corpus):
    from learntok.checkpoint import load_run
    from learntok.train import train

    run = tmp_path / "run"
    cfg = tiny_train_config(run, text_corpus, max_steps=3, boundary=BPEConfig())
    res = train(cfg, log=lambda *_: None)
    meta = json.loads((run / META_FILE).read_text())
    assert (run / TOKENIZER_FILE).exists() and meta["vocab_size"] > 256
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rates = [r["boundary/rate"] for r in rows if "boundary/rate" in r]
    assert len(rates) == 3 and all(abs(x - meta["rate"]) < 0.1 for x in rates)  # the pipeline's flags were used
    assert all(r["bpe/heldout_rate"] == pytest.approx(meta["rate"]) for r in rows if "boundary/rate" in r)
    assert np.isfinite(res.val_bpb)
    _, model = load_run(run)  # evaluation reloads the tokenizer from the run directory
    assert model.boundary.vocab_size == meta["vocab_size"]


def test_overwrite_trains_the_tokenizer_again(tmp_path, text_corpus):
    """--overwrite used to load the replaced run's tokenizer (the strategy was prepared before the run directory
    was cleared), so a new --bpe-vocab-size was ignored; an old eval.json survived too."""
    from learntok.train import train

    run = tmp_path / "run"
    train(tiny_train_config(run, text_corpus, max_steps=1, boundary=BPEConfig(bpe_vocab_size=300)), log=lambda *_: None)
    assert json.loads((run / META_FILE).read_text())["vocab_size"] == 300
    (run / "eval.json").write_text("{}")
    train(tiny_train_config(run, text_corpus, max_steps=1, boundary=BPEConfig(bpe_vocab_size=320), overwrite=True),
          log=lambda *_: None)
    assert json.loads((run / META_FILE).read_text())["vocab_size"] == 320
    assert not (run / "eval.json").exists()
