"""Training on a Hugging Face dataset as a stream (--stream): the windows of the documents in stream order, a
share per process, and a resume that continues exactly."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from learntok.config import DataConfig
from learntok.data import ByteSequences, DataError
from learntok.data.sources import iter_documents
from learntok.data.stream import DocumentStream, StreamBatches, open_stream

from .conftest import tiny_train_config

datasets = pytest.importorskip("datasets", reason="--stream needs the datasets package (pip install 'learntok[hf]')")


def _rows(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(["byte", "token", "Grüße", "def f(x):", "\n"], size=rng.integers(0, 40)))
            for _ in range(n)]


@pytest.fixture
def spec(tmp_path) -> str:
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": _rows(120)})}).save_to_disk(tmp_path / "ds")
    return f"hf:{tmp_path / 'ds'}:train"


def test_offline_a_stream_falls_back_to_the_datasets_cache(monkeypatch):
    """`datasets` streams from the network only: offline, a dataset in its cache is read from there (online it
    is not, which would download the whole dataset); not cached either, a one-line error says so. prepare, which
    reads every row anyway, tries the cache online too."""
    rows, whole_loads = _rows(30), []

    def load_dataset(name, config=None, split=None, streaming=False):
        whole_loads.extend([] if streaming else [name])
        if streaming or name != "someone/cached":
            raise ConnectionError(f"Couldn't reach {name!r} on the Hub (LocalEntryNotFoundError)")
        return datasets.Dataset.from_dict({"text": rows})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    stream = DocumentStream("hf:someone/cached:train", "text", shuffle_buffer=1)
    assert sorted(stream.documents()) == sorted(r.encode() for r in rows)
    with pytest.raises(DataError, match=r"hf:someone/other:train: cannot stream .* \(offline, and not in the "
                                        r"datasets cache either\): Couldn't reach"):
        DocumentStream("hf:someone/other:train", "text")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False, raising=False)
    whole_loads.clear()
    with pytest.raises(DataError, match=r"hf:someone/cached:train: cannot stream Hugging Face dataset "
                                        r"'someone/cached' split 'train': Couldn't reach"):
        DocumentStream("hf:someone/cached:train", "text")
    assert whole_loads == []  # online, a stream never downloads the whole dataset
    assert [t for _, t in iter_documents("hf:someone/cached:train")] == [r.encode() for r in rows if r]
    with pytest.raises(DataError, match=r"hf:someone/other: cannot load Hugging Face dataset 'someone/other' split "
                                        r"'train' \(not streamed, and not in the datasets cache either\): Couldn't"):
        list(iter_documents("hf:someone/other"))


def test_a_saved_dataset_without_splits_streamed_with_a_split_named(tmp_path):
    datasets.Dataset.from_dict({"text": _rows(5)}).save_to_disk(tmp_path / "one")
    with pytest.raises(DataError, match=r"the saved dataset has no splits \(one table\); name it without "
                                        r":validation"):
        DocumentStream(f"hf:{tmp_path / 'one'}:validation", "text")


def _take(batches, n):
    return [batches.next_with_flags() for _ in range(n)]


@pytest.mark.parametrize("pack", [True, False])
def test_stream_windows_are_the_documents_windows_in_order(spec, pack):
    docs = [r.encode() for r in _rows(120) if r]  # empty rows are skipped, as a prepared corpus skips them
    assert len(docs) < 120
    seqs = ByteSequences(docs, 32, pack, annotate=lambda d: np.frombuffer(d, np.uint8) % 7 == 0)
    stream = DocumentStream(spec, "text", shuffle_buffer=0)
    batches = StreamBatches(stream, 32, 4, pack, annotate=lambda d: np.frombuffer(d, np.uint8) % 7 == 0)
    got = _take(batches, len(seqs) // 4)
    idx = np.arange(len(seqs) // 4 * 4)
    assert np.array_equal(np.concatenate([g[0].numpy() for g in got]), seqs.batch(idx))
    assert np.array_equal(np.concatenate([g[1].numpy() for g in got]), seqs.flag_batch(idx))


@pytest.mark.parametrize("shuffle", [0, 16])
def test_a_resumed_stream_continues_exactly(spec, shuffle):
    def fresh():
        return StreamBatches(DocumentStream(spec, "text", shuffle_buffer=shuffle, seed=3), 48, 3)

    whole = fresh()
    ref = [b[0] for b in _take(whole, 150)]  # more than one pass over the 120 rows
    assert whole.epoch >= 1
    part = fresh()
    _take(part, 61)
    resumed = fresh()
    resumed.load_state_dict(json.loads(json.dumps(part.state_dict())))
    assert all((a == b).all() for a, b in zip([b[0] for b in _take(resumed, 89)], ref[61:]))
    with pytest.raises(ValueError, match="not a stream's"):
        resumed.load_state_dict({"epoch": 0, "position": 0, "seed": 0})
    from learntok.data.sequences import BatchIterator

    in_memory = BatchIterator(ByteSequences([r.encode() for r in _rows(120)], 48), 3, seed=0)
    with pytest.raises(ValueError, match="is a stream's .*resume it with --stream"):  # a KeyError once
        in_memory.load_state_dict(part.state_dict())


def test_each_process_streams_its_own_share(spec):
    shares = [list(DocumentStream(spec, "text", rank=r, world_size=2, shuffle_buffer=0).documents()) for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == sorted(r.encode() for r in _rows(120))  # every row once, as a multiset
    assert len(shares[0]) == len(shares[1]) == 60


def test_validation_is_held_out_of_the_stream(spec):
    cfg = DataConfig(source=spec, stream=True, val_bytes=500)
    stream, val = open_stream(cfg, rank=0, world_size=1, seed=0)
    docs = [r.encode() for r in _rows(120)]
    assert val == [d for d in docs[:len(val) + 5] if d][:len(val)] and sum(len(d) + 1 for d in val) >= 500
    train = list(stream.documents())
    assert len(train) + sum(1 for d in docs if d in val) <= len(docs) and not set(val) & set(train)
    with pytest.raises(DataError, match="--stream reads Hugging Face datasets"):
        open_stream(DataConfig(source="stdlib", stream=True), rank=0, world_size=1, seed=0)


def test_training_on_a_stream_resumes_bit_exactly(spec, tmp_path):
    from learntok.train import train

    base = tiny_train_config(tmp_path / "full", "x", max_steps=4, ckpt_every=2)
    base = replace(base, data=DataConfig(source=spec, stream=True, shuffle_buffer=8, seq_len=64, val_bytes=512))
    train(base, log=lambda *_: None)
    part = replace(base, out=str(tmp_path / "part"), max_steps=2)
    train(part, log=lambda *_: None)
    train(replace(part, resume=str(tmp_path / "part"), max_steps=4), log=lambda *_: None)

    def losses(run):
        rows = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss/auto"]) for r in rows if "loss/auto" in r]

    assert losses("part") == losses("full") and len(losses("full")) == 4


def test_no_document_long_enough_is_an_error_not_an_endless_loop(spec):
    """--stream --no-pack with every row shorter than a window: one pass, then the error (it used to start pass
    after pass, because skipped rows counted as consumed)."""
    batches = StreamBatches(DocumentStream(spec, "text", shuffle_buffer=0), 100_000, 2, pack=False)
    with pytest.raises(DataError, match="no documents of at least 100000 bytes"):
        batches.next_with_flags()


class _Rows:
    """A DocumentStream stand-in over fixed rows."""

    spec = "hf:rows"

    def __init__(self, rows: list[bytes]):
        self.rows = rows

    def documents(self, epoch: int = 0, skip: int = 0):
        return iter(self.rows[skip:])


def test_empty_rows_are_positions_without_bytes():
    """An empty row adds no lone EOS (it did), and a stream of empty rows is an error, not windows of EOS."""
    b = StreamBatches(_Rows([b"ab", b"", b"", b"cd", b"efgh"]), 6, 1)
    assert b.next_batch()[0, 1:].tolist() == [*b"ab", 257, *b"cd", 257]
    assert b.rows == 4  # the empty rows count as consumed: a resume skips them by position
    with pytest.raises(DataError, match="has no documents"):
        StreamBatches(_Rows([b"", b""]), 4, 1).next_batch()


@pytest.fixture(params=["one table", "two files"])
def sharded_spec(request, tmp_path) -> tuple[str, list[bytes]]:
    """Unique rows as a saved dataset (read as one shard: every other row per process) or as two JSON files (two
    shards: one per process)."""
    rows = [f"row {i}: {r}" for i, r in enumerate(_rows(60))]
    if request.param == "one table":
        datasets.Dataset.from_dict({"text": rows}).save_to_disk(tmp_path / "ds")
        return f"hf:{tmp_path / 'ds'}", [r.encode() for r in rows]
    (tmp_path / "js").mkdir()
    for k in range(2):
        (tmp_path / "js" / f"part{k}.jsonl").write_text(
            "".join(json.dumps({"text": r}) + "\n" for r in rows[30 * k:30 * (k + 1)]))
    return f"hf:{tmp_path / 'js'}", [r.encode() for r in rows]


def test_validation_is_held_out_of_every_process_share(sharded_spec, monkeypatch):
    """With two processes no validation row is trained on and every other row is, once (a `skip` before the
    shares are dealt was dealt out too: process 0 trained on validation rows and rows of process 1 were lost)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec, rows = sharded_spec
    cfg = DataConfig(source=spec, stream=True, val_bytes=800, shuffle_buffer=0)
    shares, vals = [], []
    for rank in (0, 1):
        stream, val = open_stream(cfg, rank=rank, world_size=2, seed=0)
        shares.append([d for d in stream.documents() if d])
        vals.append(val)
    assert vals[0] == vals[1] == rows[:len(vals[0])] and 2 <= len(vals[0]) < 10
    assert sorted(shares[0] + shares[1]) == sorted(rows[len(vals[0]):])
    one, _ = open_stream(cfg, rank=0, world_size=1, seed=0)
    assert [d for d in one.documents() if d] == rows[len(vals[0]):]


@pytest.mark.integration
def test_two_processes_resume_a_stream_each_at_its_own_position(spec, tmp_path):
    """Each process's stream position is its own (rows differ in length); a resume restores each one's."""
    import shutil

    from .test_distributed import _losses, _run, _weights

    base = tiny_train_config(tmp_path / "full", "x", max_steps=4, ckpt_every=2, batch_size=4)
    base = replace(base, data=DataConfig(source=spec, stream=True, shuffle_buffer=8, seq_len=64, val_bytes=512))
    _run(base, world=2)
    shutil.copytree(tmp_path / "full", tmp_path / "part")  # then undo it back to step 2 and resume
    part = replace(base, out=str(tmp_path / "part"))
    shutil.rmtree(tmp_path / "part" / "step_000004")
    (tmp_path / "part" / "latest").write_text("step_000002\n")
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "part" / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    _run(replace(part, resume=str(tmp_path / "part")), world=2)
    assert _losses(tmp_path / "part") == _losses(tmp_path / "full") and len(_losses(tmp_path / "full")) == 4
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
