"""The boundary-strategy interface and the default select / distribute-add pooling (method.md §1).

A strategy sees the encoder output X (B,T,D) and the byte ids, and returns a `BoundaryOutput`. The U-Net
never branches on which strategy it runs: it calls `propose`, then `downsample` / `upsample` (which a
strategy may override with its own pooling), then `losses` with the per-byte log-likelihoods.

Convention: a_t = 1 means a token ends at byte t and byte t's state represents it; a_0 = 1 always, so every
byte has a token at or before it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn as nn

LearnsBy = Literal["score_function", "straight_through", "prescribed", "random"]


@dataclass
class BoundaryOutput:
    """What a strategy proposes for a batch."""

    mask: torch.Tensor
    """(B,T) bool: a_t, the drawn boundaries; mask[:, 0] is True."""
    probs: torch.Tensor
    """(B,T) float: the boundary probability each a_t was drawn with (1/0 for prescribed strategies)."""
    logits: torch.Tensor | None = None
    """(B,T) boundary logits as used for sampling (with grad), for strategies that have them."""
    log_prob: torch.Tensor | None = None
    """(B,T) log pi(a_t | ...) with grad, for score-function strategies; None otherwise."""
    free: torch.Tensor | None = None
    """(B,T) bool: positions whose boundary was actually decided (not forced); None = all."""
    stats: dict[str, float] = field(default_factory=dict)
    """Scalars to log (e.g. sampling iterations)."""


@dataclass
class Tokens:
    """The token level of one batch: selected states and their byte positions."""

    x: torch.Tensor
    """(B,M,D) token states; rows at or beyond `count` are padding (they sit after every real token, so
    causal attention keeps them from influencing real ones)."""
    pos: torch.Tensor
    """(B,M) long: byte index of each token's boundary (its RoPE position, method.md §8.9)."""
    count: torch.Tensor
    """(B,) long: real tokens per sequence."""
    index: torch.Tensor
    """(B,T) long: c(t) = (sum_{k<=t} a_k) - 1, the token each byte reads back from."""


def select(x: torch.Tensor, mask: torch.Tensor) -> Tokens:
    """Downsample by selection (eq. 7-9): token j is X at the j-th boundary. x (B,T,D), mask (B,T) bool."""
    B, T, D = x.shape
    index = mask.long().cumsum(1) - 1  # (B,T) c(t); int64 so counts stay exact (bf16 would not)
    count = index[:, -1] + 1  # (B,)
    M = int(count.max())
    # Scatter each boundary's byte index to its token slot; non-boundaries go to a spill column M.
    slot = torch.where(mask, index, torch.full_like(index, M))  # (B,T)
    pos = torch.zeros(B, M + 1, dtype=torch.long, device=x.device)
    pos.scatter_(1, slot, torch.arange(T, device=x.device).expand(B, T))
    pos = pos[:, :M]  # (B,M)
    xt = x.gather(1, pos.unsqueeze(-1).expand(B, M, D))  # (B,M,D)
    return Tokens(x=xt, pos=pos, count=count, index=index)


def mean_pool(x: torch.Tensor, mask: torch.Tensor, ste: torch.Tensor) -> Tokens:
    """Mean pooling (Nawrot et al.; `dynamic`, and `--pooling mean` for every select-based strategy).
    Token j = mean of X over group j (the bytes after boundary j-1 up to boundary j), with Nawrot's
    gradient path to the straight-through boundaries `ste` (B,T). x (B,T,D), mask (B,T) bool.

    Hard indices come from the int64 count of `mask`; the weights from the fp32 cumsum of `ste` (a bf16
    cumsum of ones is exact only to 256). Padding rows (j >= count) are zero."""
    B, T, D = x.shape
    tok = select(x, mask)  # pos (RoPE positions), count, index c(t); tok.x is replaced below
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


def running_group_mean(x_t: torch.Tensor, a_t: torch.Tensor, state: dict) -> torch.Tensor:
    """Generation with mean pooling: the mean of x over the group that ends at this byte (the bytes after the
    previous boundary up to t). `state` holds "sum" (None at first) and "n" (B,1); reset where a_t."""
    state["sum"] = x_t if state.get("sum") is None else state["sum"] + x_t
    state["n"] = state.get("n", 0) + torch.ones_like(x_t[:, :1])
    mean = state["sum"] / state["n"]  # (B,D)
    state["sum"] = torch.where(a_t[:, None], torch.zeros_like(mean), state["sum"])
    state["n"] = torch.where(a_t[:, None], torch.zeros_like(state["n"]), state["n"])
    return mean


def distribute_add(y_tok: torch.Tensor, x: torch.Tensor, tokens: Tokens) -> torch.Tensor:
    """Upsample (method.md §1.5): byte t gets X_t + Y'_{c(t)}. y_tok (B,M,D), x (B,T,D) -> (B,T,D)."""
    B, T, D = x.shape
    return x + y_tok.gather(1, tokens.index.unsqueeze(-1).expand(B, T, D))


def override_boundaries(out: BoundaryOutput, mask: torch.Tensor) -> BoundaryOutput:
    """`out` with its drawn boundaries replaced by `mask` (B,T) bool (a_0 stays 1): for diagnostics that ask
    what the model does with other boundaries. A straight-through `ste` is replaced by the hard mask too."""
    mask = mask.to(device=out.mask.device, dtype=torch.bool).clone()
    mask[:, 0] = True
    changes = {"mask": mask}
    if getattr(out, "ste", None) is not None:
        changes["ste"] = mask.float()
    return dataclasses.replace(out, **changes)


