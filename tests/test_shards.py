"""Prepared corpora (`learntok prepare`): the same documents, splits, sequences and training as the source, memory
mapped; every kind of damage or misuse is a one-line error naming the file and the fix."""

from __future__ import annotations

import gc
import json
import lzma
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from learntok.cli import main
from learntok.config import DataConfig
from learntok.data import ByteSequences, DataError, Prepared, is_prepared, load_split, load_splits, prepare

from .conftest import tiny_train_config


def _rows(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["the", "river", "Grüße", "東京", "def", "x", "=", "1\n", "tokenization", "🙂"]
    return [" ".join(rng.choice(words, size=rng.integers(1, 60))) for _ in range(n)]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A directory of train / valid / test JSONL files (one compressed), like a real corpus."""
    d = tmp_path / "src"
    d.mkdir()
    for name, n, seed in (("train.jsonl", 300, 0), ("valid.jsonl", 40, 1), ("test.jsonl", 30, 2)):
        lines = "".join(json.dumps({"text": t}) + "\n" for t in _rows(n, seed))
        if name == "train.jsonl":
            (d / "train.jsonl.xz").write_bytes(lzma.compress(lines.encode()))
        else:
            (d / name).write_text(lines)
    return d


def _quiet(*_a) -> None:
    pass


def test_prepared_splits_equal_the_source(source, tmp_path):
    out = prepare(DataConfig(source=str(source)), tmp_path / "p", shard_bytes=4000, progress=False, log=_quiet)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["splits"]["train"]["shards"]) > 5  # small shards: documents spread over many files
    train, val = load_splits(DataConfig(source=str(out)))
    src_train, src_val = load_splits(DataConfig(source=str(source)))
    assert train == src_train and val == src_val and len(train) == 300
    assert train.mapped and not src_train.mapped  # mapped from the shards, not read into memory
    assert load_split(DataConfig(source=str(out)), "test")[1] == load_split(DataConfig(source=str(source)), "test")[1]
    for pack in (True, False):  # windows that cross documents and shards come out the same
        a = ByteSequences(train, 48, pack, annotate=lambda d: np.frombuffer(d, np.uint8) % 5 == 0)
        b = ByteSequences(src_train, 48, pack, annotate=lambda d: np.frombuffer(d, np.uint8) % 5 == 0)
        idx = np.arange(len(a))
        assert len(a) == len(b) > 50 and np.array_equal(a.batch(idx), b.batch(idx))
        assert np.array_equal(a.flag_batch(idx), b.flag_batch(idx))


def test_training_on_a_prepared_corpus_equals_training_on_its_source(source, tmp_path):
    from learntok.train import train

    out = prepare(DataConfig(source=str(source)), tmp_path / "p", shard_bytes=5000, progress=False, log=_quiet)
    losses = []
    for name, data in (("a", source), ("b", out)):
        res = train(tiny_train_config(tmp_path / name, data, max_steps=3), log=_quiet)
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses.append(([r["loss/auto"] for r in rows if "loss/auto" in r], res.val_bpb))
    assert losses[0] == losses[1]


def test_prepare_from_a_hugging_face_dataset_and_a_byte_budget(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets not installed (pip install 'learntok[hf]')")
    rows = _rows(200, 3)
    splits = {"train": rows, "validation": _rows(9, 4)}
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}).save_to_disk(
        tmp_path / "ds")
    cfg = DataConfig(source=f"hf:{tmp_path / 'ds'}:train", val_data=f"hf:{tmp_path / 'ds'}:validation")
    out = prepare(cfg, tmp_path / "p", max_bytes=3000, progress=False, log=_quiet)
    train, val = load_splits(DataConfig(source=str(out)))
    assert 3000 <= train.n_bytes < 3000 + max(len(r.encode()) for r in rows)  # stops after the budget
    assert list(train) == [r.encode() for r in rows[:len(train)]] and list(val) == [r.encode() for r in _rows(9, 4)]
    long = prepare(cfg, tmp_path / "long", min_doc_bytes=200, progress=False, log=_quiet)
    kept, _ = load_splits(DataConfig(source=str(long)))
    assert list(kept) == [r.encode() for r in rows if len(r.encode()) >= 200] and 0 < len(kept) < len(rows)


def test_damaged_or_misused_corpora_are_one_line_errors(source, tmp_path):
    out = prepare(DataConfig(source=str(source)), tmp_path / "p", progress=False, log=_quiet)
    cfg = DataConfig(source=str(out))
    shard = out / "train" / "00000.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"00000\.bin: checksum differs .*prepare it again"):
        load_splits(cfg)
    load_splits(replace(cfg, verify_data=False))  # sizes still match: opens without the checksum
    shard.write_bytes(bytes(data[:-7]))
    with pytest.raises(DataError, match=r"00000\.bin: .* bytes, the manifest says"):
        load_splits(replace(cfg, verify_data=False))
    with pytest.raises(DataError, match="training split of the prepared corpus"):
        load_splits(replace(cfg, val_data=str(out / "train")))
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(DataError, match="version 99 .*--overwrite"):
        Prepared.open(out)
    for bad, what in (([], "not a prepared corpus's manifest"), ({**manifest, "splits": None}, "not a prepared"),
                      ({k: v for k, v in manifest.items() if k != "splits"}, "lists no splits")):
        (out / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(DataError, match=what):
            Prepared.open(out)
    shards = manifest["splits"]["train"]["shards"]
    (out / "manifest.json").write_text(json.dumps(
        {**manifest, "splits": {**manifest["splits"], "train": {"shards": [{"data": shards[0]["data"]}]}}}))
    with pytest.raises(DataError, match="the train split's entry is damaged"):
        Prepared.open(out).split("train")
    with pytest.raises(DataError, match="exists and is not empty .*--overwrite"):
        prepare(DataConfig(source=str(source)), out, progress=False, log=_quiet)
    prepare(DataConfig(source=str(source)), out, overwrite=True, progress=False, log=_quiet)
    assert load_splits(cfg)[0] == load_splits(DataConfig(source=str(source)))[0]


def test_a_source_with_another_tools_manifest_is_read_not_refused_or_replaced(source, tmp_path):
    """Only learntok's own manifest.json marks a prepared corpus: a data directory that ships another tool's is
    trained on and prepared as text, and `prepare --overwrite` into it refuses instead of deleting it."""
    (source / "manifest.json").write_text(json.dumps({"name": "my corpus", "files": ["train.jsonl.xz"]}))
    assert not is_prepared(source)
    cfg = DataConfig(source=str(source))
    (source / "manifest.json").rename(tmp_path / "aside.json")
    expected = load_splits(cfg)
    (tmp_path / "aside.json").rename(source / "manifest.json")
    assert load_splits(cfg)[0] == expected[0]
    out = prepare(cfg, tmp_path / "p", progress=False, log=_quiet)
    assert is_prepared(out) and load_splits(DataConfig(source=str(out)))[0] == expected[0]
    with pytest.raises(DataError, match="exists and is not empty"):
        prepare(cfg, source, overwrite=True, progress=False, log=_quiet)
    assert sorted(p.name for p in source.iterdir()) == ["manifest.json", "test.jsonl", "train.jsonl.xz",
                                                        "valid.jsonl"]
    (out / "manifest.json").write_text("{damaged")  # a damaged manifest of ours still marks the corpus
    assert is_prepared(out)


def test_prepare_into_the_current_directory_or_a_file_is_refused_before_any_work(source, tmp_path, monkeypatch):
    """`prepare SRC .` in an empty directory used to read everything, then fail renaming '.' away (a stack of
    errno text, a `..lock` file left behind)."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    for out in (".", "..", str(tmp_path / "here")):
        with pytest.raises(DataError, match=r"the current directory or one above it; prepare into a new directory"):
            prepare(DataConfig(source=str(source)), out, progress=False, log=_quiet)
    assert list((tmp_path / "here").iterdir()) == []
    assert is_prepared(prepare(DataConfig(source=str(source)), "corpus", progress=False, log=_quiet))
    (tmp_path / "here" / "a-file").write_text("x")
    with pytest.raises(DataError, match=r"^a-file: exists and is not a directory"):
        prepare(DataConfig(source=str(source)), "a-file", progress=False, log=_quiet)
    with pytest.raises(DataError, match=r"^a-file/sub: cannot make its directory \(File exists: a-file\)"):
        prepare(DataConfig(source=str(source)), "a-file/sub", progress=False, log=_quiet)


def test_an_interrupted_prepare_leaves_nothing_that_looks_finished(source, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _rows(50, 0)) + "{oops\n")
    (bad / "valid.jsonl").write_text(json.dumps({"text": "v"}) + "\n")
    with pytest.raises(DataError, match=r"train\.jsonl:51: line is not valid JSON"):
        prepare(DataConfig(source=str(bad)), tmp_path / "p", progress=False, log=_quiet)
    assert not (tmp_path / "p").exists() and not list(tmp_path.glob(".p.partial-*"))
    with warnings.catch_warnings(record=True) as seen:  # the open shard file was closed, not left to the GC
        warnings.simplefilter("always", ResourceWarning)
        try:
            prepare(DataConfig(source=str(bad)), tmp_path / "p", progress=False, log=_quiet)
        except DataError:
            pass
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]
    (tmp_path / ".p.partial-1").mkdir()  # a prepare killed with SIGKILL leaves this behind
    prepare(DataConfig(source=str(source)), tmp_path / "p", progress=False, log=_quiet)
    assert not list(tmp_path.glob(".p.partial-*"))
    one = tmp_path / "one.txt"
    one.write_text("a single document")
    with pytest.raises(DataError, match="val split is empty"):
        prepare(DataConfig(source=str(one), val_fraction=0.0), tmp_path / "q", progress=False, log=_quiet)


