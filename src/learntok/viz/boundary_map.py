"""Boundary maps of a model: run it over a text (or a run's validation data) and record p_t and a_t per byte.

Strategies with `annotate` (BPE guidance) get the prescribed flags the data pipeline would attach. Boundaries
are sampled with a seeded generator as validation samples them, or greedily (u_t = 0.5, a_t = [p_t > 0.5]).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from learntok.viz.cells import BoundaryMap
from learntok.vocab import BOS


def _annotated(model, data: bytes) -> np.ndarray | None:
    """Prescribed flags of the whole text for strategies that need them (e.g. BPE), else None."""
    annotate = model.boundary.annotator
    return None if annotate is None else np.asarray(annotate(data), dtype=bool)


@torch.no_grad()
def run_model(model, ids: torch.Tensor, flags: torch.Tensor | None = None, *, seed: int = 1234,
              greedy: bool = False, generator: torch.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(probs, mask) of one input row ids (T,) (BOS first) in eval mode, as numpy arrays (T,).

    Sampled boundaries use a generator seeded with `seed` (as validation does) unless one is given; greedy feeds
    u_t = 0.5 so that a_t = [p_t > 0.5]. flags (T,): prescribed boundaries for strategies with `annotate`."""
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    ids = ids.to(dev).unsqueeze(0)  # (1,T)
    kw = {}
    if greedy:
        kw["noise"] = torch.full(ids.shape, 0.5, device=dev)  # (1,T)
    else:
        kw["generator"] = generator if generator is not None else torch.Generator(dev).manual_seed(seed)
    if flags is not None:
        kw["prescribed"] = flags.to(dev).bool().unsqueeze(0)  # (1,T)
    try:
        out = model(ids, **kw).boundaries
    finally:
        model.train(was_training)
    return out.probs[0].float().cpu().numpy(), out.mask[0].cpu().numpy()


def describe_mode(model, seed: int, greedy: bool) -> str:
    """Caption of how the boundaries of a map were drawn."""
    strategy = model.bcfg.boundaries
    how = {"score_function": "p = policy probability", "straight_through": "p = soft boundary probability",
           "prescribed": "prescribed boundaries (p = 0/1)", "random": "random boundaries"}[model.boundary.learns_by]
    draw = "greedy (a = [p > 0.5])" if greedy else f"sampled, seed {seed}"
    return f"{strategy}: {how}; boundaries {draw}"


def compute_map(model, data: bytes, *, window: int, seed: int = 1234, greedy: bool = False) -> BoundaryMap:
    """The boundary map of `data` under `model` (eval mode).

    Texts longer than `window` bytes (use seq_len - 1, the input length the model trained on) are cut into
    consecutive windows, each fed as BOS + its bytes: context resets at every window start, as it does at a
    training sequence start. One generator (seeded once) draws the boundaries of all windows in turn."""
    if window < 1:
        raise ValueError(f"window must be at least 1 byte, got {window}")
    if not data:
        raise ValueError("nothing to show: the text is empty")
    flags_all = _annotated(model, data)
    dev = next(model.parameters()).device
    gen = torch.Generator(dev).manual_seed(seed)
    probs, mask = [], []
    for s in range(0, len(data), window):
        chunk = data[s:s + window]
        ids = torch.tensor([BOS, *chunk], dtype=torch.long)  # (T,) BOS first
        flags = None
        if flags_all is not None:
            flags = torch.from_numpy(np.concatenate([[True], flags_all[s:s + window]]))  # (T,)
        p, m = run_model(model, ids, flags, greedy=greedy, generator=gen)
        probs.append(p[1:])  # drop BOS: byte i of the chunk is at position i + 1
        mask.append(m[1:])
    return BoundaryMap(list(data), np.concatenate(probs), np.concatenate(mask), describe_mode(model, seed, greedy))


def sequence_map(model, seq: torch.Tensor, flags: torch.Tensor | None = None, seed: int = 1234,
                 n_bytes: int | None = None, label: str = "") -> BoundaryMap:
    """The map of one held-out row seq (seq_len + 1,) (BOS first, as in a validation batch; EOS separators kept
    and shown as ␄) with its prescribed flags or None, drawn as evaluate() draws: the model reads seq[:-1]."""
    ids = seq[:-1] if len(seq) > 1 else seq  # (T,) the model's input
    p, m = run_model(model, ids, None if flags is None else flags[:len(ids)], seed=seed)
    k = len(ids) - 1 if n_bytes is None else min(n_bytes, len(ids) - 1)
    return BoundaryMap(ids[1:k + 1].tolist(), p[1:k + 1], m[1:k + 1], label or describe_mode(model, seed, False))


def validation_maps(cfg, model, n: int = 3, n_bytes: int = 600, seed: int = 1234) -> list[BoundaryMap]:
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
                   seed: int = 1234, color: bool = True) -> str:
    """One line (render.preview_map) of a held-out row under validation's boundary draw, for the training log."""
    from learntok.viz.render import preview_map

    return preview_map(sequence_map(model, seq, flags, seed=seed, n_bytes=4 * width), width=width, color=color)


def preview_hook(model, row, step: int | None, with_image: bool):
    """The evaluation hook of `learntok train` (learntok.train.EvalHook): at an evaluation a one-line coloured
    preview of the held-out row (plus a boundary-map image for TensorBoard if asked), at the end of training
    (step None) its first 400 bytes with the boundaries marked."""
    from learntok.train.validation import Preview
    from learntok.viz.render import render_ansi

    ids, flags = row
    if step is None:
        return Preview(render_ansi(sequence_map(model, ids, flags, n_bytes=400), color=None))
    text = preview_sample(model, ids, flags, width=80, color=sys.stderr.isatty())
    image = None
    if with_image:
        from learntok.viz.mpl import map_image

        bmap = sequence_map(model, ids, flags, n_bytes=400, label=f"step {step}")
        image = map_image(bmap, width=80, max_chars=800)  # (H,W,3)
    return Preview(text, image)
