"""`flat`: no downsampling. Every byte is a token, so the token-level layers run over every byte with full causal
attention and the model is a plain byte-level transformer (windowed first and last layers, full-attention
middle): the baseline every tokenizer-free paper compares against. Token outputs replace the byte states (the
middle layers' residual stream already carries them), rather than being added to them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learntok.boundaries.base import BoundaryConfig, BoundaryOutput, BoundaryStrategy
from learntok.boundaries.pooling import Tokens


@dataclass(frozen=True, kw_only=True)
class FlatConfig(BoundaryConfig):
    """Options of `--boundaries flat` (none: every byte is a token)."""

    boundaries: str = "flat"


class FlatBoundaries(BoundaryStrategy):
    config = FlatConfig
    learns_by = "prescribed"
    own_pooling = True
    has_step = True

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        mask = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
        return BoundaryOutput(mask=mask, probs=mask.float())

    def downsample(self, x: torch.Tensor, out: BoundaryOutput, size: int | None = None) -> Tokens:
        B, T, _ = x.shape  # every byte is a token: T slots, static already
        pos = torch.arange(T, device=x.device).expand(B, T)
        return Tokens(x=x, pos=pos, count=torch.full((B,), T, device=x.device), index=pos)

    def upsample(self, y_tok, x, tokens, out):
        return y_tok

    def step(self, x_t, ids_t, t, state):
        a = torch.ones(ids_t.shape, dtype=torch.bool, device=ids_t.device)
        return a, a.float()

    def step_token_output(self, y_t, a_t, p_t, last, state):
        return y_t

    def step_upsample(self, x_t, last):
        return last