@pytest.mark.skipif(sys.platform == "win32", reason="the prepare lock is an flock")
def test_a_second_prepare_of_the_same_out_fails_while_the_first_runs(source, tmp_path):
    """Every rank of a job running `learntok prepare` at once: the later ones fail at once and leave the first
    one's partial directory alone (the stale-leftover sweep deleted it)."""
    import fcntl

    live = tmp_path / f".p.partial-{os.getpid() + 1}"
    live.mkdir()
    with open(tmp_path / ".p.lock", "a") as held:  # the first prepare, still writing
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(DataError, match=r"p: another learntok prepare is writing it now"):
            prepare(DataConfig(source=str(source)), tmp_path / "p", progress=False, log=_quiet)
        assert live.is_dir() and not (tmp_path / "p").exists()
    prepare(DataConfig(source=str(source)), tmp_path / "p", progress=False, log=_quiet)  # released: it runs
    assert is_prepared(tmp_path / "p") and not live.exists()


def test_prepare_command(source, tmp_path, capsys):
    assert main(["prepare", str(source), str(tmp_path / "p"), "--no-progress", "--shard-mb", "0.01"]) == 0
    assert "learntok train --data" in capsys.readouterr().out
    assert main(["prepare", str(tmp_path / "p"), str(tmp_path / "q"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already a prepared corpus" in err and len(err.strip().splitlines()) == 1
    assert main(["prepare", str(tmp_path / "missing"), str(tmp_path / "q")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_prepare_reads_files_with_the_encoding_asked(tmp_path, capsys):
    """`learntok prepare --encoding` reads whole files as `learntok train --encoding` does (a Latin-1 corpus was
    skipped as binary), and the manifest records it."""
    for split in ("train", "valid"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "a.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1") * 20)
    assert main(["prepare", str(tmp_path), str(tmp_path / "p"), "--no-progress"]) == 2
    assert "--encoding bytes" in capsys.readouterr().err
    assert main(["prepare", str(tmp_path), str(tmp_path / "p"), "--no-progress", "--encoding", "latin-1"]) == 0
    train, _ = load_splits(DataConfig(source=str(tmp_path / "p")))
    assert train[0].decode("utf-8").startswith("café crème")
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["encoding"] == "latin-1"


def test_evaluation_reads_the_prepared_splits(source, tmp_path, capsys):
    from learntok.evaluation.report import heldout_documents
    from learntok.train import train

    out = prepare(DataConfig(source=str(source)), tmp_path / "p", progress=False, log=_quiet)
    run = tmp_path / "run"
    train(tiny_train_config(run, out, max_steps=2), log=_quiet)
    assert main(["eval", str(run), "--split", "test", "--tasks", "none", "--no-progress", "--limit", "2"]) == 0
    assert "(test)" in capsys.readouterr().out
    from learntok.checkpoint import load_run

    cfg, _ = load_run(run)
    desc, docs = heldout_documents(cfg, str(out), "val")  # --data PREPARED: its split
    assert docs == load_split(DataConfig(source=str(source)), "val")[1] and "(val)" in desc


def test_val_data_mixes_prepared_corpora_and_sources(source, tmp_path):
    """--val-data may name a source beside a prepared --data, or a prepared corpus (its val split) beside a
    source: the same documents either way, read by training and by evaluation alike."""
    out = prepare(DataConfig(source=str(source)), tmp_path / "p", progress=False, log=_quiet)
    train, valid = load_splits(DataConfig(source=str(source)))  # the directory's train* and valid* files
    _, beside_prepared = load_splits(DataConfig(source=str(out), val_data=str(source / "valid.jsonl")))
    assert list(beside_prepared) == list(valid)
    cfg = DataConfig(source=str(source), val_data=str(out))
    mixed_train, from_prepared = load_splits(cfg)
    assert list(mixed_train) == list(train) and list(from_prepared) == list(valid)
    assert list(load_split(cfg, "val")[1]) == list(valid)
    with pytest.raises(DataError, match="--val-data .*a prepared corpus; `learntok prepare` reads sources"):
        prepare(cfg, tmp_path / "q", progress=False, log=_quiet)
