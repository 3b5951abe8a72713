"""How stable learned boundaries are, and how they spread: the statistics users of learned segmenters now expect.

- shift: read each text again without its first d bytes (d in SHIFTS) and compare the boundaries of the bytes
  both readings share (all but the shifted reading's forced first byte): flip rate (share of those bytes whose
  decision changes) and the F1 of one reading's boundaries against the other's;
- precision: the same comparison between the float32 model and a bfloat16 copy, and an int8 copy (weight-only
  int8 of every nn.Linear, per output channel, simulated in float32);
- chunks: bytes per token (mean, coefficient of variation) and agreement with SpaceByte's whitespace rule.

Stability is measured with greedy boundaries (a_t = [p_t > 0.5]): sampled boundaries would flip with the noise
itself, whatever the model. A flip rate of 0 means the decision never depends on where the text starts (beyond
the context the shifted reading lacks) or on the weights' precision.
"""

from __future__ import annotations

import copy
import statistics

import torch

from learntok.data import head_documents
from learntok.draw import draw_texts
from learntok.evaluation.stats import prf

SHIFTS = (1, 2, 3, 5, 8)
"""Bytes dropped from each text's start for the shift comparison."""


def _compare(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """Flip rate and F1 of boolean flag pairs (reference, other) over their positions."""
    flips = n = tp = fp = fn = 0
    for ref, other in pairs:
        flips += int((ref != other).sum())
        n += ref.numel()
        tp += int((ref & other).sum())
        fp += int((~ref & other).sum())
        fn += int((ref & ~other).sum())
    return {"flip_rate": flips / max(n, 1), "f1": prf(tp, fp, fn)["f1"], "positions": n}


def _flags(model, texts: list[bytes], window: int, level: int = 1) -> list[torch.Tensor]:
    return [m for _, m in draw_texts(model, texts, window, greedy=True, level=level)]


def _variant(model, kind: str):
    """A copy of `model` in bfloat16, or with int8 weight-only linear layers: each nn.Linear weight rounded to
    127 levels per output channel (symmetric, scale max|w| / 127), computed in float32 (what int8 weight-only
    kernels compute, without depending on one)."""
    model = copy.deepcopy(model).eval()
    if kind == "bf16":
        return model.to(torch.bfloat16)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                w = mod.weight
                scale = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
                w.copy_((w / scale).round().clamp(-127, 127) * scale)
    return model


def stability(model, texts: list[bytes], window: int, *, shifts=SHIFTS, max_bytes: int = 65_536,
              level: int = 1) -> dict:
    """Boundary flips under shifted text and lower precision (greedy boundaries) on up to `max_bytes` of texts; at
    `level` 2 a two-level model's super-token boundaries."""
    kept = [t for t in head_documents(texts, max_bytes) if len(t) > max(shifts) + 1]
    base = _flags(model, kept, window, level)
    per_shift = {}
    for d in shifts:
        moved = _flags(model, [t[d:] for t in kept], window, level)
        per_shift[d] = _compare([(b[d + 1:], m[1:]) for b, m in zip(base, moved)])
    out = {"mode": "greedy", "bytes": sum(len(t) for t in kept), "shifts": list(shifts),
           "shift": {"flip_rate": statistics.mean(r["flip_rate"] for r in per_shift.values()),
                     "f1": statistics.mean(r["f1"] for r in per_shift.values()),
                     "per_shift": {str(d): r for d, r in per_shift.items()}}}
    for kind in ("bf16", "int8"):
        try:
            other = _flags(_variant(model, kind), kept, window, level)
        except (RuntimeError, NotImplementedError, TypeError) as e:  # e.g. a kernel without bfloat16 on a device
            out[kind] = {"error": str(e).splitlines()[0][:200]}
            continue
        out[kind] = _compare([(b[1:], o[1:]) for b, o in zip(base, other)])
    return out


def chunk_stats(lengths: list[int], boundaries: list[list[bool]], texts: list[bytes]) -> dict:
    """Bytes per token (mean, sd, coefficient of variation) over all tokens, and precision / recall / F1 of the
    boundaries against SpaceByte's whitespace rule on the texts' bytes (first bytes excluded: always a boundary)."""
    from learntok.boundaries.whitespace import spacebyte_boundaries

    mean = statistics.mean(lengths) if lengths else float("nan")
    sd = statistics.pstdev(lengths) if lengths else float("nan")
    tp = fp = fn = 0
    for flags, data in zip(boundaries, texts):
        if len(data) < 2:
            continue
        ref = spacebyte_boundaries(torch.tensor([list(data)]))[0, 1:]
        got = torch.tensor(flags[1:])
        tp += int((ref & got).sum())
        fp += int((~ref & got).sum())
        fn += int((ref & ~got).sum())
    agree = prf(tp, fp, fn)
    return {"tokens": len(lengths), "bytes_per_token": mean, "bytes_per_token_sd": sd,
            "bytes_per_token_cv": sd / mean if lengths and mean else float("nan"),
            "whitespace_precision": agree["precision"], "whitespace_recall": agree["recall"],
            "whitespace_f1": agree["f1"]}


def _num(x: float | None, spec: str) -> str:
    """A number, or n/a for nan (None once eval.json has stored it: JSON has no nan)."""
    return "n/a" if x is None or x != x else format(x, spec)


def format_stability(st: dict) -> str:
    """A few lines for a stability result."""
    def pair(r: dict) -> str:
        if "error" in r:
            return f"n/a ({r['error']})"
        return f"flip rate {_num(r['flip_rate'], '.4f')}, F1 {_num(r['f1'], '.3f')}"  # F1 nan: no boundaries

    return "\n".join([f"boundary stability (greedy boundaries, first {st['bytes']:,} bytes)",
                      f"  text shifted by {'/'.join(map(str, st['shifts']))} bytes: {pair(st['shift'])}",
                      f"  bfloat16 weights:  {pair(st['bf16'])}",
                      f"  int8 weights:      {pair(st['int8'])}"])
