"""Documents as fixed-length byte sequences, and a deterministic, resumable, rank-sharded batch order.

Every sample is `[BOS] + seq_len` byte ids: the model reads `ids[:-1]` and predicts `ids[1:]`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from learntok.data.corpus import Corpus
from learntok.data.sources import DataError
from learntok.vocab import BOS, EOS


class ByteSequences:
    """Fixed-length byte sequences of a corpus, cut on demand (nothing is copied up front).

    Sample i is an int64 array `[BOS] + window_i` of seq_len + 1 ids. pack=True: the stream doc0, EOS, doc1,
    EOS, ... cut into consecutive non-overlapping windows (the incomplete tail is dropped). pack=False (the
    paper's rule): the first seq_len bytes of every document of at least seq_len bytes; shorter ones are dropped.
    `docs` is a Corpus (in memory or memory-mapped) or a list of documents. Raises DataError if seq_len < 2 or no
    sequence can be formed (`name` says which data in the message).

    Prescribed boundary flags (`annotate(doc) -> bool array of len(doc)`, e.g. BPE guidance) are computed per
    document when a sample needs them and kept in a bounded cache; EOS separators are flagged (a token starts
    there), and so is BOS.
    """

    cache_bytes = 1 << 28
    """Bytes of annotated documents kept (flags cost one byte per document byte)."""

    def __init__(self, docs: Sequence[bytes] | Corpus, seq_len: int, pack: bool = True, name: str = "data",
                 annotate: Callable[[bytes], np.ndarray] | None = None) -> None:
        if seq_len < 2:
            raise DataError(f"{name}: seq_len must be at least 2, got {seq_len}")
        self.corpus = docs if isinstance(docs, Corpus) else Corpus.from_documents(docs, name)
        self.seq_len, self.pack, self.name, self.annotate = seq_len, pack, name, annotate
        self.n_docs = len(self.corpus)
        starts, lengths = self.corpus.offsets[:-1], self.corpus.lengths
        if pack:
            self._eos = self.corpus.offsets[1:] + np.arange(self.n_docs)  # (n_docs,) EOS positions in the stream
            n = (self.corpus.n_bytes + self.n_docs) // seq_len
            why = f"{self.corpus.n_bytes + self.n_docs:,} ids in {self.n_docs} document(s) (with EOS)"
        else:
            self._kept = np.flatnonzero(lengths >= seq_len)  # documents that give a sequence
            n = len(self._kept)
            why = f"none of its {self.n_docs} document(s) has {seq_len} bytes (pack=False keeps only those)"
        if n == 0:
            raise DataError(f"{name}: not enough data for one sequence of seq_len={seq_len}: {why}")
        self._n, self._starts = n, starts
        self._flag_cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cached = 0

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:
        return self.batch([i])[0]

    def document_spans(self, i: int) -> list[tuple[int, int, int]]:
        """(document, first target position, bytes) of each document's bytes in window i: target j of the
        window (the byte that position j predicts) is byte j of the window, so a document's bytes are targets
        pos .. pos + bytes - 1; EOS separators belong to no document, and a document with no bytes in the
        window has no span."""
        return [(d, pos, n) for d, _, n, pos in self._pieces(i) if n > 0]

    def _pieces(self, i: int) -> list[tuple[int, int, int, int]]:
        """Where window i comes from: (document, first byte in it, bytes, position in the window) per piece;
        in a packed window each piece after the first is preceded by its predecessor's EOS."""
        L = self.seq_len
        if not self.pack:
            return [(int(self._kept[i]), 0, L, 0)]
        a = i * L  # the window's first position in the stream with separators
        d = int(self._eos.searchsorted(a))  # the document (or its EOS) at position a
        out, pos = [], a
        while pos < a + L:
            end = min(int(self._eos[d]), a + L)  # this document's bytes end at its EOS
            first = pos - (int(self._eos[d - 1]) + 1 if d else 0)  # offset of `pos` inside document d
            out.append((d, first, end - pos, pos - a))
            pos, d = end + 1, d + 1  # skip the EOS
        return out

    def batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 array (len(indices), seq_len + 1) of the given samples, BOS first."""
        out = np.full((len(indices), self.seq_len + 1), EOS, dtype=np.int64)
        out[:, 0] = BOS
        for r, i in enumerate(np.asarray(indices, dtype=np.int64).tolist()):
            for d, first, n, at in self._pieces(i):
                out[r, 1 + at:1 + at + n] = self.corpus.read(int(self._starts[d]) + first, n)
        return out

    def flag_batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray | None:
        """bool array (len(indices), seq_len + 1) of prescribed boundary flags aligned with `batch` (True at
        BOS and EOS), or None when the sequences carry no flags."""
        if self.annotate is None:
            return None
        out = np.ones((len(indices), self.seq_len + 1), dtype=bool)
        for r, i in enumerate(np.asarray(indices, dtype=np.int64)):
            for d, first, n, at in self._pieces(int(i)):
                out[r, 1 + at:1 + at + n] = self._doc_flags(d)[first:first + n]
        return out

    def _doc_flags(self, d: int) -> np.ndarray:
        """annotate(document d) as bool, from a least-recently-used cache of at most `cache_bytes`."""
        flags = self._flag_cache.pop(d, None)
        if flags is None:
            flags = np.asarray(self.annotate(self.corpus[d]), dtype=bool)
            self._cached += len(flags)
            while self._flag_cache and self._cached > self.cache_bytes:
                self._cached -= len(self._flag_cache.popitem(last=False)[1])
        self._flag_cache[d] = flags
        return flags


class BatchIterator:
    """Deterministic, resumable batches of a ByteSequences, sharded across ranks.

    Epoch e visits the permutation `default_rng([seed, e]).permutation(len(seqs))`; each step takes the next
    global batch of batch_size * world_size consecutive permuted indices and rank r keeps rows
    [r * batch_size, (r + 1) * batch_size) of it, so one process with batch 2b sees exactly what two processes
    with batch b see together. When fewer indices than a global batch are left, the next epoch starts (the tail
    is skipped). If the data holds fewer sequences than one global batch, every step is one epoch whose
    permutation is repeated cyclically to fill the batch (sampling with replacement). The state counts global
    batches, so a run may resume with another world_size as long as the global batch is unchanged.
    """

    def __init__(self, seqs: ByteSequences, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if len(seqs) == 0:
            raise DataError(f"{getattr(seqs, 'name', 'data')}: no sequences to iterate over")
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad batching: batch_size={batch_size}, rank={rank}, world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.seqs, self.batch_size, self.rank, self.world_size = seqs, batch_size, rank, world_size
        self.seed, self.epoch, self.position = seed, 0, 0
        self._perm: tuple[int, np.ndarray] | None = None

    def _permutation(self) -> np.ndarray:
        if self._perm is None or self._perm[0] != self.epoch:
            self._perm = (self.epoch, np.random.default_rng([self.seed, self.epoch]).permutation(len(self.seqs)))
        return self._perm[1]

    def next_indices(self) -> np.ndarray:
        """The sequence indices of this rank's next batch (advances the state)."""
        n, g = len(self.seqs), self.batch_size * self.world_size
        if self.position > 0 and self.position + g > n:
            self.epoch, self.position = self.epoch + 1, 0
        perm = self._permutation()
        if g <= n:
            idx = perm[self.position:self.position + g]
            self.position += g
        else:
            idx = perm[np.arange(g) % n]
            self.position = n
        return idx[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def next_batch(self) -> torch.Tensor:
        """LongTensor (batch_size, seq_len + 1): BOS then seq_len bytes per row."""
        return torch.from_numpy(self.seqs.batch(self.next_indices()))

    def next_with_flags(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(ids, flags): ids as `next_batch`, flags the matching prescribed boundaries (or None)."""
        idx = self.next_indices()
        flags = self.seqs.flag_batch(idx)
        return torch.from_numpy(self.seqs.batch(idx)), None if flags is None else torch.from_numpy(flags)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """JSON-ready position in the batch order."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Continue exactly where the iterator that produced `d` left off (same data required)."""
        if "stream" in d or "position" not in d:
            raise ValueError(f"data iterator state {d} is a stream's (the run trained with --stream); resume it "
                             "with --stream")
        epoch, position, seed = int(d["epoch"]), int(d["position"]), int(d["seed"])
        if epoch < 0 or seed < 0 or not 0 <= position <= len(self.seqs):
            raise ValueError(f"data iterator state {d} does not fit {len(self.seqs)} sequences (data changed?)")
        self.epoch, self.position, self.seed = epoch, position, seed
        self._perm = None


def val_batches(seqs: ByteSequences, batch_size: int, max_bytes: int) -> list[torch.Tensor]:
    """The first max(1, max_bytes // seq_len) validation sequences, in order, as LongTensor batches."""
    return [ids for ids, _ in val_batches_with_flags(seqs, batch_size, max_bytes)]


def val_batches_with_flags(seqs: ByteSequences, batch_size: int, max_bytes: int,
                           first: int = 0) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """As `val_batches` (from sequence `first` on), each batch paired with its prescribed boundary flags (or
    None)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = first + min(len(seqs) - first, max(1, max_bytes // seqs.seq_len))
    out = []
    for i in range(first, n, batch_size):
        idx = np.arange(i, min(i + batch_size, n))
        flags = seqs.flag_batch(idx)
        out.append((torch.from_numpy(seqs.batch(idx)), None if flags is None else torch.from_numpy(flags)))
    return out
