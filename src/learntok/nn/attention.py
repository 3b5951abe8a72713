"""Attention kernels behind one function, `attend`.

Two masks are needed: byte-level causal sliding window (byte i sees bytes i-window+1 .. i) and token-level
full causal attention. Two backends:

- eager: scores are materialised, so Gemma-2 attention-logit soft-capping is possible. Sliding-window
  attention is *blocked*: queries are cut into blocks of S >= window bytes and each block attends only to
  its own and the previous key block, so memory grows with T * 2S, not T^2.
- sdpa: `torch.nn.functional.scaled_dot_product_attention` with the same blocked layout (or is_causal for
  tokens). It cannot soft-cap, so it is only used when the cap is off.

`reference_attention` is the dense O(T^2) version both are tested against.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """c * tanh(x / c) (Gemma 2); identity when cap <= 0."""
    return cap * torch.tanh(x / cap) if cap > 0 else x


def scaled_scores(q: torch.Tensor, k: torch.Tensor, cap: float) -> torch.Tensor:
    """softcap(q k^T / sqrt(dh)) with the scale folded into the cap's division (one fewer full-size op)."""
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-1, -2)
    return cap * torch.tanh(s * (scale / cap)) if cap > 0 else s * scale


def block_size(window: int) -> int:
    """Query/key block length for blocked sliding-window attention: at least the window, at least 32
    (small blocks make many tiny matmuls)."""
    return max(window, 32)


@functools.lru_cache(maxsize=64)
def _window_mask(n_blocks: int, blk: int, window: int, device: torch.device) -> torch.Tensor:
    """(n_blocks, blk, 2*blk) bool: query r of block n may see key s of [block n-1, block n]."""
    q = torch.arange(blk, device=device)[:, None] + blk  # query position relative to the start of block n-1
    k = torch.arange(2 * blk, device=device)[None, :]
    rel = q - k  # (blk, 2blk) distance query - key
    allowed = (rel >= 0) & (rel < window)
    mask = allowed.expand(n_blocks, blk, 2 * blk).clone()
    mask[0, :, :blk] = False  # block 0 has no previous block
    return mask


def _blocked(x: torch.Tensor, blk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,H,T,dh) with T % blk == 0 -> queries (B,H,n,blk,dh) and keys of blocks [n-1, n] (B,H,n,2blk,dh)."""
    B, H, T, dh = x.shape
    n = T // blk
    xb = x.view(B, H, n, blk, dh)
    prev = F.pad(xb, (0, 0, 0, 0, 1, 0))[:, :, :-1]  # (B,H,n,blk,dh), block -1 is zeros (masked out)
    return xb, torch.cat([prev, xb], dim=3)


def sliding_window_attention(q, k, v, window: int, cap: float, backend: str) -> torch.Tensor:
    """Causal sliding-window attention. q, k, v: (B,H,T,dh) -> (B,H,T,dh)."""
    B, H, T, dh = q.shape
    blk = block_size(window)
    pad = (-T) % blk
    if pad:  # trailing padding: padded keys come after every real query, so causality hides them
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    n = (T + pad) // blk
    qb, _ = _blocked(q, blk)  # (B,H,n,blk,dh)
    _, kb = _blocked(k, blk)  # (B,H,n,2blk,dh)
    _, vb = _blocked(v, blk)
    mask = _window_mask(n, blk, window, q.device)  # (n,blk,2blk)
    if backend == "sdpa":
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    else:
        scores = scaled_scores(qb, kb, cap).masked_fill(~mask, float("-inf"))  # (B,H,n,blk,2blk)
        out = torch.softmax(scores, dim=-1) @ vb  # (B,H,n,blk,dh)
    return out.reshape(B, H, n * blk, dh)[:, :, :T]


def causal_attention(q, k, v, cap: float, backend: str) -> torch.Tensor:
    """Full causal attention. q, k, v: (B,H,M,dh) -> (B,H,M,dh)."""
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    M = q.shape[-2]
    causal = torch.ones(M, M, dtype=torch.bool, device=q.device).tril()
    scores = scaled_scores(q, k, cap).masked_fill(~causal, float("-inf"))  # (B,H,M,M)
    return torch.softmax(scores, dim=-1) @ v


def attend(q, k, v, *, window: int | None, cap: float, backend: str) -> torch.Tensor:
    """Dispatch: window=None is full causal attention, else causal sliding-window attention."""
    if backend == "sdpa" and cap > 0:
        raise ValueError("the sdpa attention backend cannot soft-cap attention logits; set --attn-softcap 0 "
                         "or --attn-backend eager")
    if window is None:
        return causal_attention(q, k, v, cap, backend)
    return sliding_window_attention(q, k, v, window, cap, backend)


def reference_attention(q, k, v, *, window: int | None, cap: float) -> torch.Tensor:
    """Dense O(T^2) masked attention: the readable definition the fast paths are tested against."""
    T, dh = q.shape[-2], q.shape[-1]
    scores = softcap(q @ k.transpose(-1, -2) * dh**-0.5, cap)
    rel = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    allowed = (rel >= 0) if window is None else (rel >= 0) & (rel < window)
    scores = scores.masked_fill(~allowed.to(q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                  cap: float) -> torch.Tensor:
    """One new query per row against cached keys: q (B,H,1,dh), k, v (B,H,S,dh), key_mask (B,S) bool (the slots
    this query may see, itself included) -> (B,H,1,dh). The same soft-capped scores as the full pass."""
    scores = scaled_scores(q, k, cap).masked_fill(~key_mask[:, None, None, :], float("-inf"))  # (B,H,1,S)
    return torch.softmax(scores, dim=-1) @ v
