"""Hashed n-gram embeddings (the Byte Latent Transformer's byte n-grams): for each size n, the n ids that end at
position t are hashed into one of `table` rows of an embedding table of their own, and the rows of all sizes are
summed. A model adds the sum to its id embeddings, so a byte-level model gets a vocabulary of frequent n-grams that
costs a lookup, not FLOPs. Position t reads ids t-n+1 .. t only (ids before a row's start count as one value of
their own): causal by construction.

    h_n(t) = fold(h <- (h * P + x_{t-j} + 1) mod M, j = 0 .. n-1, h_0 = n),  row = h_n(t) mod table
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

P = 1_000_003
M = 2**31 - 1
BEFORE = 1023
"""The id of positions before a row's start (above every byte and special id)."""


def ngram_rows(ids: torch.Tensor, n: int, table: int) -> torch.Tensor:
    """(B,T) ids -> (B,T) table rows of the n-grams ending at each position."""
    h = torch.full_like(ids, n, dtype=torch.long)
    T = ids.shape[1]
    for j in range(n):  # x_{t-j}: the row shifted right by j, BEFORE where it runs off the start
        x = F.pad(ids.long(), (j, 0), value=BEFORE)[:, :T]
        h = (h * P + x + 1) % M
    return h % table


class HashedNgrams(nn.Module):
    """Embedding tables of hashed n-grams, one per size; zero at initialisation (the model starts as the one without
    them)."""

    def __init__(self, dim: int, sizes: tuple[int, ...], table: int):
        super().__init__()
        if not sizes or min(sizes) < 2 or table < 1:
            raise ValueError(f"n-gram sizes must be >= 2 and the table >= 1 row, got {sizes}, {table}")
        self.sizes, self.table = tuple(sizes), table
        self.tables = nn.ModuleList(nn.Embedding(table, dim) for _ in self.sizes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for emb in self.tables:
            nn.init.zeros_(emb.weight)

    @property
    def span(self) -> int:
        """The most ids one position reads (the largest n)."""
        return max(self.sizes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B,T) ids -> (B,T,D) the summed n-gram embeddings."""
        out = None
        for n, emb in zip(self.sizes, self.tables):
            e = emb(ngram_rows(ids, n, self.table))
            out = e if out is None else out + e
        return out

    def last(self, recent: torch.Tensor) -> torch.Tensor:
        """(B,L) the newest ids of each row (recent[:, -1] the current one; BEFORE where a row has fewer) ->
        (B,D) the embeddings at the newest position: what `forward` gives there (cached generation)."""
        return self(recent)[:, -1]
