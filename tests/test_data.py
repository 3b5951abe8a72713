"""Tests of learntok.data: reading, splitting, packing and the resumable batch order."""

from __future__ import annotations

import gzip
import json
import lzma
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from learntok.config import DataConfig
from learntok.data import (
    BatchIterator,
    ByteSequences,
    DataError,
    describe,
    is_stdlib_val,
    iter_documents,
    load_splits,
    stdlib_files,
    val_batches,
)
from learntok.vocab import BOS, EOS

DOCS = ["hello world\n", "second document ü\n", "third 🐍"]
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _compress(data: bytes, comp: str) -> bytes:
    if comp == ".gz":
        return gzip.compress(data)
    if comp == ".xz":
        return lzma.compress(data)
    if comp == ".zst":
        zstandard = pytest.importorskip("zstandard", reason="zstandard not installed")
        return zstandard.ZstdCompressor().compress(data)
    return data


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _texts(spec: str, field: str = "text") -> list[str]:
    return [t.decode() for _, t in iter_documents(spec, field)]


@pytest.mark.parametrize("comp", ["", ".gz", ".xz", ".zst"])
def test_formats_read_back_same_documents(tmp_path: Path, comp: str) -> None:
    for i, d in enumerate(DOCS):
        (tmp_path / f"d{i}.txt{comp}").write_bytes(_compress(d.encode(), comp))
    assert _texts(str(tmp_path)) == DOCS

    jl = tmp_path / f"rows.jsonl{comp}"
    jl.write_bytes(_compress(_jsonl([{"text": d, "id": i} for i, d in enumerate(DOCS)] + [{"text": ""}]), comp))
    docs = list(iter_documents(str(jl)))
    assert [t.decode() for _, t in docs] == DOCS
    assert [k for k, _ in docs] == [f"{jl.name}:{i}" for i in (1, 2, 3)]  # keys relative to the spec's directory


@pytest.mark.parametrize("comp", ["", ".gz"])
def test_parquet(tmp_path: Path, comp: str) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (pip install pyarrow)")
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (pip install pyarrow)")
    plain = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": DOCS + [None, ""]}), plain)
    path = tmp_path / f"x.parquet{comp}"
    path.write_bytes(_compress(plain.read_bytes(), comp))
    plain.unlink()
    docs = list(iter_documents(str(path), "body"))
    assert [t.decode() for _, t in docs] == DOCS and docs[1][0] == f"{path.name}:1"
    with pytest.raises(DataError, match="no column 'text'"):
        list(iter_documents(str(path)))


