"""Documents as fixed-length byte sequences, and a deterministic, resumable, rank-sharded batch order.

Every sample is `[BOS] + seq_len` byte ids: the model reads `ids[:-1]` and predicts `ids[1:]`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from learntok.data.sources import DataError
from learntok.vocab import BOS, EOS


class ByteSequences:
    """Fixed-length byte sequences of a list of documents, stored as uint16 windows of seq_len ids.

    Sample i is an int64 array `[BOS] + window_i` of seq_len + 1 ids. pack=True: the stream doc0, EOS, doc1,
    EOS, ... cut into consecutive non-overlapping windows (the incomplete tail is dropped). pack=False (the
    paper's rule): the first seq_len bytes of every document of at least seq_len bytes; shorter ones are dropped.
    Raises DataError if seq_len < 2 or no sequence can be formed (`name` says which data in the message).
    """

    def __init__(self, docs: Sequence[bytes], seq_len: int, pack: bool = True, name: str = "data",
                 annotate: Callable[[bytes], np.ndarray] | None = None) -> None:
        if seq_len < 2:
            raise DataError(f"{name}: seq_len must be at least 2, got {seq_len}")
        self.seq_len, self.pack, self.name = seq_len, pack, name
        self.n_docs = len(docs)
        if pack:
            stream = np.frombuffer(b"".join(d + b"\0" for d in docs), dtype=np.uint8).astype(np.uint16)
            stream[np.cumsum([len(d) + 1 for d in docs], dtype=np.int64) - 1] = EOS  # the separators
            n = len(stream) // seq_len
            self.windows = stream[: n * seq_len].reshape(n, seq_len)
            why = f"{len(stream):,} ids in {len(docs)} document(s) (with EOS)"
        else:
            heads = b"".join(d[:seq_len] for d in docs if len(d) >= seq_len)
            self.windows = np.frombuffer(heads, dtype=np.uint8).astype(np.uint16).reshape(-1, seq_len)
            why = f"none of its {len(docs)} document(s) has {seq_len} bytes (pack=False keeps only those)"
        if len(self.windows) == 0:
            raise DataError(f"{name}: not enough data for one sequence of seq_len={seq_len}: {why}")
        # Prescribed per-byte boundary flags (e.g. BPE guidance), computed once per document and stored beside
        # the ids: annotate(doc) -> bool array of len(doc). EOS separators are flagged (a token starts there).
        self.flags: np.ndarray | None = None
        if annotate is not None:
            if pack:
                parts = []
                for d in docs:
                    parts += [np.asarray(annotate(d), dtype=np.uint8), np.ones(1, dtype=np.uint8)]
                flags = np.concatenate(parts)
            else:
                kept = [np.asarray(annotate(d), dtype=np.uint8)[:seq_len] for d in docs if len(d) >= seq_len]
                flags = np.concatenate(kept)
            self.flags = flags[: self.windows.size].reshape(self.windows.shape)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.batch([i])[0]

    def batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 array (len(indices), seq_len + 1) of the given samples, BOS first."""
        idx = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(idx), self.seq_len + 1), dtype=np.int64)
        out[:, 0] = BOS
        out[:, 1:] = self.windows[idx]
        return out


    def flag_batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray | None:
        """bool array (len(indices), seq_len + 1) of prescribed boundary flags aligned with `batch` (True at
        BOS), or None when the sequences carry no flags."""
        if self.flags is None:
            return None
        idx = np.asarray(indices, dtype=np.int64)
        out = np.ones((len(idx), self.seq_len + 1), dtype=bool)
        out[:, 1:] = self.flags[idx].astype(bool)
        return out


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
        epoch, position, seed = int(d["epoch"]), int(d["position"]), int(d["seed"])
        if epoch < 0 or seed < 0 or not 0 <= position <= len(self.seqs):
            raise ValueError(f"data iterator state {d} does not fit {len(self.seqs)} sequences (data changed?)")
        self.epoch, self.position, self.seed = epoch, position, seed
        self._perm = None


def val_batches(seqs: ByteSequences, batch_size: int, max_bytes: int) -> list[torch.Tensor]:
    """The first max(1, max_bytes // seq_len) validation sequences, in order, as LongTensor batches."""
    return [ids for ids, _ in val_batches_with_flags(seqs, batch_size, max_bytes)]


def val_batches_with_flags(seqs: ByteSequences, batch_size: int,
                           max_bytes: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """As `val_batches`, each batch paired with its prescribed boundary flags (or None)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = min(len(seqs), max(1, max_bytes // seqs.seq_len))
    out = []
    for i in range(0, n, batch_size):
        idx = np.arange(i, min(i + batch_size, n))
        flags = seqs.flag_batch(idx)
        out.append((torch.from_numpy(seqs.batch(idx)), None if flags is None else torch.from_numpy(flags)))
    return out
