"""Gemma-2-style transformer pieces: RMSNorm, rotary embeddings, GeGLU MLP, attention, Block.

`forward()` processes a whole sequence; `step()` beside it processes one new position per row against a
`KVCache` and gives the same result (tests/test_generate.py). Pure maths, no device code.
Shapes: B batch, T sequence (bytes or tokens), D width, H heads, S cache slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from learntok.nn.attention import attend, attend_cached
from learntok.nn.cache import KVCache


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype, skipping the no-op cast: under torch.compile in torch 2.11 an autograd.Function whose forward
    returned `y.to(y.dtype)` got zero gradients (tests/test_model.py checks the compiled gradients)."""
    return t if t.dtype == dtype else t.to(dtype)


class _RMSNormFn(torch.autograd.Function):
    """y = x * rsqrt(mean(x^2) + eps) * w, computed in fp32 and returned in x's dtype, with a hand-written
    backward that keeps only x (its own dtype: bf16 under bf16-mixed) and the per-row rsqrt. Autograd through
    the plain formula would keep two fp32 copies of x and run about twenty elementwise passes over it in the
    backward; this one runs five (the eager step is memory-bound, and the saved copies were half its
    activation memory). Under torch.compile both trace to the same fused kernels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return _cast(xf * rstd * weight.float(), x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat, gf = x.float() * rstd, grad.float()  # (..., D)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            gw = gf * weight.float()  # dL/dxhat
            # dL/dx = rstd * (gw - xhat * mean(gw * xhat)), the RMS's share removed from the gradient
            dx = _cast((gw - xhat * (gw * xhat).mean(-1, keepdim=True)) * rstd, x.dtype)
        if ctx.needs_input_grad[1]:
            dw = _cast((gf * xhat).flatten(0, -2).sum(0), weight.dtype)
        return dx, dw, None


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and returned in x's dtype (stable under autocast), with the lean
    backward of `_RMSNormFn` (tests/test_model.py checks it against autograd through the formula)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


def rope_tables(pos: torch.Tensor, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for rotary embeddings at integer positions `pos` (T,) or (B,T) -> (..., 1, T, dim/2)
    broadcastable against (B,H,T,dim/2)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32) / dim))
    ang = pos.float()[..., None] * inv_freq  # (..., T, dim/2)
    ang = ang.unsqueeze(-3)  # (..., 1, T, dim/2): a head axis
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x1, x2) = halves of the head dimension. x: (B,H,T,dh)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


@dataclass(frozen=True)
class Packing:
    """Where the N real rows of a padded (B, M) token layout live: flat indices into B*M. The token level uses
    it so norms, projections and MLPs skip the padding (sequences have different token counts)."""

    index: torch.Tensor
    """(N,) long: positions b*M + j of the real tokens, in order."""
    B: int
    M: int

    @staticmethod
    def from_counts(count: torch.Tensor, M: int) -> Packing:
        valid = torch.arange(M, device=count.device)[None, :] < count[:, None]  # (B,M)
        return Packing(valid.flatten().nonzero().squeeze(1), count.shape[0], M)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B,M,...) -> (N,...)."""
        return x.flatten(0, 1)[self.index]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N,...) -> (B,M,...) with zeros at padding."""
        out = x.new_zeros(self.B * self.M, *x.shape[1:]).index_copy(0, self.index, x)
        return out.view(self.B, self.M, *x.shape[1:])


class Attention(nn.Module):
    """Multi-head self-attention with RoPE; `window=None` is full causal, else causal sliding window."""

    def __init__(self, dim: int, n_heads: int, window: int | None, cap: float, backend: str):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"d_model={dim} is not divisible by n_heads={n_heads}")
        self.n_heads, self.window, self.cap, self.backend = n_heads, window, cap, backend
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                packed: Packing | None = None) -> torch.Tensor:
        if packed is not None:
            return self._forward_packed(x, rope, packed)
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # (3,B,H,T,dh)
        q, k = apply_rope(qkv[:2], *rope).unbind(0)  # rotate q and k in one pass
        v = qkv[2]
        y = attend(q, k, v, window=self.window, cap=self.cap, backend=self.backend)  # (B,H,T,dh)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))

    def step(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache, slot: torch.Tensor,
             key_mask: torch.Tensor) -> torch.Tensor:
        """One new position per row: x (B,1,D) -> (B,1,D). Its key and value are written into `cache` at `slot`
        (B,) first; key_mask (B,S) bool names the slots it attends to (itself included)."""
        B, _, D = x.shape
        H = self.n_heads
        qkv = self.qkv(x).view(B, 1, 3, H, D // H).permute(2, 0, 3, 1, 4)  # (3,B,H,1,dh)
        q, k = apply_rope(qkv[:2], *rope).unbind(0)  # (B,H,1,dh) each
        cache.write(slot, k[:, :, 0], qkv[2][:, :, 0])
        y = attend_cached(q, cache.k, cache.v, key_mask, self.cap)  # (B,H,1,dh)
        return self.proj(y.transpose(1, 2).reshape(B, 1, D))

    def _forward_packed(self, x: torch.Tensor, rope, packed: Packing) -> torch.Tensor:
        """x (N,D): the real rows of a padded (B,M) layout. Projections run on the N real rows only; q, k, v
        are scattered into the padded layout just for the attention itself."""
        N, D = x.shape
        H = self.n_heads
        qkv = self.qkv(x).view(N, 3, H, D // H).permute(1, 2, 0, 3)  # (3,H,N,dh)
        qkv = torch.cat([apply_rope(qkv[:2], *rope), qkv[2:]])  # rope tables are (1,N,dh/2)
        pad = qkv.new_zeros(3, H, packed.B * packed.M, D // H).index_copy(2, packed.index, qkv)
        q, k, v = pad.view(3, H, packed.B, packed.M, D // H).transpose(1, 2).unbind(0)  # (B,H,M,dh)
        y = attend(q, k, v, window=self.window, cap=self.cap, backend=self.backend)  # (B,H,M,dh)
        return self.proj(y.transpose(1, 2).reshape(packed.B * packed.M, D)[packed.index])  # (N,D)


def run_block(blk: nn.Module, *args, recompute: bool = False) -> torch.Tensor:
    """blk(*args); with `recompute` (activation checkpointing) its activations are recomputed in the backward
    pass instead of stored: less memory, about one more forward pass of compute."""
    if recompute and torch.is_grad_enabled():
        return checkpoint(blk, *args, use_reentrant=False)
    return blk(*args)


class GeGLU(nn.Module):
    """gelu(x W_g) * (x W_u) W_d, with W_g and W_u fused into one matmul."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class Block(nn.Module):
    """Gemma 2 block: x + post_norm(attn(pre_norm(x))), then the same around the MLP."""

    def __init__(self, dim: int, n_heads: int, mlp_hidden: int, window: int | None, cap: float, backend: str):
        super().__init__()
        self.attn_pre, self.attn_post = RMSNorm(dim), RMSNorm(dim)
        self.mlp_pre, self.mlp_post = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, n_heads, window, cap, backend)
        self.mlp = GeGLU(dim, mlp_hidden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                packed: Packing | None = None) -> torch.Tensor:
        """x (B,T,D), or (N,D) real rows of a padded layout when `packed` is given (token level)."""
        x = x + self.attn_post(self.attn(self.attn_pre(x), rope, packed))
        return x + self.mlp_post(self.mlp(self.mlp_pre(x)))

    def step(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache, slot: torch.Tensor,
             key_mask: torch.Tensor) -> torch.Tensor:
        """`forward` for one new position per row x (B,1,D) against `cache` (see `Attention.step`)."""
        x = x + self.attn_post(self.attn.step(self.attn_pre(x), rope, cache, slot, key_mask))
        return x + self.mlp_post(self.mlp(self.mlp_pre(x)))
