"""Validation during training, and the hook through which the command line shows what the model does.

`validate` scores the first `--val-bytes` of the validation split with the learntok.bpb accounting (byte targets
only) for both heads, with the boundaries drawn the way evaluation draws them (learntok.draw): the strategy in
eval mode (the learned policy without its soft-cap), one sample from a fixed seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from learntok.bpb import BitsPerByte
from learntok.draw import EVAL_SEED, eval_forward, eval_generator

Row = tuple[torch.Tensor, "torch.Tensor | None"]
"""One held-out sequence: ids (seq_len + 1,) BOS first, and its prescribed flags or None."""


@dataclass
class Preview:
    """What an evaluation hook shows: a line (or, at the end of training, a paragraph) of text with the
    boundaries marked, and optionally an (H,W,3) uint8 boundary-map image for TensorBoard."""

    text: str
    image: np.ndarray | None = None


EvalHook = Callable[[torch.nn.Module, Row, "int | None", bool], Preview]
"""hook(model, row, step, with_image) -> Preview; step is None for the final sample. `learntok.viz.preview_hook`
is the command line's."""


def validate(model, batches: list[tuple[torch.Tensor, torch.Tensor | None]], device: torch.device,
             seed: int = EVAL_SEED) -> dict[str, float]:
    """val/bpb, val/early_bpb (both over byte targets only) and val/rate (boundaries per position) on
    `batches` of (ids with the next target appended (B,T+1), prescribed flags or None)."""
    gen = eval_generator(device, seed)
    main, early = BitsPerByte(), BitsPerByte()
    n_bound = n_pos = 0
    for batch, flags in batches:
        batch = batch.to(device)
        ids, targets = batch[:, :-1], batch[:, 1:]
        out = eval_forward(model, ids, targets, generator=gen,
                           prescribed=None if flags is None else flags[:, :-1].to(device))
        main.add(out.nll, targets)
        early.add(out.nll_early, targets)
        n_bound += int(out.boundaries.mask.sum())
        n_pos += out.boundaries.mask.numel()
    return {"val/bpb": main.bpb, "val/rate": n_bound / max(n_pos, 1), "val/early_bpb": early.bpb}


def first_row(batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> Row:
    """The fixed held-out snippet shown during training: the first validation sequence."""
    ids, flags = batches[0]
    return ids[0], None if flags is None else flags[0]
