"""Hashed embeddings of byte strings: the Byte Latent Transformer's byte n-grams, and the chunks a model's boundaries
cut (one embedding per token's content).

Hashed n-gram embeddings (the Byte Latent Transformer's byte n-grams): for each size n, the n ids that end at
position t are hashed into one of `table` rows of an embedding table of their own, and the rows of all sizes are
summed. A model adds the sum to its id embeddings, so a byte-level model gets a vocabulary of frequent n-grams that
costs a lookup, not FLOPs. Position t reads ids t-n+1 .. t only (ids before a row's start count as one value of
their own): causal by construction.

    h_n(t) = fold(h <- (h * P + x_{t-j} + 1) mod M, j = 0 .. n-1, h_0 = n),  row = h_n(t) mod table
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

P = 1_000_003
M = 2**31 - 1
BEFORE = 1023
"""The id of positions before a row's start (above every byte and special id)."""


def ngram_rows(ids: torch.Tensor, n: int, table: int, before: int = BEFORE) -> torch.Tensor:
    """(B,T) ids -> (B,T) table rows of the n-grams ending at each position (`before`: the id of positions before
    a row's start, above every real id)."""
    return _fold(_shifted(ids, n, before), n) % table


def _shifted(ids: torch.Tensor, n: int, before: int) -> list[torch.Tensor]:
    """[x_{t-j} + 1 for j = 0 .. n-1]: the row shifted right by j, `before` where it runs off the start."""
    T = ids.shape[1]
    return [F.pad(ids.long(), (j, 0), value=before)[:, :T] + 1 for j in range(n)]


def _fold(shifted: list[torch.Tensor], n: int) -> torch.Tensor:
    """h_n(t) of the module docstring (before the table's modulus) from `_shifted`'s first n tensors."""
    h = torch.full_like(shifted[0], n)
    for x in shifted[:n]:
        h = (h * P + x) % M
    return h


class HashedNgrams(nn.Module):
    """Embedding tables of hashed n-grams, one block of `table` rows per size in one embedding (one lookup and one
    gradient for all sizes); zero at initialisation (the model starts as the one without them)."""

    def __init__(self, dim: int, sizes: tuple[int, ...], table: int, before: int = BEFORE):
        super().__init__()
        if not sizes or min(sizes) < 2 or table < 1:
            raise ValueError(f"n-gram sizes must be >= 2 and the table >= 1 row, got {sizes}, {table}")
        self.sizes, self.table, self.before = tuple(sizes), table, before
        self.emb = nn.Embedding(len(self.sizes) * table, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.emb.weight)

    @property
    def span(self) -> int:
        """The most ids one position reads (the largest n)."""
        return max(self.sizes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B,T) ids -> (B,T,D) the summed n-gram embeddings."""
        shifted = _shifted(ids, self.span, self.before)  # shared by every size
        rows = torch.stack([i * self.table + _fold(shifted, n) % self.table for i, n in enumerate(self.sizes)], -1)
        # one fused gather-and-sum (no (B,T,sizes,D) tensor in forward or backward); sparse as the table is
        out = F.embedding_bag(rows.reshape(-1, len(self.sizes)), self.emb.weight, mode="sum", sparse=self.emb.sparse)
        return out.view(*ids.shape, -1)

    def last(self, recent: torch.Tensor) -> torch.Tensor:
        """(B,L) the newest ids of each row (recent[:, -1] the current one; BEFORE where a row has fewer) ->
        (B,D) the embeddings at the newest position: what `forward` gives there (cached generation)."""
        return self(recent)[:, -1]


@functools.lru_cache(maxsize=16)
def _powers(T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P^k mod M, P^-k mod M) for k = 0 .. T-1, int64 on the CPU (M is prime: P^-1 = P^(M-2))."""
    inv = pow(P, M - 2, M)
    up, down = [1] * T, [1] * T
    for k in range(1, T):
        up[k], down[k] = up[k - 1] * P % M, down[k - 1] * inv % M
    return torch.tensor(up), torch.tensor(down)


def chunk_hashes(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,T) ids and boundary flags -> (B,T) int64: at each position t, the hash of the bytes from the one after the
    last boundary before t up to t (the chunk that a boundary at t would close):
    sum_{k=s..t} (x_k + 1) P^(t-k) mod M. At a boundary byte b_j it is the hash of token j's bytes; it reads no
    byte after t. Vectorised with prefix sums: Q_t = sum_{k<=t} (x_k + 1) P^-k, hash = (Q_t - Q_{s-1}) P^t."""
    B, T = ids.shape
    up, down = (p.to(ids.device) for p in _powers(T))
    q = (((ids.long() + 1) * down) % M).cumsum(1) % M  # (B,T) Q_t
    t = torch.arange(T, device=ids.device).expand(B, T)
    prev = torch.where(mask, t, torch.full_like(t, -1))
    prev = F.pad(prev[:, :-1], (1, 0), value=-1).cummax(1).values  # (B,T) the last boundary strictly before t
    q_before = torch.where(prev >= 0, q.gather(1, prev.clamp(min=0)), torch.zeros_like(q))  # Q_{s-1}
    return (q - q_before) % M * up % M


class ChunkEmbedding(nn.Module):
    """A hashed embedding of each token's byte content, added to the token level's input: a learned vocabulary of
    the chunks the boundaries cut, at the cost of a lookup. Zero at initialisation. A token closed at byte b_j reads
    bytes <= b_j only."""

    def __init__(self, dim: int, table: int):
        super().__init__()
        if table < 1:
            raise ValueError(f"the chunk table needs at least 1 row, got {table}")
        self.table = table
        self.emb = nn.Embedding(table, dim)
        nn.init.zeros_(self.emb.weight)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids, mask (B,T); pos (B,M) the byte index of each token slot's boundary -> (B,M,D)."""
        return self.emb(chunk_hashes(ids, mask).gather(1, pos) % self.table)

    @staticmethod
    def extend(running: torch.Tensor, ids_t: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
        """The running chunk hash after byte ids_t (B,): restarted where `reset` (the previous byte closed a
        token), else extended (cached generation; `chunk_hashes` at this position)."""
        x = ids_t.long() + 1
        return torch.where(reset, x % M, (running * P + x) % M)


def hashed_tables(model: nn.Module) -> list[nn.Embedding]:
    """The hashed embedding tables of a model (n-grams and chunks). Each step reads a few of their rows, so
    training can give them sparse gradients and a lazy optimizer (learntok.train.schedule.make_optimizer): their
    cost then follows the rows read, not the table's size. Found by module type, which survives FSDP2's sharding
    (parameter attributes do not)."""
    return [m.emb for m in model.modules() if isinstance(m, (HashedNgrams, ChunkEmbedding))]
