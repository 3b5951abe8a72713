"""Batched byte generation on top of `ByteLM.step`, which caches both levels of the U-Net:

    byte level   sliding-window KV cache per encoder/decoder layer: a ring buffer of `byte_window` slots
    boundary     the strategy's `step()` state (the learned policy keeps its last w boundaries)
    token level  KV cache per mid layer that grows only in rows where a boundary is drawn; each row keeps
                 the output of its latest token, which every following byte adds back (distribute-add); a
                 two-level model (model.hier) runs its token levels again at each new token instead

One step feeds one byte per row (all rows share the byte position, since every row starts at BOS; a row whose
prompt is longer keeps feeding prompt bytes while shorter ones already sample). A test checks that the cached
steps give the full forward pass's logits and boundaries with the same boundary noise. Strategies without a
`step()` fall back to recomputing the full forward pass every byte (correct, slower).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Callable

import torch

from learntok.draw import evaluates_greedily
from learntok.vocab import BOS, EOS


def prescribed_flags(model, ids: torch.Tensor) -> torch.Tensor | None:
    """Flags of strategies that annotate text (BPE guidance), recomputed on each row's bytes so far: for the
    newest byte this is the shifted rule applied to the prefix, the only causal choice while generating."""
    annotate = model.boundary.annotator
    if annotate is None:
        return None
    rows = []
    for row in ids.tolist():
        flags = [True] * len(row)  # BOS and special ids separate documents: always boundaries
        start = 1
        for i in range(1, len(row) + 1):
            if i == len(row) or row[i] >= 256:
                if i > start:
                    flags[start:i] = [bool(f) for f in annotate(bytes(row[start:i]))]
                start = i + 1
        rows.append(flags)
    return torch.tensor(rows, device=ids.device)


def _sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """Next byte ids (B,) from logits (B,V) over bytes and EOS."""
    if not torch.isfinite(logits[:, :EOS + 1]).all():
        raise ValueError("the model's next-byte scores are not finite (NaN or inf): its weights have diverged "
                         "(see the run's metrics for non-finite losses)")
    logits = logits.clone()
    logits[:, EOS + 1:] = float("-inf")
    logits[:, BOS] = float("-inf")
    if temperature <= 0:
        return logits.argmax(-1)
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature  # the largest 0: no overflow at a tiny T
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_l, idx = logits.sort(-1, descending=True)
        cum = sorted_l.softmax(-1).cumsum(-1)
        drop = cum - sorted_l.softmax(-1) > top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(1, idx, sorted_l.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]


MAX_NEW_BYTES = 1 << 24
"""The longest continuation `generate` draws (16.8 MB a row; its noise is drawn up front, 4 bytes a position)."""


@torch.no_grad()
def generate(model, prompts: list[str | bytes], max_new_bytes: int = 200, *, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop: list[bytes] | None = None,
             use_cache: bool = True, on_text: Callable[[int, str], None] | None = None) -> list[bytes]:
    """Continue each prompt by up to max_new_bytes bytes. Stops a row at EOS or when its output ends with one
    of `stop`. `on_text(row, text)` streams decoded text as it is produced (UTF-8 decoded incrementally, so a
    multi-byte character is emitted whole). Boundary noise and sampling are drawn from `seed` position by position:
    a larger max_new_bytes continues the same text, row by row."""
    if getattr(model, "predicts_tokens", False):
        raise ValueError("generation is for byte-level models; the BPE baseline (--arch token) predicts tokens")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if stop and not all(stop):
        raise ValueError("a stop string is empty: it would end every row after one byte")
    if not 0 <= max_new_bytes <= MAX_NEW_BYTES:
        raise ValueError(f"max_new_bytes must be in [0, {MAX_NEW_BYTES:,}] (the boundary noise of every position is "
                         f"drawn up front), got {max_new_bytes:,}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    model.eval()
    data = [p.encode() if isinstance(p, str) else bytes(p) for p in prompts]
    B, dev = len(data), next(model.parameters()).device
    total = max(len(p) for p in data) + max_new_bytes
    # position-major and the same on any device: a row's noise at a position does not depend on max_new_bytes
    noise = torch.rand(total, B, generator=torch.Generator().manual_seed(seed)).T.contiguous().to(dev)
    gen = torch.Generator(dev).manual_seed(seed)  # next-byte draws, on the logits' device
    if evaluates_greedily(model):
        noise.fill_(0.5)  # a_t = [p_t > 0.5]
    state = model.init_state(B, noise) if use_cache and model.boundary.has_step else None
    seqs = [[BOS, *p] for p in data]
    out: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(B)]
    for t in range(total):
        if state is not None:
            logits, _ = model.step(torch.tensor([s[t] for s in seqs], device=dev), state)
        else:
            ids = torch.tensor([s[: t + 1] for s in seqs], device=dev)
            logits = model(ids, noise=noise[:, : t + 1], prescribed=prescribed_flags(model, ids)).logits[:, -1]
        nxt = _sample(logits.float(), temperature, top_k, top_p, gen).tolist()
        for b in range(B):
            if len(seqs[b]) > t + 1:  # still feeding the prompt
                continue
            if done[b] or len(out[b]) >= max_new_bytes:
                seqs[b].append(EOS)
                done[b] = True
                continue
            seqs[b].append(nxt[b])
            if nxt[b] == EOS:
                done[b] = True
                continue
            out[b].append(nxt[b])
            if on_text is not None:
                text = decoders[b].decode(bytes([nxt[b]]))
                if text:
                    on_text(b, text)
            if stop and any(bytes(out[b]).endswith(s) for s in stop):
                done[b] = True
        if all(done):
            break
    if on_text is not None:  # a row that ended inside a multi-byte character: flush it as U+FFFD
        for b, dec in enumerate(decoders):
            if text := dec.decode(b"", final=True):
                on_text(b, text)
    return [bytes(o) for o in out]
