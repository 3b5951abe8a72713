"""The autoregressive U-Net byte language model (docs/method.md).

    X  = encode(x)                 n_down sliding-window blocks over bytes
    a  ~ strategy(X)               boundaries; a_0 = 1
    X' = downsample(X, a)          select (or the strategy's own pooling)
    Y' = mid(X')                   n_mid full-causal blocks over tokens, RoPE at boundary byte indices
    Y  = upsample(Y', X, a)        X_t + Y'_{c(t)}
    logits = head(decode(Y))       n_up sliding-window blocks; position t predicts x_{t+1}

An early-exit head reads X directly; its log-likelihood is the baseline of the relative reward (eq. 15). For
strategies that do not use rewards it is a detached probe ("how good is the encoder alone").

`forward` runs whole sequences (training, scoring); `step` beside it advances a batch of rows by one byte
with caches at both levels (generation) and gives the same logits and boundaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from learntok.boundaries import BoundaryConfig, BoundaryOutput, build_strategy
from learntok.boundaries.base import BATCH_STATS, BatchSums, StatsReducer, override_boundaries
from learntok.boundaries.rates import Rates
from learntok.config import ModelConfig
from learntok.nn.attention import softcap
from learntok.nn.cache import KVCache
from learntok.nn.layers import Block, Packing, RMSNorm, rope_tables, run_block
from learntok.nn.ngram import BEFORE, ChunkEmbedding, HashedNgrams
from learntok.vocab import IGNORE, VOCAB_SIZE

COMPILE_BUCKET = 64
"""--token-bucket that --compile uses when none is given: static token-level shapes, at most 64 padded slots."""


def matrix_count(modules) -> int:
    """Parameters of the matrices (dim >= 2) in `modules`: what 6N counts."""
    return sum(p.numel() for m in modules for p in m.parameters() if p.dim() >= 2)


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
    nll_early: torch.Tensor | None = None
    """(B,T) the same under the early-exit head."""
    nll_early2: torch.Tensor | None = None
    """(B,T) the same under the second early-exit head (--inner-layers: the hierarchy without its second level)."""
    n_tokens: torch.Tensor | None = None
    """(B,) real tokens per sequence at the token level."""
    token_slots: int | None = None
    """Token-level length per sequence under --token-bucket (static shapes), None when packed."""
    n_super: torch.Tensor | None = None
    """(B,) super-tokens per sequence at a second boundary level (--inner-layers), else None."""
    super_slots: int | None = None
    """Super-token level length per sequence under --token-bucket (--inner-layers), None when packed."""
    inner_boundaries: BoundaryOutput | None = None
    """The second level's draw, over token slots (B,M) (--inner-layers), else None."""
    batch_stats: BatchSums | None = None
    """This micro-batch's local sums of the estimator's batch statistics (strategies that use rewards), for the
    training loop to reduce over the global batch (learntok.train.parallel)."""

    @property
    def pad_share(self) -> torch.Tensor | None:
        """Share of the bucketed token level's B x slots positions that are padding (FLOPs spent on nothing),
        on the device; None when packed (no padding is computed but attention's)."""
        if not self.token_slots:
            return None
        return 1 - self.n_tokens.sum().float() / (self.n_tokens.numel() * self.token_slots)

    @property
    def super_pad_share(self) -> torch.Tensor | None:
        """The same at a bucketed super-token level (--inner-layers with --token-bucket), else None."""
        if not self.super_slots:
            return None
        return 1 - self.n_super.sum().float() / (self.n_super.numel() * self.super_slots)


@dataclass
class GenerationState:
    """Everything `ByteLM.step` carries from one byte to the next, for B rows at the same byte position."""

    pos: int
    """The byte position the next call processes."""
    down: list[KVCache]
    """Encoder layers' ring buffers of byte_window slots (slot = position mod window)."""
    up: list[KVCache]
    """Decoder layers' ring buffers."""
    slot_pos: torch.Tensor
    """(window,) long: the byte position each ring slot holds (-1 = empty)."""
    mid: list[KVCache]
    """Token layers' caches; row b's token j sits in slot j, and the caches grow as tokens arrive."""
    count: torch.Tensor
    """(B,) long: tokens so far in each row."""
    last_tok: torch.Tensor
    """(B,D) what later bytes of each row add back (distribute-add: its newest token's output)."""
    boundary: Any
    """The strategy's own step state (`BoundaryStrategy.init_step_state`)."""
    recent: torch.Tensor | None = None
    """(B, n) the last n input ids of each row for hashed n-gram embeddings (--ngram-sizes), else None."""
    chunk: torch.Tensor | None = None
    """(B,) long: each row's running hash of its open chunk (--chunk-table), else None."""
    chunk_reset: torch.Tensor | None = None
    """(B,) bool: the previous byte closed a token (the next byte starts a chunk)."""


