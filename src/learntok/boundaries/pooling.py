"""Down- and upsampling between bytes and tokens (paper §2.1, eq. 7-9).

Convention: a_t = 1 means a token ends at byte t and byte t's state represents it; a_0 = 1 always, so every
byte has a token at or before it. Byte t reads back token c(t) = (sum_{k<=t} a_k) - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tokens:
    """The token level of one batch: token states and their byte positions."""

    x: torch.Tensor
    """(B,M,D) token states; rows at or beyond `count` are padding (they sit after every real token, so
    causal attention keeps them from influencing real ones)."""
    pos: torch.Tensor
    """(B,M) long: byte index of each token's boundary (its RoPE position)."""
    count: torch.Tensor
    """(B,) long: real tokens per sequence."""
    index: torch.Tensor
    """(B,T) long: c(t) = (sum_{k<=t} a_k) - 1, the token each byte reads back from."""


def select(x: torch.Tensor, mask: torch.Tensor, size: int | None = None) -> Tokens:
    """Downsample by selection (eq. 7-9): token j is X at the j-th boundary. x (B,T,D), mask (B,T) bool.
    size: token slots M (at least every row's count; the static shape of --token-bucket); None = the largest
    count, read from the device."""
    B, T, D = x.shape
    index = mask.long().cumsum(1) - 1  # (B,T) c(t); int64 so counts stay exact (bf16 would not)
    count = index[:, -1] + 1  # (B,)
    M = int(count.max()) if size is None else size
    # Scatter each boundary's byte index to its token slot; non-boundaries go to a spill column M.
    slot = torch.where(mask, index, torch.full_like(index, M))  # (B,T)
    pos = torch.zeros(B, M + 1, dtype=torch.long, device=x.device)
    pos.scatter_(1, slot, torch.arange(T, device=x.device).expand(B, T))
    pos = pos[:, :M]  # (B,M)
    xt = x.gather(1, pos.unsqueeze(-1).expand(B, M, D))  # (B,M,D)
    return Tokens(x=xt, pos=pos, count=count, index=index)


def mean_pool(x: torch.Tensor, mask: torch.Tensor, ste: torch.Tensor, size: int | None = None) -> Tokens:
    """Mean pooling (Nawrot et al.; `dynamic`, and `--pooling mean` for every select-based strategy).
    Token j = mean of X over group j (the bytes after boundary j-1 up to boundary j), with Nawrot's
    gradient path to the straight-through boundaries `ste` (B,T). x (B,T,D), mask (B,T) bool.

    Hard indices come from the int64 count of `mask`; the weights from the fp32 cumsum of `ste` (a bf16
    cumsum of ones is exact only to 256). Padding rows (j >= count) are zero. size: as `select`'s."""
    B, T, D = x.shape
    tok = select(x, mask, size)  # pos (RoPE positions), count, index c(t); tok.x is replaced below
    M = tok.pos.shape[1]
    group = tok.index + 1 - mask.long()  # (B,T) g(t) = sum_{i<t} a_i: a boundary ends its group
    done = group < tok.count.unsqueeze(1)  # (B,T) False for the unfinished group after the last boundary
    rows = torch.arange(B, device=x.device).unsqueeze(1) * (M + 1)  # (B,1) row offset; slot M is a spill
    slot = (torch.where(done, group, M) + rows).flatten()  # (B*T,)
    b = ste.float()
    g = b.cumsum(1) - b  # (B,T) soft exclusive count, equals `group` in the forward pass
    w = 1.0 + (g - g.detach())  # (B,T) Nawrot's entry 1 - (s - g_t) at s = g_t: forward 1, d/db~_i = 1 (i < t)
    num = x.new_zeros(B * (M + 1), D, dtype=torch.float32).index_add(
        0, slot, (w.unsqueeze(-1) * x.float()).flatten(0, 1))  # (B*(M+1),D) group sums
    den = w.new_zeros(B * (M + 1)).index_add(0, slot, w.flatten())  # (B*(M+1),) group sizes
    den = torch.where(den > 0, den, torch.ones_like(den))  # padding rows: 0 / 1 (where keeps den's gradient)
    pooled = (num / den.unsqueeze(-1)).view(B, M + 1, D)[:, :M]  # (B,M,D)
    return Tokens(x=pooled.to(x.dtype), pos=tok.pos, count=tok.count, index=tok.index)


def distribute_add(y_tok: torch.Tensor, x: torch.Tensor, tokens: Tokens) -> torch.Tensor:
    """Upsample (paper §2.1): byte t gets X_t + Y'_{c(t)}. y_tok (B,M,D), x (B,T,D) -> (B,T,D)."""
    B, T, D = x.shape
    return x + y_tok.gather(1, tokens.index.unsqueeze(-1).expand(B, T, D))


@dataclass
class RunningMean:
    """Generation with mean pooling: the mean of x over the group that ends at the current byte (the bytes
    after the previous boundary up to it), reset after every boundary."""

    total: torch.Tensor | None = None
    """(B,D) fp32 sum of the open group's states (None before the first byte)."""
    n: torch.Tensor | None = None
    """(B,1) fp32 bytes in the open group."""

    def update(self, x_t: torch.Tensor, a_t: torch.Tensor) -> torch.Tensor:
        """Add byte state x_t (B,D); return the group mean (B,D, x_t's dtype); close the group where a_t (B,) is
        True. Sums and counts are fp32, as `mean_pool`'s (a bf16 count stops at 256)."""
        x = x_t.float()
        self.total = x if self.total is None else self.total + x
        self.n = (0 if self.n is None else self.n) + torch.ones_like(x[:, :1])
        mean = self.total / self.n  # (B,D)
        self.total = torch.where(a_t[:, None], torch.zeros_like(mean), self.total)
        self.n = torch.where(a_t[:, None], torch.zeros_like(self.n), self.n)
        return mean.to(x_t.dtype)