def test_a_parquet_file_damaged_past_its_footer_is_named(tmp_path: Path) -> None:
    """The footer reads, a row group's data does not: the error names the file (it was pyarrow's bare message)."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (pip install pyarrow)")
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (pip install pyarrow)")
    rng = np.random.default_rng(0)
    docs = ["".join(rng.choice(list("abcdefghij klmnop"), 300)) for _ in range(40)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=10, compression="snappy")
    at = pq.ParquetFile(path).metadata.row_group(2).column(0).data_page_offset + 40
    data = bytearray(path.read_bytes())
    data[at:at + 400] = bytes(400)
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"d\.parquet: damaged"):
        list(iter_documents(str(path)))


def test_directory_glob_and_text_field(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("bee")
    (tmp_path / "a.py").write_text("print(1)")
    (tmp_path / "c.jsonl").write_bytes(_jsonl([{"content": "x1"}, {"content": "x2"}]))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "notes.csv").write_text("ignored")
    (tmp_path / ".hidden.txt").write_text("ignored")
    assert _texts(str(tmp_path), "content") == ["print(1)", "x1", "x2", "bee"]
    assert _texts(str(tmp_path / "*.py")) == ["print(1)"]
    assert _texts(str(tmp_path / "**" / "*.md")) == ["bee"]
    with pytest.raises(DataError, match="no field 'text'"):
        list(iter_documents(str(tmp_path)))


def test_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n\n{"text": oops}\n')
    with pytest.raises(DataError, match=rf"{bad}:3: line is not valid JSON"):
        list(iter_documents(str(bad)))
    with pytest.raises(DataError, match="no such file"):
        list(iter_documents(str(tmp_path / "missing.txt")))
    with pytest.raises(DataError, match="glob matches nothing"):
        list(iter_documents(str(tmp_path / "*.nothing")))
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError, match="no supported files"):
        list(iter_documents(str(tmp_path / "d")))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(DataError, match="unsupported file type"):
        list(iter_documents(str(tmp_path / "x.csv")))
    (tmp_path / "d" / "blob.txt").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "d" / "nul.txt").write_bytes(b"a\x00b\x00" * 100)
    with pytest.raises(DataError, match="binary"):
        list(iter_documents(str(tmp_path / "d")))
    (tmp_path / "d" / "e.txt").write_text("")
    with pytest.raises(DataError, match="binary"):
        list(iter_documents(str(tmp_path / "d")))
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "e.txt").write_text("")
    with pytest.raises(DataError, match="no documents"):
        list(iter_documents(str(tmp_path / "e")))
    (tmp_path / "d" / "good.txt").write_text("text")
    with pytest.warns(UserWarning, match="skipped 2 binary"):
        assert _texts(str(tmp_path / "d")) == ["text"]
    with pytest.raises(DataError, match="seq_len must be at least 2"):
        ByteSequences([b"abc"], seq_len=1)
    with pytest.raises(DataError, match="not enough data"):
        ByteSequences([b"abc"], seq_len=8)


def test_stdlib_corpus_split() -> None:
    files = stdlib_files()
    assert len(files) > 100
    assert all(not {"test", "tests", "site-packages", "__pycache__"} & set(k.split("/")) for k, _ in files)
    keys = [k for k, _ in iter_documents("stdlib")]
    assert len(keys) == len(set(keys)) and keys == sorted(keys)
    val_keys = {k for k in keys if is_stdlib_val(k)}
    assert 0.02 < len(val_keys) / len(keys) < 0.09
    train, val = load_splits(DataConfig())
    assert (train, val) == load_splits(DataConfig())
    assert len(val) == len(val_keys) and len(train) == len(keys) - len(val_keys)


def test_hash_holdout_and_fallback(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_bytes(_jsonl([{"text": f"document number {i}"} for i in range(400)]))
    train, val = load_splits(DataConfig(source=str(path), val_fraction=0.1))
    assert len(train) + len(val) == 400 and 15 < len(val) < 70 and not set(train) & set(val)
    assert (train, val) == load_splits(DataConfig(source=str(path), val_fraction=0.1))
    one = tmp_path / "one.txt"
    one.write_text("single")
    with pytest.raises(DataError, match="too few to hold out"):
        load_splits(DataConfig(source=str(one), val_fraction=0.0))
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.txt").write_text("first")
    (two / "b.txt").write_text("second")
    assert load_splits(DataConfig(source=str(two), val_fraction=0.0)) == ([b"first"], [b"second"])
    assert load_splits(DataConfig(source=str(two / "a.txt"), val_data=str(two / "b.txt"))) == ([b"first"], [b"second"])


def test_train_valid_directory(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl.xz").write_bytes(lzma.compress(_jsonl([{"text": "tr1"}, {"text": "tr2"}])))
    (tmp_path / "valid.jsonl.xz").write_bytes(lzma.compress(_jsonl([{"text": "va1"}])))
    (tmp_path / "test.jsonl.xz").write_bytes(lzma.compress(_jsonl([{"text": "te1"}])))
    train, val = load_splits(DataConfig(source=str(tmp_path)))
    assert (train, val) == ([b"tr1", b"tr2"], [b"va1"])
    assert "train 2 docs / 6 B, val 1 docs / 3 B" in describe(train, val)


def test_evaluation_reads_a_split_as_training_did(tmp_path: Path) -> None:
    """An empty file among the valid* entries is skipped by training; `load_split` (eval, diagnose) must skip it
    too, not fail on it."""
    from learntok.data.splits import load_split

    (tmp_path / "train.txt").write_text("training text")
    (tmp_path / "valid.txt").write_text("validation text")
    (tmp_path / "valid_extra.txt").write_text("")
    cfg = DataConfig(source=str(tmp_path))
    assert load_splits(cfg)[1] == [b"validation text"]
    assert load_split(cfg, "val")[1] == [b"validation text"]


def test_packing() -> None:
    docs = [b"abcde", b"fg", b"hijklmn"]
    seqs = ByteSequences(docs, seq_len=4, pack=True)
    stream = [*b"abcde", EOS, *b"fg", EOS, *b"hijklmn", EOS]
    assert len(seqs) == len(stream) // 4 == 4
    for i in range(len(seqs)):
        s = seqs[i]
        assert s.dtype == np.int64 and s.shape == (5,)
        assert s[0] == BOS and list(s[1:]) == stream[4 * i:4 * i + 4]
    unpacked = ByteSequences(docs, seq_len=4, pack=False)
    assert len(unpacked) == 2
    assert [list(unpacked[i]) for i in range(2)] == [[BOS, *b"abcd"], [BOS, *b"hijk"]]
    # stored once, one byte per corpus byte; windows are cut when asked for
    assert seqs.corpus.n_bytes == 14 and seqs.corpus.read(0, 14).dtype == np.uint8


def _seqs(n: int = 37) -> ByteSequences:
    return ByteSequences([bytes([i % 256]) * 3 for i in range(n)], seq_len=3, pack=False)


def test_batch_iterator_determinism_and_resume() -> None:
    seqs = _seqs()
    a, b = BatchIterator(seqs, 4, seed=7), BatchIterator(seqs, 4, seed=7)
    for _ in range(20):  # crosses several epochs (9 batches per epoch)
        x, y = a.next_batch(), b.next_batch()
        assert x.dtype == torch.long and x.shape == (4, 4) and torch.equal(x, y)
    assert not torch.equal(BatchIterator(seqs, 4, seed=8).next_batch(), BatchIterator(seqs, 4, seed=7).next_batch())
    state = json.loads(json.dumps(a.state_dict()))
    expected = [a.next_batch() for _ in range(5)]
    c = BatchIterator(seqs, 4, seed=0)
    c.load_state_dict(state)
    assert all(torch.equal(e, c.next_batch()) for e in expected)
    # one epoch visits distinct sequences (first byte identifies the sequence)
    d = BatchIterator(seqs, 4, seed=1)
    seen = torch.cat([d.next_batch()[:, 1] for _ in range(9)]).tolist()
    assert len(set(seen)) == 36


def test_batch_iterator_ranks_match_single_process() -> None:
    seqs = _seqs()
    single = BatchIterator(seqs, 6, seed=3)
    ranks = [BatchIterator(seqs, 3, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(15):
        assert torch.equal(single.next_batch(), torch.cat([it.next_batch() for it in ranks]))


def test_batch_iterator_small_dataset_and_val_batches() -> None:
    seqs = _seqs(3)
    it = BatchIterator(seqs, 8, seed=0)
    for _ in range(3):
        assert it.next_batch().shape == (8, 4)
    vb = val_batches(_seqs(), batch_size=4, max_bytes=30)
    assert [b.shape[0] for b in vb] == [4, 4, 2]
    assert torch.cat(vb)[:, 1].tolist() == list(range(10))
    assert len(val_batches(seqs, 4, max_bytes=0)) == 1


def test_hf_local_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="datasets not installed (pip install datasets)")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS + [""]}),
                          "validation": datasets.Dataset.from_dict({"text": ["v"]})}).save_to_disk(tmp_path / "ds")
    assert _texts(f"hf:{tmp_path / 'ds'}") == DOCS
    assert [k for k, _ in iter_documents(f"hf:{tmp_path / 'ds'}:validation")] == [f"hf:{tmp_path / 'ds'}:0"]
    with pytest.raises(DataError, match="no split 'nosuchsplit' .it has train, validation"):
        list(iter_documents(f"hf:{tmp_path / 'ds'}:nosuchsplit"))
    # a saved Dataset without splits: a named split other than its own is an error, not its rows read as that split
    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(tmp_path / "one")
    assert _texts(f"hf:{tmp_path / 'one'}") == _texts(f"hf:{tmp_path / 'one'}:train") == DOCS
    with pytest.raises(DataError, match="has no splits .*without :validation"):
        list(iter_documents(f"hf:{tmp_path / 'one'}:validation"))
    # the DatasetDict's own validation split is the run's (it used to be ignored for a hash hold-out of train)
    from learntok.data.sources import split_documents

    got = list(split_documents(DataConfig(source=f"hf:{tmp_path / 'ds'}")))
    assert [t for s, t in got if s == "val"] == [b"v"] and [t.decode() for s, t in got if s == "train"] == DOCS
    named = list(split_documents(DataConfig(source=f"hf:{tmp_path / 'ds'}:train")))  # a named split: as before
    assert b"v" not in [t for _, t in named]


def test_shared_enwiki_valid() -> None:
    path = SHARED_DATA / "text" / "enwiki" / "valid.jsonl.xz"
    if not path.exists():
        pytest.skip(f"../shared/data not present: {path} is missing")
    assert sum(1 for _ in iter_documents(str(path))) == 435


@pytest.mark.parametrize("comp", [".gz", ".xz", ".zst"])
def test_corrupt_compressed_file(tmp_path: Path, comp: str) -> None:
    for name in ("a.txt", "b.jsonl"):
        path = tmp_path / (name + comp)
        path.write_bytes(_compress(_jsonl([{"text": "x" * 1000}]), comp)[:-8] + b"garbage!")
        with pytest.raises(DataError, match="cannot read or decompress"):
            list(iter_documents(str(path)))


def test_a_latin1_corpus_trains_with_its_encoding_or_as_bytes(tmp_path: Path) -> None:
    """A Latin-1 text file used to be refused for training as binary (while show and segment read it); --encoding
    names its codec (decoded, trained on as UTF-8) or 'bytes' (its bytes as they are)."""
    from learntok.data.sources import split_documents

    for split in ("train", "valid"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "a.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 20)
    with pytest.raises(DataError, match="--encoding bytes"):
        list(split_documents(DataConfig(source=str(tmp_path))))
    utf8 = dict(split_documents(DataConfig(source=str(tmp_path), encoding="latin-1")))
    assert utf8["train"].decode("utf-8").startswith("café crème brûlée")
    raw = dict(split_documents(DataConfig(source=str(tmp_path), encoding="bytes")))
    assert raw["val"] == (tmp_path / "valid" / "a.txt").read_bytes()
    with pytest.raises(DataError, match="unknown encoding"):
        list(split_documents(DataConfig(source=str(tmp_path), encoding="klingon")))
    (tmp_path / "train" / "a.txt").write_bytes(b"\xff\xfe\x00" * 5)
    with pytest.raises(DataError, match="not valid ascii"):
        list(split_documents(DataConfig(source=str(tmp_path), encoding="ascii")))


def test_head_documents_keeps_order_and_cuts_the_last():
    from learntok.data import head_documents

    assert head_documents([b"abc", b"defg", b"hi"], 5) == [b"abc", b"de"]
    assert head_documents([b"abc"], 10) == [b"abc"] and head_documents([b"abc"], 0) == []
    assert head_documents(iter([b"ab", b"cd"]), 2) == [b"ab"]  # stops reading once full


def test_the_hash_holdout_does_not_depend_on_how_the_path_is_spelled(tmp_path: Path, monkeypatch) -> None:
    """Keys are relative to the spec's directory: a relative, an absolute and a glob spelling of one corpus hold
    out the same documents (the path as given was hashed once, so two machines split one corpus differently)."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "docs.jsonl").write_bytes(_jsonl([{"text": f"document number {i}"} for i in range(400)]))
    monkeypatch.chdir(tmp_path)
    spellings = ["c/docs.jsonl", str(tmp_path / "c" / "docs.jsonl"), "c", str(tmp_path / "c"), "c/*.jsonl"]
    splits = [load_splits(DataConfig(source=s, val_fraction=0.1)) for s in spellings]
    assert all(s == splits[0] for s in splits) and 15 < len(splits[0][1]) < 70


def test_directories_follow_symlinks_and_skip_empty_split_files(tmp_path: Path) -> None:
    """A symlinked subdirectory is read like a real one (a glob did, a directory did not), a link loop ends, a
    non-UTF-8 file name hashes, and one empty train* file among others is skipped rather than an error."""
    real = tmp_path / "elsewhere"
    real.mkdir()
    (real / "b.txt").write_text("linked document")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("top document")
    (corpus / "linked").symlink_to(real, target_is_directory=True)
    (real / "loop").symlink_to(corpus, target_is_directory=True)
    (corpus / os.fsdecode(b"caf\xe9.txt")).write_text("a name that is not UTF-8")
    docs = sorted(t for _, t in iter_documents(str(corpus)))
    assert docs == [b"a name that is not UTF-8", b"linked document", b"top document"]
    load_splits(DataConfig(source=str(corpus), val_fraction=0.5))  # hashes every key, the undecodable one too
    split = tmp_path / "split"
    split.mkdir()
    (split / "train-00.txt").write_text("training text")
    (split / "train-01.txt").write_text("")
    (split / "valid.txt").write_text("validation text")
    assert load_splits(DataConfig(source=str(split))) == ([b"training text"], [b"validation text"])