class ByteLM(nn.Module):
    levels = 1
    """Boundary levels `learntok.draw` can draw (a two-level model, model.hier.HierLM, has 2)."""

    def __init__(self, cfg: ModelConfig, bcfg: BoundaryConfig):
        super().__init__()
        self.cfg, self.bcfg = cfg, bcfg
        self.activation_checkpointing = False
        """Set by training (--activation-checkpointing): recompute block activations in the backward pass."""
        self._compiled: tuple | None = None
        """The compiled (stage 1, stage 2) of `forward` after `compile_stages`, else None (eager)."""
        self.token_bucket = cfg.token_bucket
        """Rounding of the token level's length (`token_slots`): --token-bucket, or COMPILE_BUCKET once
        `compile_stages` has run without one."""
        self.token_count_reduce = None
        """Set by distributed training: maps this process's largest token count (a 0-dim device tensor) to the
        largest over all processes (an all-reduce MAX), so that in training every rank pads its token level to
        the same bucket and compiles the same graphs at the same time."""
        backend = cfg.attn_backend  # "auto" is resolved per call, on the device of the inputs
        d, H = cfg.d_model, cfg.n_heads
        byte_hidden, tok_hidden = round(cfg.byte_mlp_mult * d), round(cfg.token_mlp_mult * d)

        def blocks(n, hidden, window):
            return nn.ModuleList(Block(d, H, hidden, window, cfg.attn_softcap, backend) for _ in range(n))

        self.embed = nn.Embedding(VOCAB_SIZE, d)
        with torch.random.fork_rng(devices=[]):  # zero-initialised tables; the other weights' draws unchanged
            self.ngrams = HashedNgrams(d, cfg.ngram_sizes, cfg.ngram_table) if cfg.ngram_sizes else None
            self.chunks = ChunkEmbedding(d, cfg.chunk_table) if cfg.chunk_table else None
        self.down = blocks(cfg.n_down, byte_hidden, cfg.byte_window)
        self.mid = blocks(cfg.n_mid, tok_hidden, None)
        self.up = blocks(cfg.n_up, byte_hidden, cfg.byte_window)
        self.boundary = build_strategy(bcfg, d)
        self.norm_out = RMSNorm(d)
        self.head = nn.Linear(d, VOCAB_SIZE, bias=False)
        # Initialise in module order; the strategy initialises its own weights at its place in that order.
        for part in (self.embed, self.down, self.mid, self.up):
            part.apply(self._init)
        self.boundary.reset_parameters(cfg.init_std)
        for part in (self.norm_out, self.head):
            part.apply(self._init)
        n_layers = cfg.n_down + cfg.n_mid + cfg.n_up + 2 * cfg.inner_layers  # (a two-level model's inner layers)
        for name, p in self.named_parameters():  # residual-output projections: smaller init (GPT-2)
            if name.endswith("attn.proj.weight") or name.endswith("mlp.down.weight"):
                nn.init.normal_(p, std=cfg.init_std / math.sqrt(2 * n_layers))
        # The early-exit head starts as a copy of the output head (paper §2.3).
        # (Built empty and filled, not deep-copied: a deep copy of a fake tensor belongs to another fake mode.)
        self.norm_early = RMSNorm(d)
        with torch.random.fork_rng(devices=[]):  # its own initialisation is overwritten: leave the RNG as it was
            self.head_early = nn.Linear(d, VOCAB_SIZE, bias=False)
        with torch.no_grad():
            self.norm_early.weight.copy_(self.norm_out.weight)
            self.head_early.weight.copy_(self.head.weight)

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

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(pos, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_base)

    def _byte_rope(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The byte level's tables for ids (B,T): positions 0..T-1 -> (1,T,dh/2)."""
        return self._rope(torch.arange(ids.shape[1], device=ids.device))

    @staticmethod
    def _rope_at(rope: tuple[torch.Tensor, torch.Tensor], pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The byte level's tables `rope` (1,T,dh/2) read at byte positions `pos` (B,M) -> (B,1,M,dh/2), or
        (N,) -> (1,N,dh/2): `_rope(pos)` without computing a sine again."""
        cos, sin = rope
        return cos[0, pos].unsqueeze(-3), sin[0, pos].unsqueeze(-3)

    def _embed(self, ids: torch.Tensor, ngrams: torch.Tensor | None = None) -> torch.Tensor:
        """Byte embeddings, the start of the residual stream. Under autocast (bf16-mixed) the stream is fp32, or
        the autocast dtype with --residual-dtype autocast, whatever dtype the weights are gathered in (FSDP2
        gathers bf16); without autocast, the weights' dtype. Every block returns its input's dtype, so this sets
        the stream's dtype for the whole U-Net: bf16 halves the bytes its norms, adds and casts move. With
        --ngram-sizes the hashed n-gram embeddings are added (of `ids`, or `ngrams` given by cached generation)."""
        x = self.embed(ids)
        if self.ngrams is not None:
            x = x + (self.ngrams(ids) if ngrams is None else ngrams)
        dev = ids.device.type
        if torch.is_autocast_enabled(dev):
            x = x.to(torch.get_autocast_dtype(dev) if self.cfg.residual_dtype == "autocast" else torch.float32)
        return x

    def encode(self, ids: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Byte embedding and encoder blocks. ids (B,T) -> X (B,T,D); rope: the byte level's tables, if made."""
        if rope is None:
            rope = self._byte_rope(ids)
        x = self._embed(ids)  # (B,T,D)
        for blk in self.down:
            x = self._block(blk, x, rope)
        return x

    def _block(self, blk: nn.Module, *args) -> torch.Tensor:
        """blk(*args), recomputed in the backward pass with activation checkpointing (training only)."""
        return run_block(blk, *args, recompute=self.activation_checkpointing and self.training)

    # -- whole sequences -----------------------------------------------------------------------------------

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, *, noise: torch.Tensor | None = None,
                generator: torch.Generator | None = None, prescribed: torch.Tensor | None = None,
                batch_stats: StatsReducer | None = None, boundaries: torch.Tensor | None = None,
                rates: Rates | None = None) -> ModelOutput:
        """ids (B,T) input ids (BOS first); targets (B,T) next ids or IGNORE; noise (B,T) boundary uniforms;
        prescribed (B,T) bool boundary flags from the data pipeline (strategies with `annotate`);
        batch_stats: the estimator's reducer to global-batch statistics (`StatsReducer`, from the training loop);
        boundaries: (B,T) bool flags that replace the strategy's draw (diagnostics, e.g. boundary sensitivity;
        position 0 is always a boundary); rates: per-row target rates (strategies with a `rate_knob`; default:
        the rate `set_rate` asked for, else the trained one)."""
        if rates is not None and not self.boundary.rate_knob:
            raise ValueError(f"--boundaries {self.bcfg.boundaries} takes no target rates")
        # Compiled stages train; evaluation and scoring run eagerly (no graphs for eval mode or other lengths).
        stage1, stage2 = self._compiled if self._compiled and self.training else (self._propose, self._finish)
        # The RoPE tables, made once outside the stages: a compiled graph then reads them, where inductor fused
        # their sines into every layer's rotation (14 % of the compiled paper-147m step on an H200, docs/gpu.md).
        rope = self._byte_rope(ids)
        x, out = stage1(ids, noise, generator, prescribed, rates, rope)
        if boundaries is not None:
            out = override_boundaries(out, boundaries)
        return stage2(ids, x, out, targets, self.token_slots(out.mask), batch_stats, rope)

    def _propose(self, ids, noise, generator, prescribed, rates=None, rope=None) -> tuple[torch.Tensor, BoundaryOutput]:
        """Stage 1: encoder and boundaries (rope: the byte level's tables, made here when not given)."""
        x = self.encode(ids, rope)  # (B,T,D)
        more = {} if rates is None else {"rates": rates}
        return x, self.boundary.propose(x, ids, noise=noise, generator=generator, prescribed=prescribed, **more)

    def set_rate(self, rate: float | None) -> None:
        """Ask for boundary rate `rate` (boundaries per byte) in every later forward pass, generation step and
        boundary draw; None returns to the trained rate. A variable-rate model (--rate-range) is conditioned on
        it; a fixed-rate one gets its logits shifted (logit(rate) for logit(target_rate)); a calibration table
        (`learntok calibrate`) adds its fitted offset. Strategies without a rate knob raise ValueError."""
        self.boundary.set_rate(rate)

    def token_slots(self, mask: torch.Tensor) -> int | None:
        """The token level's static length under --token-bucket N: the batch's largest token count (over all
        processes, in distributed training) rounded up to a multiple of N (at most T), the one value a step
        reads back from the device; None without it (the exact count, packed)."""
        n = self.token_bucket
        if not n:
            return None
        count = mask.sum(1).max()
        if self.token_count_reduce is not None and self.training:  # (evaluation may run on one rank only)
            count = self.token_count_reduce(count)
        return min(-(-int(count) // n) * n, mask.shape[1])

    def _finish(self, ids, x, out, targets, size, batch_stats, rope_byte) -> ModelOutput:
        """Stage 2: downsample, token level, upsample, decoder, heads and losses. size: token slots (static
        shapes, padded token level) or None (exact count, packed token level); rope_byte: the byte level's tables,
        which the token level reads at its tokens' byte positions."""
        tokens = self.boundary.downsample(x, out, size)  # x: (B,M,D)
        if self.chunks is not None:  # each token's bytes, hashed (--chunk-table)
            tokens.x = tokens.x + self.chunks(ids, out.mask, tokens.pos).to(tokens.x.dtype)
        if size is None:
            # Sequences have different token counts: the token level runs on the real tokens only (packed),
            # and pads just for attention, where padding after the real tokens is hidden by causality.
            packing = Packing.from_counts(tokens.count, tokens.x.shape[1])
            y = packing.pack(tokens.x)  # (N,D)
            rope_tok = self._rope_at(rope_byte, packing.pack(tokens.pos))  # at the boundaries' bytes (1,N,dh/2)
            for blk in self.mid:
                y = self._block(blk, y, rope_tok, packing)  # (N,D)
            y = packing.unpack(y)
        else:
            # Static shapes: all M slots run; padding slots sit after every real token (causality hides them)
            # and no byte reads them back, so they change nothing but the FLOPs.
            y, rope_tok = tokens.x, self._rope_at(rope_byte, tokens.pos)  # (B,M,D), RoPE tables (B,1,M,dh/2)
            for blk in self.mid:
                y = self._block(blk, y, rope_tok)
        h = self.boundary.upsample(y, x, tokens, out)  # (B,T,D)
        for blk in self.up:
            h = self._block(blk, h, rope_byte)
        logits = self._head(self.norm_out, self.head, h)  # (B,T,V)
        result = ModelOutput(logits=logits, boundaries=out, n_tokens=tokens.count, token_slots=size)
        if targets is not None:
            self._losses(result, x, targets, batch_stats)
        return result

    def compile_stages(self, **options) -> None:
        """torch.compile the two stages of `forward` (`options` go to torch.compile). Between them the step reads
        one number from the device, the bucketed token count (`token_slots`; COMPILE_BUCKET unless --token-bucket
        is given), so each stage has static shapes: stage 2 compiles once per bucket. Each stage is one graph
        (`fullgraph=True`) for every strategy whose `traces_whole` holds, all registered ones but learned with a
        policy window wider than the scan's (tests/test_compile.py)."""
        options = self._static_shapes({"fullgraph": self.boundary.traces_whole, **options})
        self._compiled = (torch.compile(self._propose, **options), torch.compile(self._finish, **options))

    def compile_blocks(self, **options) -> None:
        """torch.compile each transformer block on its own (one graph each, fullgraph), in place, leaving the
        stages eager: the form FSDP2 needs (as torchtitan does), because its hooks around every sharded block
        are excluded from compilation and would break a stage's graph. Call it before sharding. The token
        level keeps static shapes (COMPILE_BUCKET unless --token-bucket is given)."""
        options = self._static_shapes({"fullgraph": True, **options})
        for blk in self.transformer_blocks():
            blk.compile(**options)

    def transformer_blocks(self) -> list[nn.Module]:
        """Every transformer block, input side first: what `compile_blocks` compiles and FSDP2 shards one by one."""
        return [*self.down, *self.mid, *self.up]

    def _static_shapes(self, options: dict) -> dict:
        """Bucket the token level's length (static shapes, not a graph per token count) and raise dynamo's
        recompile limit to the graphs that can arise; `options` for torch.compile with dynamic=False."""
        import torch._dynamo

        self.token_bucket = self.token_bucket or COMPILE_BUCKET
        # Stage-2 graphs per bucket (up to T / N buckets, T <= 4096 in every preset), twice: with gradients and
        # without (the statistics pre-pass under accumulation, validation) must fit the limit.
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, 8 + 2 * (4096 // self.token_bucket))
        return {"dynamic": False, **options}

    @staticmethod
    def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(B,T) negative log-likelihood in nats of targets (B,T) under logits (B,T,V); 0 at IGNORE."""
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                               reduction="none").view_as(targets)

    def _early_trains(self, strategy) -> bool:
        """Whether an early-exit loss trains what it reads (--early-loss-to-encoder), for `strategy`'s level."""
        mode = self.cfg.early_loss_to_encoder
        return mode == "always" or (mode == "rewards" and strategy.uses_rewards)

    def _losses(self, res: ModelOutput, x: torch.Tensor, targets: torch.Tensor,
                batch_stats: StatsReducer | None = None) -> None:
        """L = w_auto L_auto + lambda_early L_early + strategy terms (eq. 27); all per-byte means."""
        cfg = self.cfg
        valid = targets != IGNORE  # (B,T)
        n = valid.sum().clamp(min=1)
        nll = self._nll(res.logits, targets)
        x_early = x if self._early_trains(self.boundary) else x.detach()
        nll_early = self._nll(self._head(self.norm_early, self.head_early, x_early), targets)
        l_auto, l_early = nll.sum() / n, nll_early.sum() / n
        aux = self.boundary.losses(res.boundaries, -nll.detach(), -nll_early.detach(), valid, reduce=batch_stats)
        res.batch_stats = aux.pop(BATCH_STATS, None)
        w_auto = 1.0 - cfg.lambda_early if cfg.code_loss_weights else 1.0
        total = w_auto * l_auto + cfg.lambda_early * l_early
        for k, v in aux.items():
            if k.startswith("loss/"):
                total = total + v
        res.loss, res.nll, res.nll_early = total, nll, nll_early.detach()
        res.terms = {"loss/auto": l_auto.detach(), "loss/early": l_early.detach(), **aux}

    # -- one byte at a time --------------------------------------------------------------------------------

    def init_state(self, batch: int, noise: torch.Tensor) -> GenerationState:
        """Empty caches for `batch` rows; noise (B, T_total) holds the boundary uniforms of every position."""
        cfg, dev, dtype = self.cfg, self.embed.weight.device, self.embed.weight.dtype  # bf16 weights: bf16 caches
        dh, W = cfg.d_model // cfg.n_heads, cfg.byte_window

        def caches(blocks: nn.ModuleList, size: int) -> list[KVCache]:
            return [KVCache.empty(batch, cfg.n_heads, size, dh, dev, dtype) for _ in blocks]

        recent = None if self.ngrams is None else torch.full((batch, self.ngrams.span), BEFORE, device=dev)
        return GenerationState(pos=0, down=caches(self.down, W), up=caches(self.up, W),
                               slot_pos=torch.full((W,), -1, dtype=torch.long, device=dev), mid=caches(self.mid, 64),
                               count=torch.zeros(batch, dtype=torch.long, device=dev),
                               last_tok=torch.zeros(batch, cfg.d_model, device=dev, dtype=dtype),
                               boundary=self.boundary.init_step_state(batch, noise), recent=recent,
                               chunk=torch.zeros(batch, dtype=torch.long, device=dev) if self.chunks else None,
                               chunk_reset=torch.ones(batch, dtype=torch.bool, device=dev) if self.chunks else None)

    @torch.no_grad()
    def step(self, ids_t: torch.Tensor, state: GenerationState) -> tuple[torch.Tensor, torch.Tensor]:
        """ids_t (B,) the bytes at position state.pos -> (next-byte logits (B,V), boundary a_t (B,) bool).
        Equals `forward` on the whole prefix with the same boundary noise (tests/test_generate.py), except under
        --force-last: `forward` forces a boundary at a prefix's last byte, a step does not (it cannot know that no
        byte follows), so cached and uncached generation of such a model differ."""
        t, W, B = state.pos, self.cfg.byte_window, ids_t.shape[0]
        rope = self._rope(torch.tensor([t], device=ids_t.device))
        slot = torch.full((B,), t % W, dtype=torch.long, device=ids_t.device)
        state.slot_pos[t % W] = t
        window = ((state.slot_pos >= 0) & (state.slot_pos > t - W)).expand(B, -1)  # (B,W) the last W bytes
        ngrams = None
        if self.ngrams is not None:  # the n-grams ending at this byte, from the row's last ids
            state.recent = torch.cat([state.recent[:, 1:], ids_t[:, None].long()], 1)
            ngrams = self.ngrams.last(state.recent)
        x = self._embed(ids_t, ngrams)[:, None]  # (B,1,D)
        for blk, cache in zip(self.down, state.down):
            x = blk.step(x, rope, cache, slot, window)
        a_t, p_t = self.boundary.step(x[:, 0], ids_t, t, state.boundary)  # (B,) bool, (B,)
        tok_in = self.boundary.step_token_input(x[:, 0], a_t, state.boundary)  # (B,D)
        if self.chunks is not None:  # the open chunk's hash now includes this byte; a boundary closes it
            state.chunk = self.chunks.extend(state.chunk, ids_t, state.chunk_reset)
            tok_in = tok_in + self.chunks.emb(state.chunk % self.chunks.table).to(tok_in.dtype)
            state.chunk_reset = a_t.clone()
        if bool(a_t.any()):
            y = self._step_tokens(tok_in, a_t, rope, state)  # (B,D)
            state.last_tok = self.boundary.step_token_output(y, a_t, p_t, state.last_tok, state.boundary)
            state.count = state.count + a_t.long()
        h = self.boundary.step_upsample(x[:, 0], state.last_tok)[:, None]  # (B,1,D) distribute-add, or a strategy's
        for blk, cache in zip(self.up, state.up):
            h = blk.step(h, rope, cache, slot, window)
        state.pos += 1
        return self._head(self.norm_out, self.head, h)[:, 0], a_t

    def _step_tokens(self, tok_in: torch.Tensor, a_t: torch.Tensor, rope, state: GenerationState) -> torch.Tensor:
        """The token level's output (B,D) for a new token tok_in (B,D) in the rows where a_t, through the token
        layers' caches at byte position state.pos (rope: its tables); other rows' values are not used."""
        y = tok_in[:, None]  # (B,1,D)
        if state.mid and int(state.count.max()) >= state.mid[0].size:
            for cache in state.mid:
                cache.grow(cache.size)
        for blk, cache in zip(self.mid, state.mid):
            seen = torch.arange(cache.size, device=tok_in.device)[None] <= state.count[:, None]  # (B,S)
            y = blk.step(y, rope, cache, state.count, seen)  # the row's tokens so far and the new one
        # Rows without a boundary wrote a k/v at slot `count` that their next token overwrites; their count does
        # not advance, so that slot stays outside their mask.
        return y[:, 0]

    # -- accounting ----------------------------------------------------------------------------------------

    def matrix_params(self) -> tuple[int, int]:
        """(byte-level, token-level) matrix parameters for FLOPs = 6 x params per byte / per token (§4).
        Byte level: encoder, decoder, both heads and the strategy; embeddings are a lookup."""
        byte = matrix_count([self.down, self.up, self.head, self.head_early]) + self.boundary.matrix_params()
        return byte, matrix_count([self.mid])

    def train_flops(self, n_bytes: float, n_tokens: float) -> float:
        """Training FLOPs of processing n_bytes bytes that formed n_tokens tokens (paper's accounting)."""
        pb, pt = self.matrix_params()
        return 6.0 * (pb * n_bytes + pt * n_tokens)

    def flops_conventions(self, rows: int, seq_len: int, tokens: float, slots: float, token_pairs: float) -> dict:
        """Training FLOPs of `rows` sequences of seq_len positions under the three conventions of
        learntok.model.flops (tokens: real tokens; slots: padded token positions; token_pairs: causal
        query-key pairs at the token level, sum over rows of L (L + 1) / 2)."""
        from learntok.model.flops import conventions, window_pairs

        pb, pt = self.matrix_params()
        byte_pairs = rows * window_pairs(seq_len, self.cfg.byte_window)
        return conventions(pb * rows * seq_len, pt, tokens, slots,
                           attention=self.cfg.d_model * ((self.cfg.n_down + self.cfg.n_up) * byte_pairs
                                                         + self.cfg.n_mid * token_pairs))
