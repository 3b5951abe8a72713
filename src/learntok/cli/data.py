"""`learntok prepare`: a data source into byte shards that training and evaluation memory-map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import tyro

from learntok.cli import parse

PREPARE_DESCRIPTION = """Convert any data source `learntok train --data` accepts into a prepared corpus: uint8 byte
shards plus document offsets, split into train / val (/ test) as training would split the source, with a
manifest of counts and checksums. Train on it with `learntok train --data OUT`: the shards are memory-mapped, so
memory does not grow with the corpus.

examples:
  learntok prepare DATA/enwiki prepared/enwiki                       # train* / valid* / test* files
  learntok prepare "corpus/*.jsonl.zst" prepared/corpus --val-fraction 0.01
  learntok prepare hf:HuggingFaceFW/fineweb:sample-10BT:train prepared/fineweb --max-bytes 6e9 --val-fraction 0.001"""


@dataclass(frozen=True, kw_only=True)
class PrepareArgs:
    source: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SOURCE")]
    """The data: 'stdlib', a file, directory or glob of .txt/.md/.py/.jsonl/.parquet (optionally .gz/.xz/.zst),
    or hf:NAME[:SPLIT] / hf:NAME:CONFIG:SPLIT."""
    out: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")]
    """Directory to write the prepared corpus to."""
    val_data: str | None = None
    """Validation data (default: a split of the source: its valid* files, or a hash hold-out)."""
    text_field: str = "text"
    """Field holding the text in .jsonl/.parquet/Hugging Face rows."""
    encoding: str = "utf-8"
    """How whole-file documents (.txt/.md/.py) are read, as `learntok train --encoding`: utf-8 (non-UTF-8 files
    are skipped as binary), a codec such as latin-1 (decoded, stored as UTF-8), or bytes (stored as they are)."""
    val_fraction: float = 0.05
    """Share of documents held out (by a hash of the document key) when the source has no validation split."""
    max_bytes: float = 0.0
    """Stop the training split after this many bytes of documents (0 = all of it)."""
    min_doc_bytes: int = 0
    """Leave out documents shorter than this (4096 with the paper's keep-and-truncate rule, --no-pack)."""
    shard_mb: float = 1024.0
    """Size of each shard in MB."""
    overwrite: bool = False
    """Replace an existing prepared corpus in OUT."""
    progress: bool = True
    """Show a progress bar with MB/s."""

    def __post_init__(self) -> None:
        if self.shard_mb <= 0 or self.max_bytes < 0 or self.min_doc_bytes < 0:
            raise ValueError(f"--shard-mb must be > 0 and --max-bytes, --min-doc-bytes >= 0 (got {self.shard_mb}, "
                             f"{self.max_bytes}, {self.min_doc_bytes})")


def cmd_prepare(argv: list[str]) -> int:
    from learntok.config import DataConfig
    from learntok.data import prepare

    a = parse(PrepareArgs, argv, "learntok prepare", PREPARE_DESCRIPTION)
    cfg = DataConfig(source=a.source, val_data=a.val_data, text_field=a.text_field, val_fraction=a.val_fraction,
                     encoding=a.encoding)
    out = prepare(cfg, a.out, shard_bytes=int(a.shard_mb * 1e6), max_bytes=a.max_bytes,
                  min_doc_bytes=a.min_doc_bytes, overwrite=a.overwrite, progress=a.progress)
    print(f"train on it with: learntok train --data {out}")
    return 0
