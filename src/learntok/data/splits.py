"""A data config's splits as corpora: memory-mapped from a prepared corpus (learntok.data.shards), or read from
the source into memory (documents are appended to one byte buffer as they stream in)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from learntok.data.corpus import Corpus, CorpusBuilder
from learntok.data.shards import Prepared, is_prepared
from learntok.data.sources import (
    DataError,
    find_split_files,
    hf_split_specs,
    iter_documents,
    split_documents,
    split_entries,
)

if TYPE_CHECKING:
    from learntok.config import DataConfig


def load_splits(cfg: DataConfig) -> tuple[Corpus, Corpus]:
    """(train, validation) corpora of a data config.

    A prepared corpus (`--data OUT` of `learntok prepare`) gives its train and val splits, memory-mapped;
    `--val-data` (with either kind of `--data`) may name a prepared corpus (its val split) or any source. Anything
    else is split by `split_documents` into memory; if the hash hold-out leaves validation empty, the last
    document(s) move to it.
    """
    given = validation_data(cfg)
    if is_prepared(cfg.source):
        val = given if given is not None else Prepared.open(cfg.source).split("val", verify=cfg.verify_data)
        return Prepared.open(cfg.source).split("train", verify=cfg.verify_data), val
    parts = {"train": CorpusBuilder(), "val": CorpusBuilder()}
    for split, doc in split_documents(cfg, with_val_data=False):
        parts[split].add(doc)
    if given is not None:
        return parts["train"].build("training data"), given
    train, val = parts["train"], parts["val"]
    if not len(val):
        for doc in train.pop(min(len(train), max(1, int(len(train) * cfg.val_fraction)))):
            val.add(doc)
    if not len(train):
        raise DataError(f"{cfg.source}: only {len(val)} document(s), too few to hold out validation; "
                        "give more data or a separate --val-data")
    return train.build("training data"), val.build("validation data")


def validation_data(cfg: DataConfig) -> Corpus | None:
    """The corpus `--val-data` names: a prepared corpus's val split (memory-mapped) or any source's documents
    (read into memory); None without --val-data."""
    if cfg.val_data is None:
        return None
    path = Path(cfg.val_data)
    if path.name == "train" and is_prepared(path.parent):
        raise DataError(f"--val-data {cfg.val_data}: that is the training split of the prepared corpus "
                        f"{path.parent}; give the corpus itself ({path.parent}) to validate on its val split")
    if is_prepared(path):
        return Prepared.open(path).split("val", verify=cfg.verify_data)
    return _read([cfg.val_data], cfg, "validation data")


def load_split(cfg: DataConfig, split: str) -> tuple[str, Corpus]:
    """(description, corpus) of one split of the run's data: "val" as training validated on, or "test" (a
    prepared corpus's test split, or the test* files of a split directory). Reads no more than it needs."""
    if split not in ("val", "test"):
        raise ValueError(f"--split must be val or test, got {split!r}")
    if split == "val" and cfg.val_data is not None:
        return cfg.val_data, validation_data(cfg)
    if is_prepared(cfg.source):
        return f"{cfg.source} ({split})", Prepared.open(cfg.source).split(split, verify=cfg.verify_data)
    found = hf_split_specs(cfg.source) if cfg.source.startswith("hf:") else None if cfg.source == "stdlib" \
        else find_split_files(cfg.source)
    if found is not None and found[split]:
        docs = (t for _, t in split_entries(cfg.source, found[split], cfg.text_field, cfg.encoding))
        return f"{cfg.source} ({split})", Corpus.from_documents(docs, f"{split} data")  # read as training read it
    if split == "test":
        raise ValueError(f"--split test: the run's data {cfg.source!r} is neither a prepared corpus nor a directory "
                         "with test* files; give --data PATH")
    return f"{cfg.source} (val)", load_splits(cfg)[1]


def _read(specs: list[str], cfg: DataConfig, name: str) -> Corpus:
    docs = (t for spec in specs for _, t in iter_documents(spec, cfg.text_field, cfg.encoding))
    return Corpus.from_documents(docs, name)


def describe(train_docs: Sequence[bytes], val_docs: Sequence[bytes]) -> str:
    """One log line: document counts and byte totals of both splits."""
    def part(name: str, docs: Sequence[bytes]) -> str:
        n = docs.n_bytes if isinstance(docs, Corpus) else sum(len(d) for d in docs)
        return f"{name} {len(docs):,} docs / {_human(n)}"
    return f"data: {part('train', train_docs)}, {part('val', val_docs)}"


def _human(n: int) -> str:
    k = min(4, max(0, (len(str(n)) - 1) // 3))
    return f"{n} B" if k == 0 else f"{n / 1000 ** k:.1f} {'KMGT'[k - 1]}B"
