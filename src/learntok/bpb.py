"""Bits per byte, the one definition used by training, `learntok eval` and the entropy model's trainer.

    BPB = sum of next-byte negative log-likelihoods (nats) / (ln 2 * number of byte targets)

Only real bytes count as targets: not the EOS separators between packed documents, not padding (IGNORE / PAD),
so BPB is comparable across packing, padding and tokenizers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LN2 = math.log(2.0)
"""Nats per bit."""


def byte_targets(targets: torch.Tensor) -> torch.Tensor:
    """(…) bool: which targets are real bytes (0..255), as opposed to EOS, PAD or IGNORE."""
    return (targets >= 0) & (targets < 256)


@dataclass
class BitsPerByte:
    """Accumulates negative log-likelihood over the byte targets of several batches."""

    nats: float = 0.0
    """Summed NLL of byte targets, in nats."""
    bytes: int = 0
    """Number of byte targets."""

    def add(self, nll: torch.Tensor, targets: torch.Tensor) -> None:
        """nll (B,T) per-position NLL in nats, targets (B,T) ids; positions whose target is not a byte are
        skipped."""
        byte = byte_targets(targets)
        self.nats += float(nll[byte].sum())
        self.bytes += int(byte.sum())

    @property
    def bpb(self) -> float:
        return self.nats / (LN2 * max(self.bytes, 1))
