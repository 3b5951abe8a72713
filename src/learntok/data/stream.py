"""Training on a Hugging Face dataset as a stream (`--data hf:NAME --stream`), for corpora one does not want to
prepare: nothing is read up front and memory does not grow with the dataset.

Each process reads its own share of the rows (`datasets.distributed.split_dataset_by_node`), shuffled by a
seeded buffer of `--shuffle-buffer` rows (reshuffled every pass), and packs them into windows in stream order
(EOS-separated; or, with --no-pack, the first seq_len bytes of each long enough document).

Validation, unless --val-data gives it, is the stream's first rows up to --val-bytes. One process skips them;
several leave out every row equal to one of them (a `skip` before the shares are dealt would be dealt out too).
Empty rows are skipped (no lone EOS), as a prepared corpus skips empty documents.

Resuming is exact for the same number of processes: the state is (pass, rows consumed, bytes of the current row
consumed), one per process in the checkpoint, and a resumed stream replays the same shuffled order and skips to
that point (re-reading the skipped rows, which costs time proportional to the position). With another number of
processes each process's share changes, so a resume continues every share from rank 0's recorded position:
approximate, some rows repeat or are skipped. The order differs from a prepared corpus's (a global permutation
of windows), so the two kinds of run are not bit-comparable.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from learntok.data.base import DataError, _text_bytes
from learntok.data.hf import open_hf
from learntok.vocab import BOS, EOS


class DocumentStream:
    """This process's share of an hf: dataset's rows, as UTF-8 documents."""

    def __init__(self, spec: str, text_field: str, *, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle_buffer: int = 10_000, skip_first: int = 0, held_out: Iterable[bytes] = ()):
        """skip_first: rows held out for validation at the stream's head. One process skips them; with several,
        datasets deals a `skip` out among the shares (each would skip about skip_first / world_size rows of its
        own), so each process instead leaves out every row equal to one of `held_out` (the validation documents),
        read as empty rows (positions stay row counts)."""
        try:
            import datasets
            from datasets.distributed import split_dataset_by_node
        except ImportError as e:
            raise DataError(f"{spec}: --stream needs the datasets package (pip install 'learntok[hf]')") from e
        ds: Any = open_hf(spec, whole=False)  # online, never a whole download: that is what streaming avoids
        if not isinstance(ds, datasets.IterableDataset):
            ds = ds.to_iterable_dataset()
        self._held_out: set[bytes] = set()
        if world_size > 1:
            ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
            self._held_out = {_digest(doc) for doc in held_out if doc} if skip_first else set()
        elif skip_first:  # one process: the validation rows are exactly the first skip_first
            ds = ds.skip(skip_first)
        self.spec, self.text_field, self.seed, self.shuffle_buffer = spec, text_field, seed, shuffle_buffer
        self._ds = ds

    def documents(self, epoch: int = 0, skip: int = 0) -> Iterator[bytes]:
        """Pass `epoch` over the share in its shuffled order, from row `skip` on; empty and held-out rows are
        yielded too (as b"") so that row counts stay positions."""
        ds = self._ds
        if self.shuffle_buffer > 1:
            ds = ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
            ds.set_epoch(epoch)
        # skip by reading: datasets applies an IterableDataset's skip below split_dataset_by_node's split, so
        # ds.skip(k) on a share would skip k rows of the whole stream, not of the share
        for row in itertools.islice(ds, skip, None):
            if self.text_field not in row:
                raise DataError(f"{self.spec}: no column {self.text_field!r} (columns: {', '.join(row)})")
            doc = _text_bytes(row[self.text_field], self.spec, self.text_field)
            yield b"" if self._held_out and doc and _digest(doc) in self._held_out else doc

    def sample(self, max_bytes: int) -> list[bytes]:
        """The first non-empty documents of the first pass, up to max_bytes (for a strategy's `prepare`)."""
        out, n = [], 0
        for doc in self.documents():
            if doc:
                out.append(doc[: max_bytes - n])
                n += len(out[-1])
            if n >= max_bytes:
                break
        return out


class StreamBatches:
    """Batches of windows packed from a DocumentStream, with BatchIterator's interface (`next_with_flags`,
    `state_dict`, `load_state_dict`)."""

    def __init__(self, stream: DocumentStream, seq_len: int, batch_size: int, pack: bool = True,
                 annotate: Callable[[bytes], np.ndarray] | None = None):
        self.stream, self.seq_len, self.batch_size, self.pack, self.annotate = stream, seq_len, batch_size, pack, \
            annotate
        self.epoch, self.rows, self.offset = 0, 0, 0  # rows fully consumed; bytes consumed of the next row
        self._docs: Iterator[bytes] | None = None
        self._current: tuple[np.ndarray, np.ndarray | None] | None = None
        self._used = False  # whether this pass gave any bytes to a window

    def _next_row(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The next row as ids (with its EOS when packing) and flags; starts a new pass at the end."""
        while True:
            if self._docs is None:
                self._docs, self._whole_pass = self.stream.documents(self.epoch, self.rows), self.rows == 0
            doc = next(self._docs, None)
            if doc == b"":  # an empty (or held-out) row: a position, no bytes, no EOS (as a prepared corpus)
                self.rows += 1
                continue
            if doc is not None:
                ids = np.frombuffer(doc, dtype=np.uint8).astype(np.int64)
                flags = None if self.annotate is None else np.asarray(self.annotate(doc), dtype=bool)
                if self.pack:
                    ids = np.append(ids, EOS)
                    flags = None if flags is None else np.append(flags, True)
                return ids, flags
            if not self._used and self._whole_pass:  # a whole pass without a usable row (a resumed one: a part)
                raise DataError(f"{self.stream.spec}: the stream has no documents"
                                + (f" of at least {self.seq_len} bytes (--no-pack)" if not self.pack else ""))
            self.epoch, self.rows, self._docs, self._used = self.epoch + 1, 0, None, False

    def _window(self) -> tuple[np.ndarray, np.ndarray]:
        L, ids, flags = self.seq_len, np.empty(self.seq_len, np.int64), np.ones(self.seq_len, dtype=bool)
        filled = 0
        while filled < L:
            if self._current is None:
                self._current = self._next_row()
            row, row_flags = self._current
            if not self.pack and len(row) < L:
                self._current, self.rows = None, self.rows + 1  # too short: skipped (the paper's rule)
                continue
            self._used = True
            n = min(L - filled, len(row) - self.offset)
            ids[filled:filled + n] = row[self.offset:self.offset + n]
            if row_flags is not None:
                flags[filled:filled + n] = row_flags[self.offset:self.offset + n]
            filled, self.offset = filled + n, self.offset + n
            if self.offset == len(row) or not self.pack:
                self._current, self.rows, self.offset = None, self.rows + 1, 0
        return ids, flags

    def next_with_flags(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(ids (batch_size, seq_len + 1) BOS first, flags of the same shape or None)."""
        ids = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int64)
        flags = np.ones((self.batch_size, self.seq_len + 1), dtype=bool)
        ids[:, 0] = BOS
        for r in range(self.batch_size):
            ids[r, 1:], flags[r, 1:] = self._window()
        return torch.from_numpy(ids), None if self.annotate is None else torch.from_numpy(flags)

    def next_batch(self) -> torch.Tensor:
        return self.next_with_flags()[0]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "rows": self.rows, "offset": self.offset, "stream": 1}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if d.get("stream") != 1:
            raise ValueError(f"data iterator state {d} is not a stream's (the run trained on another kind of data)")
        self.epoch, self.rows, self.offset = int(d["epoch"]), int(d["rows"]), int(d["offset"])
        self._docs, self._current = None, None


