"""The tokenizer-shaped interface (learntok.tokenizer): encode/decode round trips on any Unicode and on bytes that
are not UTF-8, character offsets on multi-byte text, batches with padding, truncation and tensors that equal
texts one by one, save/load, and the `tokenizers` pre-tokenizer with the real library."""

from __future__ import annotations

import numpy as np
import pytest

from learntok.tokenizer import LearnedTokenizer

from .conftest import build_model

TEXTS = ["Tokenizers, learned end to end.", "日本語のテキストを分割する", "emoji 😀👍🏽 family 👨‍👩‍👧 ok",
         "combining: e\u0301 a\u0308 n\u0303 (decomposed)", "mixed: naïve café — 東京 🙂\n\tdone", "a", ""]


@pytest.fixture(scope="module")
def tok():
    return LearnedTokenizer(build_model("learned"), window=16)  # small window: texts span several windows


def test_round_trip_and_offsets_on_multibyte_text(tok):
    for text in TEXTS:
        enc = tok.encode(text)
        data = text.encode()
        assert enc.ids == list(data) and tok.decode(enc) == text == tok.decode(enc.ids)
        assert b"".join(enc.token_bytes) == data and sum(enc.token_lengths) == len(data)
        assert all(a[1] == b[0] for a, b in zip(enc.byte_offsets, enc.byte_offsets[1:]))
        assert len(enc) == len(enc.offsets) == len(enc.tokens)
        for (bs, be), (cs, ce), piece in zip(enc.byte_offsets, enc.offsets, enc.token_bytes):
            covered = text[cs:ce].encode()
            assert piece in covered  # the characters a token touches hold its bytes
            if (bs == 0 or (data[bs] & 0xC0) != 0x80) and (be == len(data) or (data[be] & 0xC0) != 0x80):
                assert covered == piece  # on character boundaries the offsets are exact


def test_bytes_that_are_not_utf8_round_trip(tok):
    data = b"\xff\xfe valid \x80 then \xc3 cut"
    enc = tok.encode(data)
    assert enc.ids == list(data) and b"".join(enc.token_bytes) == data
    assert enc.offsets == enc.byte_offsets  # bytes input: offsets in bytes
    assert tok.decode(enc, errors="surrogateescape").encode(errors="surrogateescape") == data


def test_batch_call_pads_truncates_and_equals_one_by_one(tok):
    texts = TEXTS[:4]
    one = [tok.encode(t) for t in texts]
    batch = tok(texts, padding=True, return_tensors="pt", return_offsets_mapping=True)
    n = max(len(t.encode()) for t in texts)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["boundary_mask"].shape == (4, n)
    for r, enc in enumerate(one):
        k = len(enc.ids)
        assert batch["input_ids"][r, :k].tolist() == enc.ids and (batch["input_ids"][r, k:] == 258).all()
        assert batch["attention_mask"][r].sum() == k
        assert batch["boundary_mask"][r, :k].tolist() == [int(f) for f in enc.boundaries]
        assert batch["token_mask"][r].sum() == len(enc)
        assert [tuple(o) for o in batch["token_offsets"][r, :len(enc)].tolist()] == enc.offsets
    single = tok(texts[0], add_special_tokens=True)
    assert single["input_ids"] == [256, *one[0].ids] and single["boundary_mask"][0] == 1
    cut = tok(texts, truncation=True, max_length=10, padding="max_length", return_tensors="np")
    assert isinstance(cut["input_ids"], np.ndarray) and cut["input_ids"].shape == (4, 10)
    assert bytes(b for b in cut["input_ids"][1] if b < 256).decode() == "日本語"  # a cut character is dropped
    with pytest.raises(ValueError, match="max_length"):
        tok(texts, truncation=True)
    with_bos = tok(texts, truncation=True, max_length=3, add_special_tokens=True)
    assert [len(r) for r in with_bos["input_ids"]] == [3, 1, 3, 3]  # BOS + 2 bytes; 日 needs 3: dropped
    assert tok(texts, truncation=True, max_length=1, add_special_tokens=True)["input_ids"] == [[256]] * 4
    with pytest.raises(ValueError, match="max_length must be at least 1"):
        tok(texts, truncation=True, max_length=0, add_special_tokens=True)


def test_bos_is_a_token_of_its_own(tok):
    """With add_special_tokens every per-token field has BOS's entry, so the per-byte and per-token views agree."""
    texts = TEXTS[:3]
    for pad in (False, True):
        b = tok(texts, add_special_tokens=True, padding=pad, return_offsets_mapping=True)
        plain = tok(texts, padding=pad, return_offsets_mapping=True)
        for r in range(len(texts)):
            assert sum(b["token_mask"][r]) == sum(b["boundary_mask"][r]) == sum(plain["token_mask"][r]) + 1
            assert sum(b["token_lengths"][r]) == sum(b["attention_mask"][r])
            assert b["token_lengths"][r][0] == 1 and tuple(b["token_offsets"][r][0]) == (0, 0)
            assert b["token_offsets"][r][1:sum(plain["token_mask"][r]) + 1] == \
                plain["token_offsets"][r][:sum(plain["token_mask"][r])]


