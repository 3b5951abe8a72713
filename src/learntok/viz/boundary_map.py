"""Boundary maps of a model: run it over a text (or a run's validation data) and record p_t and a_t per byte.

Strategies with `annotate` (BPE guidance) get the prescribed flags the data pipeline would attach. Boundaries
are drawn the evaluation way (learntok.draw): one sample with a fixed seed, as validation draws them, or greedily
(u_t = 0.5, a_t = [p_t > 0.5]).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from learntok.draw import EVAL_SEED, draw_text, eval_forward, eval_generator
from learntok.viz.cells import BoundaryMap


def run_model(model, ids: torch.Tensor, flags: torch.Tensor | None = None, *, seed: int = EVAL_SEED,
              greedy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(probs, mask) of one input row ids (T,) (BOS first), drawn the evaluation way (learntok.draw), as numpy
    arrays (T,). flags (T,): prescribed boundaries for strategies with `annotate`."""
    dev = next(model.parameters()).device
    prescribed = None if flags is None else flags.to(dev).bool().unsqueeze(0)  # (1,T)
    out = eval_forward(model, ids.to(dev).unsqueeze(0), generator=eval_generator(dev, seed), greedy=greedy,
                       prescribed=prescribed).boundaries
    return out.probs[0].float().cpu().numpy(), out.mask[0].cpu().numpy()


def describe_mode(model, seed: int, greedy: bool, level: int = 1) -> str:
    """Caption of how the boundaries of a map were drawn."""
    strategy = model.bcfg.boundaries
    how = {"score_function": "p = policy probability", "straight_through": "p = soft boundary probability",
           "prescribed": "prescribed boundaries (p = 0/1)", "random": "random boundaries"}[model.boundary.learns_by]
    draw = "greedy (a = [p > 0.5])" if greedy else f"sampled, seed {seed}"
    if level == 2:
        return f"{strategy}, second level: super-tokens over tokens, {how} at each token's first byte; {draw}"
    return f"{strategy}: {how}; boundaries {draw}"


def compute_map(model, data: bytes, *, window: int, seed: int = EVAL_SEED, greedy: bool = False,
                level: int = 1) -> BoundaryMap:
    """The boundary map of `data` under `model`, drawn as learntok.draw.draw_text draws it: texts longer than
    `window` bytes (use seq_len - 1, the input length the model trained on) are read in overlapping windows, each
    fed as BOS + a quarter window of context + its new bytes, one generator (seeded once) drawing them in turn.
    level 2: a two-level model's super-token boundaries (p: the second level's at each token's first byte, 0 at
    bytes that start no token)."""
    if not data:
        raise ValueError("nothing to show: the text is empty")
    probs, mask = draw_text(model, data, window, seed=seed, greedy=greedy, level=level)
    return BoundaryMap(list(data), probs.numpy(), mask.numpy(), describe_mode(model, seed, greedy, level))


def sequence_map(model, seq: torch.Tensor, flags: torch.Tensor | None = None, seed: int = EVAL_SEED,
                 n_bytes: int | None = None, label: str = "") -> BoundaryMap:
    """The map of one held-out row seq (seq_len + 1,) (BOS first, as in a validation batch; EOS separators kept
    and shown as ␄) with its prescribed flags or None, drawn as evaluate() draws: the model reads seq[:-1]."""
    ids = seq[:-1] if len(seq) > 1 else seq  # (T,) the model's input
    p, m = run_model(model, ids, None if flags is None else flags[:len(ids)], seed=seed)
    k = len(ids) - 1 if n_bytes is None else min(n_bytes, len(ids) - 1)
    return BoundaryMap(ids[1:k + 1].tolist(), p[1:k + 1], m[1:k + 1], label or describe_mode(model, seed, False))


def validation_maps(cfg, model, n: int = 3, n_bytes: int = 600, seed: int = EVAL_SEED) -> list[BoundaryMap]:
    """Boundary maps of `n` validation sequences of a run (its data config), evenly spaced over the split, drawn
    as validation draws them (packed sequences, prescribed flags, fixed seed). Raises DataError / OSError if the
    data is not available."""
    from learntok.data import ByteSequences, load_splits

    _, val_docs = load_splits(cfg.data)
    seqs = ByteSequences(val_docs, cfg.data.seq_len, pack=cfg.data.pack, name="validation data",
                         annotate=model.boundary.annotator)
    maps = []
    for i in np.linspace(0, len(seqs) - 1, num=min(n, len(seqs))).round().astype(int).tolist():
        flags = seqs.flag_batch([i])
        label = f"validation sequence {i} of {len(seqs)}; " + describe_mode(model, seed, False)
        maps.append(sequence_map(model, torch.from_numpy(seqs.batch([i])[0]),
                                 None if flags is None else torch.from_numpy(flags[0]), seed, n_bytes, label))
    return maps


def preview_sample(model, seq: torch.Tensor, flags: torch.Tensor | None = None, width: int = 100,
                   seed: int = EVAL_SEED, color: bool = True) -> str:
    """One line (render.preview_map) of a held-out row under validation's boundary draw, for the training log."""
    from learntok.viz.render import preview_map

    return preview_map(sequence_map(model, seq, flags, seed=seed, n_bytes=4 * width), width=width, color=color)


def preview_hook(model, row, step: int | None, with_image: bool):
    """The evaluation hook of `learntok train` (learntok.train.EvalHook): at an evaluation a one-line coloured
    preview of the held-out row, at the end of training (step None) its first 400 bytes with the boundaries
    marked; either way a boundary-map image for TensorBoard / W&B if asked."""
    from learntok.train.validation import Preview
    from learntok.viz.render import preview_map, render_ansi

    ids, flags = row
    bmap = sequence_map(model, ids, flags, n_bytes=400, label="final" if step is None else f"step {step}")
    if step is None:
        text = render_ansi(bmap, color=None)
    else:  # the same draw as preview_sample (its first 80 characters lie within these 400 bytes)
        text = preview_map(bmap, width=80, color=sys.stderr.isatty())
    image = None
    if with_image:
        from learntok.viz.mpl import map_image

        image = map_image(bmap, width=80, max_chars=800)  # (H,W,3): the map above, not a second forward pass
    return Preview(text, image)
