"""A typed key/value cache for incremental decoding (`Attention.step`, `Block.step`).

Which slot a new position writes and which slots it may read are decided by the caller: the U-Net's byte
level uses a ring buffer of `byte_window` slots (every row is at the same byte position), its token level a
buffer that grows only in rows where a token ends (see `learntok.model.lm.ByteLM.step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class KVCache:
    """Keys and values of past positions of one attention layer."""

    k: torch.Tensor
    """(B,H,S,dh) rotated keys."""
    v: torch.Tensor
    """(B,H,S,dh) values."""

    @staticmethod
    def empty(batch: int, heads: int, size: int, head_dim: int, device: torch.device | str,
              dtype: torch.dtype = torch.float32) -> KVCache:
        def zeros() -> torch.Tensor:
            return torch.zeros(batch, heads, size, head_dim, device=device, dtype=dtype)

        return KVCache(zeros(), zeros())

    @property
    def size(self) -> int:
        return self.k.shape[2]

    def write(self, slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one position per row: slot (B,) long, k and v (B,H,dh) (cast to the cache's dtype: under bf16
        autocast the projections give bf16 keys for an fp32 model's cache)."""
        rows = torch.arange(k.shape[0], device=k.device)
        self.k[rows, :, slot] = k.to(self.k.dtype)
        self.v[rows, :, slot] = v.to(self.v.dtype)

    def grow(self, extra: int) -> None:
        """Append `extra` empty slots."""
        self.k = F.pad(self.k, (0, 0, 0, extra))
        self.v = F.pad(self.v, (0, 0, 0, extra))