def test_save_and_load_keep_the_settings(tmp_path):
    model = build_model("learned")
    greedy = LearnedTokenizer(model, greedy=True, seed=7)
    path = greedy.save_pretrained(tmp_path / "tok")
    again = LearnedTokenizer.from_pretrained(path)
    assert (again.greedy, again.seed, again.window) == (True, 7, greedy.window)
    text = "save and load keep the same segmentation"
    assert again.encode(text).byte_offsets == greedy.encode(text).byte_offsets
    assert LearnedTokenizer.from_pretrained(path, greedy=False).greedy is False  # keyword arguments win


def test_a_window_is_a_setting_and_an_export_keeps_the_settings(tmp_path):
    """A tokenizer's window used to be written as the model's seq_len (max_position_embeddings: lm-eval would cut
    the context to it), and `learntok export` / `push` of a saved tokenizer dropped its settings file."""
    import json

    from learntok.cli import main

    model = build_model("learned")
    model.seq_len = 128
    path = LearnedTokenizer(model, greedy=True, seed=7, window=16).save_pretrained(tmp_path / "tok")
    assert json.loads((path / "config.json").read_text())["seq_len"] == 128
    assert main(["export", str(path), str(tmp_path / "exp")]) == 0
    again = LearnedTokenizer.from_pretrained(tmp_path / "exp")
    assert (again.greedy, again.seed, again.window, again.model.seq_len) == (True, 7, 16, 128)


def test_segment_command_keeps_the_saved_settings_unless_asked(tmp_path, capsys):
    """`learntok segment DIR` draws as the tokenizer saved there does (its seed); --seed overrides it. It used to
    pass its own defaults over the saved settings."""
    from learntok.cli import main

    model = build_model("learned")
    text = TEXTS[0] * 4
    path = LearnedTokenizer(model, seed=7, window=16).save_pretrained(tmp_path / "tok")
    spans = {}
    for seed in (None, 7, 8):
        assert main(["segment", str(path), "--text", text] + ([] if seed is None else ["--seed", str(seed)])) == 0
        spans[seed] = capsys.readouterr().out
    assert spans[None] == spans[7] != spans[8]
    assert spans[7].strip() == "|".join(LearnedTokenizer(model, seed=7, window=16).encode(text).tokens)


def test_sampled_segmentations_follow_the_seed(tok):
    text = TEXTS[0] * 3
    other = LearnedTokenizer(tok.model, window=16, seed=tok.seed + 1)
    assert tok.encode(text).byte_offsets == tok.encode(text).byte_offsets  # deterministic
    assert other.encode(text).byte_offsets != tok.encode(text).byte_offsets  # negative control


def test_tokenizers_pre_tokenizer_splits_at_learned_boundaries(tok):
    pytest.importorskip("tokenizers")
    pre = tok.pre_tokenizer()
    for text in TEXTS[:5]:
        pieces = pre.pre_tokenize_str(text)
        assert "".join(p for p, _ in pieces) == text
        assert all(text[a:b] == p for p, (a, b) in pieces)
        data = text.encode()
        char_starts = {tok_s for tok_s, _ in tok.encode(text).byte_offsets if (data[tok_s] & 0xC0) != 0x80}
        expect = sorted({len(data[:s].decode()) for s in char_starts})
        assert [a for _, (a, _) in pieces] == expect
    # inside a whole `tokenizers` pipeline: a word-level vocabulary over the learned pieces
    from tokenizers import Tokenizer, models

    text = TEXTS[0]
    pieces = [p for p, _ in pre.pre_tokenize_str(text)]
    full = Tokenizer(models.WordLevel({"[UNK]": 0, **{p: i + 1 for i, p in enumerate(dict.fromkeys(pieces))}},
                                      unk_token="[UNK]"))
    full.pre_tokenizer = pre
    out = full.encode(text)
    assert out.tokens == pieces and 0 not in out.ids
    assert [text[a:b] for a, b in out.offsets] == pieces


def test_token_models_are_refused():
    model = build_model("learned")
    model.predicts_tokens = True
    with pytest.raises(ValueError, match="byte-level"):
        LearnedTokenizer(model)


@pytest.mark.parametrize("block", [1, 7, 100, 10_000])
def test_streamed_spans_equal_the_whole_text(tok, block):
    text = ("A long text read from a file in blocks of any size: 日本語 😀. " * 12).encode()
    whole = tok.encode(text).byte_offsets
    blocks = (text[i:i + block] for i in range(0, len(text), block))
    spans = list(tok.stream_spans(blocks))
    assert [(s, e) for s, e, _ in spans] == whole
    assert all(text[s:e] == piece for s, e, piece in spans)


def test_bf16_precision_segments_almost_alike(tok):
    text = TEXTS[0] * 4
    fast = LearnedTokenizer(tok.model, window=16, precision="bf16")
    a, b = tok.encode(text).boundaries, fast.encode(text).boundaries
    assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) <= 0.05 * len(a)
    from learntok.draw import draw_texts

    p32 = draw_texts(tok.model, [text.encode()], 15)[0][0]
    p16 = draw_texts(tok.model, [text.encode()], 15, precision="bf16")[0][0]
    assert not p32.equal(p16) and (p32 - p16).abs().max() < 0.05  # bfloat16 did run, and stays close
    with pytest.raises(ValueError, match="precision"):
        LearnedTokenizer(tok.model, precision="fp8")
