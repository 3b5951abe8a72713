"""Training data: documents from many sources (`sources`), a split's documents as one byte stream in memory or
memory-mapped (`corpus`), prepared byte shards (`shards`), a data config's splits (`splits`), and fixed-length
sequences with a resumable batch order (`sequences`)."""

from learntok.data.corpus import Corpus, CorpusBuilder, head_documents, sample_documents, total_bytes
from learntok.data.sequences import BatchIterator, ByteSequences, val_batches, val_batches_with_flags
from learntok.data.shards import Prepared, is_prepared, prepare
from learntok.data.sources import (
    DataError,
    find_split_files,
    is_binary,
    is_holdout,
    is_stdlib_val,
    iter_documents,
    open_decompressed,
    read_errors,
    read_jsonl,
    resolve_files,
    split_documents,
    stdlib_dir,
    stdlib_files,
)
from learntok.data.splits import describe, load_split, load_splits

__all__ = ["BatchIterator", "ByteSequences", "Corpus", "CorpusBuilder", "DataError", "Prepared", "describe",
           "find_split_files", "head_documents", "is_binary", "is_holdout", "is_prepared", "is_stdlib_val",
           "iter_documents", "load_split", "load_splits", "open_decompressed", "prepare", "read_errors", "read_jsonl",
           "resolve_files", "sample_documents", "split_documents", "stdlib_dir", "stdlib_files", "total_bytes",
           "val_batches", "val_batches_with_flags"]