def open_stream(cfg, *, rank: int, world_size: int, seed: int) -> tuple[DocumentStream, list[bytes]]:
    """(this process's training stream, validation documents) of a `--stream` data config: validation is
    --val-data read into memory, or else the stream's first rows up to --val-bytes, which training then skips."""
    if not cfg.source.startswith("hf:"):
        raise DataError(f"--stream reads Hugging Face datasets (hf:NAME...); for {cfg.source!r} use `learntok "
                        "prepare` (memory-mapped shards) or train without --stream")
    skip, val = 0, []
    if cfg.val_data is not None:
        from learntok.data.splits import validation_data  # a prepared corpus's val split, or any source

        val = list(validation_data(cfg))
    else:
        n = 0
        for doc in DocumentStream(cfg.source, cfg.text_field, shuffle_buffer=0).documents():
            skip += 1
            if doc:
                val.append(doc)
                n += len(doc) + 1
            if n >= cfg.val_bytes:
                break
    stream = DocumentStream(cfg.source, cfg.text_field, rank=rank, world_size=world_size, seed=seed,
                            shuffle_buffer=cfg.shuffle_buffer, skip_first=skip, held_out=val if skip else ())
    return stream, val


def _digest(doc: bytes) -> bytes:
    return hashlib.blake2b(doc, digest_size=16).digest()
