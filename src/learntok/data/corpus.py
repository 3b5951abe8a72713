"""A split's documents as one byte stream plus document offsets: in memory for small corpora, memory-mapped
from prepared shards (learntok.data.shards) for large ones, behind one interface.

Memory is 1 byte per corpus byte in memory (none for a memory map: pages are read on demand) plus 8 bytes per
document for the offsets, so a 6e9-byte corpus costs its page cache, not the process's heap.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np


class Corpus(Sequence[bytes]):
    """Documents of one split. Stored as shards, each a uint8 array of whole documents back to back and an int64
    array of their offsets (n_docs + 1, starting at 0); `corpus[i]` is document i as bytes."""

    def __init__(self, shards: Sequence[tuple[np.ndarray, np.ndarray]], name: str = "data"):
        self.name = name
        self.mapped = any(isinstance(d, np.memmap) for d, _ in shards)
        """True if the bytes are memory-mapped from files (read on demand) rather than held in memory."""
        self._data = [np.asarray(d) for d, _ in shards]  # uint8; a plain view of a memmap slices faster
        local = [np.asarray(o, dtype=np.int64) for _, o in shards]
        byte_base = np.cumsum([0] + [len(d) for d in self._data], dtype=np.int64)
        # Global document offsets in the concatenated stream of all shards (n_docs + 1,).
        self.offsets = np.concatenate([o[:-1] + byte_base[i] for i, o in enumerate(local)] + [byte_base[-1:]])
        self._shard_bytes = byte_base  # (n_shards + 1,) where each shard starts in the stream

    @staticmethod
    def from_documents(docs: Iterable[bytes], name: str = "data") -> Corpus:
        """An in-memory corpus of `docs` (consumed once; the documents are not kept)."""
        builder = CorpusBuilder()
        for d in docs:
            builder.add(d)
        return builder.build(name)

    @property
    def lengths(self) -> np.ndarray:
        """(n_docs,) int64 bytes per document."""
        return np.diff(self.offsets)

    @property
    def n_bytes(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"{self.name}: document {i} of {len(self)}")
        i %= len(self)
        return self.read(int(self.offsets[i]), int(self.offsets[i + 1] - self.offsets[i])).tobytes()

    def __iter__(self) -> Iterator[bytes]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        """Equal to any sequence of the same documents (a list of bytes, another Corpus)."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  (mutable-looking sequence semantics, like list)

    def read(self, start: int, n: int) -> np.ndarray:
        """Bytes [start, start + n) of the stream of all documents (uint8; a view within one shard)."""
        if len(self._data) == 1:
            return self._data[0][start:start + n]
        s = int(self._shard_bytes.searchsorted(start, side="right")) - 1
        local = start - int(self._shard_bytes[s])
        if local + n <= len(self._data[s]):
            return self._data[s][local:local + n]
        head = self._data[s][local:]
        return np.concatenate([head, self.read(start + len(head), n - len(head))])


class CorpusBuilder:
    """Appends documents to one growing byte buffer; `build` makes the Corpus without copying."""

    def __init__(self) -> None:
        self._buf, self._ends = bytearray(), [0]

    def __len__(self) -> int:
        return len(self._ends) - 1

    def add(self, doc: bytes) -> None:
        self._buf += doc
        self._ends.append(len(self._buf))

    def pop(self, n: int) -> list[bytes]:
        """Remove and return the last n documents."""
        cut = self._ends[-n - 1]
        docs = [bytes(self._buf[a:b]) for a, b in zip(self._ends[-n - 1:-1], self._ends[-n:])]
        del self._buf[cut:], self._ends[-n:]
        return docs

    def build(self, name: str = "data") -> Corpus:
        return Corpus([(np.frombuffer(self._buf, dtype=np.uint8), np.asarray(self._ends, dtype=np.int64))], name)


def total_bytes(docs: Sequence[bytes]) -> int:
    """Bytes in all documents (without reading a Corpus's documents)."""
    return docs.n_bytes if isinstance(docs, Corpus) else sum(len(d) for d in docs)


def head_documents(docs: Iterable[bytes], max_bytes: int) -> list[bytes]:
    """The documents in order up to `max_bytes` in all (the last one cut); reads no further than that."""
    out, n = [], 0
    for d in docs:
        if n >= max_bytes:
            break
        out.append(bytes(d)[: max_bytes - n])
        n += len(out[-1])
    return out


def sample_documents(docs: Sequence[bytes], max_bytes: int, seed: int) -> list[bytes]:
    """Whole documents in a seeded random order up to `max_bytes` (the last one cut); all, in order, if they fit.
    On a Corpus only the sampled documents are read."""
    lengths = docs.lengths if isinstance(docs, Corpus) else np.fromiter((len(d) for d in docs), np.int64, len(docs))
    if int(lengths.sum()) <= max_bytes:
        return list(docs)
    out, n = [], 0
    for i in np.random.default_rng(seed).permutation(len(docs)):
        d = docs[int(i)][: max_bytes - n]
        out.append(d)
        n += len(d)
        if n >= max_bytes:
            break
    return out
