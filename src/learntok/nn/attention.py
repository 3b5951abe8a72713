"""Attention kernels behind one function, `attend`.

Two masks are needed: byte-level causal sliding window (byte i sees bytes i-window+1 .. i) and token-level
full causal attention. Three backends:

- eager: scores are materialised, so Gemma-2 attention-logit soft-capping is possible. Sliding-window
  attention is *blocked*: queries are cut into blocks of S >= window bytes and each block attends only to
  its own and the previous key block, so memory grows with T * 2S, not T^2.
- sdpa: `torch.nn.functional.scaled_dot_product_attention` with the same blocked layout (or is_causal for
  tokens). It cannot soft-cap, so it is only used when the cap is off.
- flex: FlexAttention (`torch.nn.attention.flex_attention`): the soft-cap is a score modification and the
  causal / sliding-window structure a block mask, so one fused kernel (under torch.compile: Triton on CUDA, C++
  on CPU) computes the Gemma-2 attention without materialising the scores and skips the key blocks outside
  the window. The compiled kernel is cached per shape. `auto` picks it on CUDA when the cap is on.

`reference_attention` is the dense O(T^2) version both are tested against.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

from learntok.nn import shape_cache


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


@shape_cache()
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
    if backend == "sdpa":  # blocks folded into the head dimension: the fused kernels take 4-D inputs only
        out = F.scaled_dot_product_attention(*(t.flatten(1, 2) for t in (qb, kb, vb)),
                                             attn_mask=mask.repeat(H, 1, 1)).view(B, H, n, blk, dh)
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


@shape_cache()
def _flex_block_mask(T: int, window: int | None, device: torch.device, block: tuple[int, int] | None = None):
    """The block mask of causal (window=None) or causal sliding-window attention over T positions (cached: it
    depends only on the shape, and building it costs a pass over the blocks), in PyTorch's default 128 x 128
    blocks or (query, key) `block` (bench/bench_flex_blocks.py)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return create_block_mask(causal if window is None else sliding, None, None, T, T, device=device,
                             **({} if block is None else {"BLOCK_SIZE": block}))


@shape_cache(maxsize=8)
def _softcap_mod(cap: float):
    """score_mod applying c * tanh(s / c) to the scaled score (one function per cap, so compiled kernels are
    reused)."""
    def mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return mod


FLEX_COMPILE = True
"""Run FlexAttention through torch.compile (the fused kernel). False uses its unfused eager path, which
materialises the scores: a reference for tests that should not pay for compilation."""


FLEX_RECOMPILE_LIMIT = 64
"""Kernels the uncompiled model's flex wrapper may build: one per (length bucket, mask, grad mode, batch size,
dtype). Past dynamo's default limit of 8 it would fall back to the unfused path, which materialises T x T
scores (slow, and out of memory at T = 4096)."""


@functools.cache
def _flex_compiled():
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, FLEX_RECOMPILE_LIMIT)
    return torch.compile(flex_attention, dynamic=False)


FLEX_CPU_TRAINING = ("--attn-backend flex cannot train on CPU: PyTorch's FlexAttention has no backward pass "
                     "there (it evaluates and generates); use --attn-backend auto or eager")


_FLEX_CPU_BACKWARD = False
"""Set by `flex_backward_on_cpu` (checks and estimates only)."""


@contextlib.contextmanager
def flex_backward_on_cpu():
    """Let FlexAttention take gradients on CPU tensors, for checks of the CUDA configuration that never run its
    (missing) fused CPU backward kernel: fake tensors (bench/estimate_memory.py: shapes and memory only) and
    AOTAutograd with an eager backend, which runs FlexAttention's dense reference implementation forwards and
    backwards. Lifts learntok's own refusal and PyTorch's front-end device check while active; training
    proper never uses it."""
    global _FLEX_CPU_BACKWARD
    import torch.nn.attention.flex_attention as fa

    saved = _FLEX_CPU_BACKWARD, fa._validate_device
    _FLEX_CPU_BACKWARD, fa._validate_device = True, lambda *args, **kwargs: None
    try:
        yield
    finally:
        _FLEX_CPU_BACKWARD, fa._validate_device = saved


FLEX_BUCKET = 128
"""Sequence lengths are padded to a multiple of this (FlexAttention's block size) before the kernel: the token
level's length changes with every batch's boundaries, and a compiled kernel per exact length would recompile
past torch.compile's cache limit and fall back to the unfused path. Padding sits after every real position, so
the causal mask hides it; its outputs are dropped."""


def flex_attention(q, k, v, window: int | None, cap: float) -> torch.Tensor:
    """Causal (sliding-window) soft-capped attention by FlexAttention. q, k, v: (B,H,T,dh) -> (B,H,T,dh).
    Forward and backward on CUDA; forward only on CPU (a PyTorch limitation)."""
    from torch.nn.attention.flex_attention import flex_attention as flex_eager

    if q.device.type == "cpu" and not _FLEX_CPU_BACKWARD and any(t.requires_grad for t in (q, k, v)):
        raise ValueError(FLEX_CPU_TRAINING)

    T = q.shape[-2]
    pad = (-T) % FLEX_BUCKET
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    mask = _flex_block_mask(T + pad, window, q.device)
    score_mod = _softcap_mod(float(cap)) if cap > 0 else None
    # Inside a compiled model dynamo traces flex_attention itself; outside, the compiled wrapper is the kernel.
    fn = _flex_compiled() if FLEX_COMPILE and not torch.compiler.is_compiling() else flex_eager
    return fn(q, k, v, score_mod=score_mod, block_mask=mask)[..., :T, :]


def resolve_backend(backend: str, cap: float, device: torch.device) -> str:
    """`auto`: flex on CUDA (fused, with the soft-cap), sdpa on CPU without a cap, else eager."""
    if backend != "auto":
        return backend
    if device.type == "cuda":
        return "flex"
    return "sdpa" if cap == 0 else "eager"


def attend(q, k, v, *, window: int | None, cap: float, backend: str) -> torch.Tensor:
    """Dispatch: window=None is full causal attention, else causal sliding-window attention. `backend`:
    eager, sdpa, flex or auto (resolved on q's device)."""
    backend = resolve_backend(backend, cap, q.device)
    if backend == "flex":
        return flex_attention(q, k, v, window, cap)
    if backend == "sdpa" and cap > 0:
        raise ValueError("the sdpa attention backend cannot soft-cap attention logits; set --attn-softcap 0 "
                         "or --attn-backend eager or flex")
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
