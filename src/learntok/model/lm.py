"""The autoregressive U-Net byte language model (method.md §1).

    X  = encode(x)                 n_down sliding-window blocks over bytes
    a  ~ strategy(X)               boundaries; a_0 = 1
    X' = downsample(X, a)          select (or the strategy's own pooling)
    Y' = mid(X')                   n_mid full-causal blocks over tokens, RoPE at boundary byte indices
    Y  = upsample(Y', X, a)        X_t + Y'_{c(t)}
    logits = head(decode(Y))       n_up sliding-window blocks; position t predicts x_{t+1}

An early-exit head reads X directly; its log-likelihood is the baseline of the relative reward (§3). For
strategies that do not use rewards it is a detached probe ("how good is the encoder alone").
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from learntok.boundaries import BoundaryOutput, build_strategy
from learntok.boundaries.base import override_boundaries
from learntok.config import BoundaryConfig, ModelConfig
from learntok.model.attention import softcap
from learntok.model.layers import Block, Packing, RMSNorm, rope_tables
from learntok.vocab import IGNORE, VOCAB_SIZE


@dataclass
class ModelOutput:
    logits: torch.Tensor
    """(B,T,V) next-byte logits of the full model."""
    boundaries: BoundaryOutput
    loss: torch.Tensor | None = None
    """Total training loss (L_auto + weighted auxiliary terms), when targets were given."""
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    """Every loss term and statistic, detached where they are statistics."""
    nll: torch.Tensor | None = None
    """(B,T) per-position negative log-likelihood in nats (0 at ignored targets)."""
    n_tokens: torch.Tensor | None = None
    """(B,) real tokens per sequence at the token level."""


class ByteLM(nn.Module):
    def __init__(self, cfg: ModelConfig, bcfg: BoundaryConfig):
        super().__init__()
        self.cfg, self.bcfg = cfg, bcfg
        backend = cfg.attn_backend if cfg.attn_backend != "auto" else ("sdpa" if cfg.attn_softcap == 0 else "eager")
        d, H = cfg.d_model, cfg.n_heads
        if d % H or (d // H) % 2:
            raise ValueError(f"d_model={d} must split into n_heads={H} heads of even size")
        byte_hidden, tok_hidden = round(cfg.byte_mlp_mult * d), round(cfg.token_mlp_mult * d)

        def blocks(n, hidden, window):
            return nn.ModuleList(Block(d, H, hidden, window, cfg.attn_softcap, backend) for _ in range(n))

        self.embed = nn.Embedding(VOCAB_SIZE, d)
        self.down = blocks(cfg.n_down, byte_hidden, cfg.byte_window)
        self.mid = blocks(cfg.n_mid, tok_hidden, None)
        self.up = blocks(cfg.n_up, byte_hidden, cfg.byte_window)
        self.boundary = build_strategy(bcfg, d)
        self.norm_out = RMSNorm(d)
        self.head = nn.Linear(d, VOCAB_SIZE, bias=False)
        self.apply(self._init)
        n_layers = cfg.n_down + cfg.n_mid + cfg.n_up
        for name, p in self.named_parameters():  # residual-output projections: smaller init (GPT-2)
            if name.endswith("attn.proj.weight") or name.endswith("mlp.down.weight"):
                nn.init.normal_(p, std=cfg.init_std / math.sqrt(2 * n_layers))
        # The early-exit head starts as a copy of the output head (method.md §3).
        self.norm_early = copy.deepcopy(self.norm_out)
        self.head_early = copy.deepcopy(self.head)

    def _init(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
        elif isinstance(m, nn.Embedding):
            # Unit-scale byte embeddings: every Gemma-2 block adds a post-normed (unit-RMS) output to the
            # residual stream, so 0.02-scale embeddings would be drowned after one block (Gemma multiplies its
            # embeddings by sqrt(d) for the same reason). Measured: tiny, 300 steps, val BPB 2.60 vs 2.99.
            nn.init.normal_(m.weight, std=1.0)

    # -- pieces --------------------------------------------------------------------------------------------

    def _head(self, norm: nn.Module, head: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return softcap(head(norm(h)).float(), self.cfg.final_softcap)  # (B,T,V) fp32

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Byte embedding and encoder blocks. ids (B,T) -> X (B,T,D)."""
        T = ids.shape[1]
        rope = rope_tables(torch.arange(T, device=ids.device), self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_base)
        x = self.embed(ids)  # (B,T,D)
        for blk in self.down:
            x = blk(x, rope)
        return x

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, *, noise: torch.Tensor | None = None,
                generator: torch.Generator | None = None, prescribed: torch.Tensor | None = None,
                batch_stats=None, boundaries: torch.Tensor | None = None) -> ModelOutput:
        """ids (B,T) input ids (BOS first); targets (B,T) next ids or IGNORE; noise (B,T) boundary uniforms;
        prescribed (B,T) bool boundary flags from the data pipeline (strategies with `annotate`);
        batch_stats: reducer to global-batch statistics for the estimator (learntok.distributed);
        boundaries: (B,T) bool flags that replace the strategy's draw (diagnostics, e.g. boundary sensitivity;
        position 0 is always a boundary)."""
        B, T = ids.shape
        dh = self.cfg.d_model // self.cfg.n_heads
        rope_byte = rope_tables(torch.arange(T, device=ids.device), dh, self.cfg.rope_base)
        x = self.encode(ids)  # (B,T,D)
        out = self.boundary.propose(x, ids, noise=noise, generator=generator, prescribed=prescribed)
        if boundaries is not None:
            out = override_boundaries(out, boundaries)
        tokens = self.boundary.downsample(x, out)  # x: (B,M,D)
        # Sequences have different token counts: the token level runs on the real tokens only (packed), and
        # pads just for attention, where padding after the real tokens is hidden by causality.
        packing = Packing.from_counts(tokens.count, tokens.x.shape[1])
        y = packing.pack(tokens.x)  # (N,D)
        rope_tok = rope_tables(packing.pack(tokens.pos), dh, self.cfg.rope_base)  # RoPE at byte indices (1,N,dh/2)
        for blk in self.mid:
            y = blk(y, rope_tok, packing)  # (N,D)
        h = self.boundary.upsample(packing.unpack(y), x, tokens, out)  # (B,T,D)
        for blk in self.up:
            h = blk(h, rope_byte)
        logits = self._head(self.norm_out, self.head, h)  # (B,T,V)
        result = ModelOutput(logits=logits, boundaries=out, n_tokens=tokens.count)
        if targets is not None:
            self._losses(result, x, targets, batch_stats)
        return result

    def _losses(self, res: ModelOutput, x: torch.Tensor, targets: torch.Tensor, batch_stats=None) -> None:
        """L = w_auto L_auto + lambda_early L_early + strategy terms (eq. 27); all per-byte means."""
        bc = self.bcfg
        valid = targets != IGNORE  # (B,T)
        n = valid.sum().clamp(min=1)
        nll = F.cross_entropy(res.logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                              reduction="none").view_as(targets)  # (B,T)
        x_early = x if self.boundary.uses_rewards else x.detach()
        logits_early = self._head(self.norm_early, self.head_early, x_early)
        nll_early = F.cross_entropy(logits_early.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                                    reduction="none").view_as(targets)
        l_auto, l_early = nll.sum() / n, nll_early.sum() / n
        aux = self.boundary.losses(res.boundaries, -nll.detach(), -nll_early.detach(), valid, reduce=batch_stats)
        w_auto = 1.0 - bc.lambda_early if bc.code_loss_weights else 1.0
        total = w_auto * l_auto + bc.lambda_early * l_early
        for k, v in aux.items():
            if k.startswith("loss/"):
                total = total + v
        res.loss, res.nll = total, nll
        res.terms = {"loss/auto": l_auto.detach(), "loss/early": l_early.detach(), **aux}

    def generate(self, prompts, max_new_bytes: int = 200, **kw) -> list[bytes]:
        """Batched cached generation; see `learntok.generate.generate` for the options."""
        from learntok.generate import generate

        return generate(self, prompts, max_new_bytes, **kw)

    # -- accounting ----------------------------------------------------------------------------------------

    def matrix_params(self) -> tuple[int, int]:
        """(byte-level, token-level) matrix parameters for FLOPs = 6 x params per byte / per token (§4).
        Byte level: encoder, decoder, both heads and the strategy; embeddings are a lookup."""
        def count(mods):
            return sum(p.numel() for m in mods for p in m.parameters() if p.dim() >= 2)
        byte = count([self.down, self.up, self.head, self.head_early]) + self.boundary.matrix_params()
        return byte, count([self.mid])

    def train_flops(self, n_bytes: float, n_tokens: float) -> float:
        """Training FLOPs of processing n_bytes bytes that formed n_tokens tokens (paper's accounting)."""
        pb, pt = self.matrix_params()
        return 6.0 * (pb * n_bytes + pt * n_tokens)