def forced_positions(B: int, T: int, force_last: bool, device) -> torch.Tensor:
    """(B,T) bool: a_0 = 1 always (BOS), and the last byte with --force-last (the authors' code)."""
    forced = torch.zeros(B, T, dtype=torch.bool, device=device)
    forced[:, 0] = True
    if force_last:
        forced[:, -1] = True
    return forced


def boundary_uniforms(noise: torch.Tensor | None, shape: tuple[int, int], *, greedy: bool,
                      generator: torch.Generator | None, device) -> torch.Tensor:
    """The uniforms u of a Bernoulli draw a_t = [u_t < p_t]: the injected `noise` if given; 0.5 everywhere for
    greedy evaluation (a_t = [p_t > 0.5]); else fresh draws from `generator`."""
    if noise is not None:
        return noise
    if greedy:
        return torch.full(shape, 0.5, device=device)
    return torch.rand(shape, generator=generator, device=device)


class BoundaryStrategy(nn.Module):
    """Base class. Subclasses set the class attributes and implement `propose`."""

    learns_by: ClassVar[LearnsBy]
    """How the boundaries are learned."""
    exactly_causal: ClassVar[bool] = True
    """False for strategies whose boundaries peek ahead by construction (BPE guidance: a token's extent depends
    on bytes after it); they report a measured leak rate instead of passing the exact no-lookahead test."""
    mean_pooling: bool = False
    """Set by `build_strategy` from `--pooling mean`: the default downsample averages each token's bytes
    (`mean_pool`, no gradient to the boundaries) instead of selecting the boundary byte's state."""
    uses_rewards: ClassVar[bool] = False
    """True if `losses` needs per-byte log-likelihoods of the main and early-exit heads (the early-exit
    head then trains the encoder too; otherwise it is a detached probe)."""

    def prepare(self, train_docs: list[bytes], val_docs: list[bytes], run_dir: Path | None) -> None:
        """Called once before training or evaluation with the raw documents, e.g. to train a BPE tokenizer
        (saved in, and on resume reloaded from, `run_dir`). Default: nothing."""

    def artifacts(self) -> list[str]:
        """Files/directories (relative to the run directory) that `prepare` saved and that a shared model needs
        (e.g. the BPE tokenizer); `save_pretrained` copies them. Default: none."""
        return []

    def annotate(self, doc: bytes) -> np.ndarray | None:
        """Per-byte prescribed boundary flags of one document (bool, len(doc)), computed once per document by
        the data pipeline and cached beside the bytes; they reach `propose` as `prescribed`. None (the
        default) means the strategy needs no such flags."""
        return None

    def propose(self, x: torch.Tensor, ids: torch.Tensor, *, noise: torch.Tensor | None,
                generator: torch.Generator | None, prescribed: torch.Tensor | None = None) -> BoundaryOutput:
        """Draw boundaries. x (B,T,D) encoder output, ids (B,T) byte ids; noise (B,T) uniforms in [0,1)
        if given (tests inject it), else drawn from `generator`; prescribed (B,T) bool flags from `annotate`."""
        raise NotImplementedError

    has_step: ClassVar[bool] = False
    """True if `init_step_state` / `step` are implemented (cached generation); otherwise generation
    recomputes the full forward pass for every byte."""

    def init_step_state(self, batch: int, noise: torch.Tensor) -> dict:
        """State for `step`; noise (B, T_total) holds the boundary uniforms of every future position."""
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, ids_t: torch.Tensor, t: int, state: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Boundary at byte position t from the encoder state x_t (B,D) and byte ids_t (B,), updating `state`:
        returns (a_t (B,) bool, p_t (B,)). Must equal `propose` on the full sequence with the same noise."""
        raise NotImplementedError

    def step_token_input(self, x_t: torch.Tensor, a_t: torch.Tensor, state: dict) -> torch.Tensor:
        """Generation: the token-level input for rows where a token ends at this byte (select: x_t (B,D); mean
        pooling: the running mean of the group ending here)."""
        return running_group_mean(x_t, a_t, state) if self.mean_pooling else x_t

    def step_token_output(self, y_t: torch.Tensor, a_t: torch.Tensor, p_t: torch.Tensor, last: torch.Tensor,
                          state: dict) -> torch.Tensor:
        """Generation: what later bytes add back (distribute-add: the newest token's output y_t where a_t)."""
        return torch.where(a_t[:, None], y_t, last)

    def downsample(self, x: torch.Tensor, out: BoundaryOutput) -> Tokens:
        if self.mean_pooling:
            return mean_pool(x, out.mask, out.mask.float())
        return select(x, out.mask)

    def upsample(self, y_tok: torch.Tensor, x: torch.Tensor, tokens: Tokens, out: BoundaryOutput) -> torch.Tensor:
        return distribute_add(y_tok, x, tokens)

    def losses(self, out: BoundaryOutput, logp: torch.Tensor | None, logp_early: torch.Tensor | None,
               valid: torch.Tensor, reduce=None) -> dict[str, torch.Tensor]:
        """Auxiliary loss terms (already weighted, summed into the total) and statistics.

        logp, logp_early: (B,T) log-likelihood of each position's target under the main and early-exit
        heads (detached). valid: (B,T) bool, False at padding. reduce: maps this micro-batch's
        `BatchStatistics` sums to the global batch's (learntok.distributed); None = this batch is global."""
        return {}

    def matrix_params(self) -> int:
        """Parameters of this strategy's matrices, for the 6 x params FLOPs accounting (per byte)."""
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2)
