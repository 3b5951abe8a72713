"""Training data: documents from many sources (`sources`), and byte sequences with a resumable batch order
(`sequences`)."""

from learntok.data.sequences import BatchIterator, ByteSequences, val_batches, val_batches_with_flags
from learntok.data.sources import (
    DataError,
    describe,
    find_split_files,
    is_binary,
    is_holdout,
    is_stdlib_val,
    iter_documents,
    load_splits,
    open_decompressed,
    read_errors,
    read_jsonl,
    resolve_files,
    stdlib_dir,
    stdlib_files,
)

__all__ = ["BatchIterator", "ByteSequences", "DataError", "describe", "find_split_files", "is_binary", "is_holdout",
           "is_stdlib_val", "iter_documents", "load_splits", "open_decompressed", "read_errors", "read_jsonl",
           "resolve_files", "stdlib_dir", "stdlib_files", "val_batches", "val_batches_with_flags"]
