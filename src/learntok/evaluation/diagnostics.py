"""Do the boundaries matter? Held-out diagnostics that feed a trained model other boundaries.

For the same held-out batches, bits per byte with:
- own:     the model's evaluation boundaries (as in validation BPB);
- rate-0:  no boundary but the forced BOS one: the token stack then carries no information about the text;
- random:  iid boundaries at the model's own held-out rate: the same amount of token information, placed
           without regard to content.

sensitivity = BPB(rate-0) - BPB(own): how much the model relies on its token stack at all (the authors' code at
CPU scale: 0.007). placement = BPB(random) - BPB(own): what the model gains from *where* its boundaries go (for
uniform-random itself it is ~0 by construction). Agreement with SpaceByte's word transitions (precision,
recall, F1 and the F1 of independent boundaries at the same rate) is over byte positions after BOS;
`wordstart_f1` scores the same boundaries against SpaceByte's moved one byte later (a token ending at a word's
first byte instead of at the space before it), a one-byte offset the exact F1 counts as all wrong.
"""

from __future__ import annotations

import torch

from learntok.boundaries.whitespace import spacebyte_boundaries
from learntok.bpb import BitsPerByte
from learntok.draw import EVAL_SEED, eval_forward, eval_generator
from learntok.evaluation.stats import prf
from learntok.vocab import IGNORE


@torch.no_grad()
def boundary_diagnostics(model, batches: list[tuple[torch.Tensor, torch.Tensor | None]], device: torch.device | str,
                         seed: int = EVAL_SEED) -> dict:
    """BPB with own / rate-0 / random boundaries and SpaceByte agreement on `batches` of (ids with the next
    target appended (B,T+1), prescribed flags or None), as `learntok.data.val_batches_with_flags` gives."""
    gens = {k: eval_generator(device, seed) for k in ("own", "rate0", "random")}
    rnd = torch.Generator("cpu").manual_seed(seed + 1)
    bpb = {"own": BitsPerByte(), "rate0": BitsPerByte(), "random": BitsPerByte()}
    n_pos = n_bound = 0
    exact = [0, 0, 0]  # tp, fp, fn against SpaceByte's boundaries
    shifted = [0, 0, 0]  # the same against SpaceByte's boundaries moved one byte later (word starts)
    n_text = n_ref = n_mark = 0
    for batch, flags in batches:
        batch = batch.to(device)
        ids, targets = batch[:, :-1], batch[:, 1:]
        prescribed = None if flags is None else flags[:, :-1].to(device)
        out = eval_forward(model, ids, targets, generator=gens["own"], prescribed=prescribed)
        mask = out.boundaries.mask
        bpb["own"].add(out.nll, targets)
        valid = targets != IGNORE
        valid[:, 0] = False  # a_0 is forced
        rate = float(mask[valid].float().mean()) if valid.any() else 0.0
        rate0 = torch.zeros_like(mask)
        bpb["rate0"].add(eval_forward(model, ids, targets, generator=gens["rate0"], prescribed=prescribed,
                                      boundaries=rate0).nll, targets)
        random = (torch.rand(mask.shape, generator=rnd) < rate).to(mask.device)
        bpb["random"].add(eval_forward(model, ids, targets, generator=gens["random"], prescribed=prescribed,
                                       boundaries=random).nll, targets)
        n_pos += int(valid.sum())
        n_bound += int(mask[valid].sum())
        ref = spacebyte_boundaries(ids)
        text = valid & (ids < 256)
        ref1 = torch.nn.functional.pad(ref[:, :-1], (1, 0), value=False) & (ids < 256)
        for counts, r in ((exact, ref), (shifted, ref1)):
            for i, c in enumerate(_confusion(mask, r, text)):
                counts[i] += c
        n_text += int(text.sum())
        n_ref += int((ref & text).sum())
        n_mark += int((mask & text).sum())
    n_bytes = bpb["own"].bytes
    bpb = {k: v.bpb for k, v in bpb.items()}
    agree = prf(*exact)
    r = n_bound / max(n_pos, 1)
    q, r_text = n_ref / max(n_text, 1), n_mark / max(n_text, 1)  # rates on text bytes, for the chance F1
    return {
        "bpb": bpb["own"], "bpb_rate0": bpb["rate0"], "bpb_random": bpb["random"],
        "sensitivity": bpb["rate0"] - bpb["own"], "placement": bpb["random"] - bpb["own"],
        "rate": r, "spacebyte_rate": q, "spacebyte_precision": agree["precision"],
        "spacebyte_recall": agree["recall"], "spacebyte_f1": agree["f1"],
        "spacebyte_f1_chance": 2 * q * r_text / (q + r_text) if q + r_text > 0 else float("nan"),
        "wordstart_f1": prf(*shifted)["f1"], "bytes": n_bytes,
    }


def _confusion(pred: torch.Tensor, ref: torch.Tensor, where: torch.Tensor) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives) of boolean `pred` against `ref` at `where`."""
    return (int((pred & ref & where).sum()), int((pred & ~ref & where).sum()), int((~pred & ref & where).sum()))
