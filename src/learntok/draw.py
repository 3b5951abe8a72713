"""Boundaries drawn the evaluation way: the strategy in eval mode (the learned policy without its soft-cap) and one
sample from a generator seeded with EVAL_SEED, or greedily (u_t = 0.5, so a_t = [p_t > 0.5]).

Validation, `learntok eval`'s diagnostics, `show`, `report`, `segment` and the model card all draw here, so one
text gets the same boundaries everywhere. (Held-out and task BPB key their noise per text instead, with the same
seed: learntok.evaluation.bpb.) torch is imported on first use, so that the command line's option defaults can
read EVAL_SEED without loading it.
"""

from __future__ import annotations

from learntok.vocab import BOS

EVAL_SEED = 1234
"""The seed of every evaluation-time boundary draw."""


def eval_generator(device, seed: int = EVAL_SEED):
    """A torch.Generator on `device` seeded with `seed`: one per evaluation, drawn from batch after batch."""
    import torch

    return torch.Generator(device).manual_seed(seed)


def eval_forward(model, ids, targets=None, *, generator=None, greedy: bool = False, prescribed=None, **kw):
    """`model(ids, targets, ...)` without gradient in eval mode, its boundaries one sample from `generator` (default:
    a fresh eval_generator on ids' device) or greedy; the model's training flag is restored. ids (B,T) BOS first;
    prescribed (B,T) the strategy's flags or None; `kw` go to the model (e.g. boundaries=)."""
    import torch

    was_training = model.training
    model.eval()
    if greedy:
        kw["noise"] = torch.full(ids.shape, 0.5, device=ids.device)  # (B,T)
    else:
        kw["generator"] = generator if generator is not None else eval_generator(ids.device)
    try:
        with torch.no_grad():
            return model(ids, targets, prescribed=prescribed, **kw)
    finally:
        model.train(was_training)


def draw_text(model, data: bytes, window: int, *, seed: int = EVAL_SEED, greedy: bool = False,
              context: int | None = None):
    """(probs, mask), each (len(data),) on the CPU, of `data` read in windows of `window` bytes, each fed as BOS +
    its bytes. Every window after the first re-reads the `context` bytes before its new ones (default window // 4)
    and keeps only the new bytes' boundaries, so a window start is not a forced boundary (with context=0 it is:
    consecutive windows, context restarting at each). One generator, seeded once, draws the windows in turn; a
    strategy that annotates gets the flags of the whole text."""
    import numpy as np
    import torch

    if window < 1:
        raise ValueError(f"window must be at least 1 byte, got {window}")
    context = window // 4 if context is None else context
    if not 0 <= context < window:
        raise ValueError(f"context must be in [0, window), got {context} for window {window}")
    annotate = model.boundary.annotator
    flags_all = None if annotate is None else np.asarray(annotate(data), dtype=bool)
    dev = next(model.parameters()).device
    gen = eval_generator(dev, seed)
    probs, mask = [torch.zeros(0)], [torch.zeros(0, dtype=torch.bool)]
    s = 0
    while s < len(data):
        lead = 0 if s == 0 else context  # bytes re-read before the new ones
        end = min(len(data), s - lead + window)
        ids = torch.tensor([[BOS, *data[s - lead:end]]], device=dev)  # (1,T)
        flags = None
        if flags_all is not None:
            flags = torch.from_numpy(np.concatenate([[True], flags_all[s - lead:end]]))[None].to(dev)  # (1,T)
        out = eval_forward(model, ids, generator=gen, greedy=greedy, prescribed=flags).boundaries
        probs.append(out.probs[0, 1 + lead:].float().cpu())  # byte i of the window is at position i + 1
        mask.append(out.mask[0, 1 + lead:].cpu())
        s = end
    return torch.cat(probs), torch.cat(mask)
