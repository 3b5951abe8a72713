"""Batched byte generation with caches at both levels of the U-Net.

One step feeds one byte per row (all rows share the byte position, since every row starts at BOS; a row whose
prompt is longer keeps feeding prompt bytes while shorter ones already sample):

    byte level   sliding-window KV cache per encoder/decoder layer: a ring buffer of `byte_window` slots
    boundary     the strategy's `step()` state (the learned policy keeps its last w boundaries)
    token level  KV cache per mid layer that grows only in rows where a boundary is drawn; each row keeps
                 the output of its latest token, which every following byte adds back (distribute-add)

`reference_logits` runs the full forward pass; a test checks that the cached steps give the same logits and
boundaries with the same boundary noise. Strategies without a `step()` fall back to recomputing the full
forward pass every byte (correct, slower).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from learntok.model.attention import scaled_scores
from learntok.model.layers import Attention, Block, apply_rope, rope_tables
from learntok.vocab import BOS, EOS


@dataclass
class _KV:
    k: torch.Tensor  # (B,H,S,dh)
    v: torch.Tensor  # (B,H,S,dh)


def _attend_cached(attn: Attention, x: torch.Tensor, rope, kv: _KV, slot: torch.Tensor | int,
                   key_mask: torch.Tensor) -> torch.Tensor:
    """Self-attention of one new position x (B,1,D) whose k/v are written into kv at `slot` ((B,) or int);
    key_mask (B,S) bool says which cache slots it may see (itself included)."""
    B, _, D = x.shape
    H = attn.n_heads
    qkv = attn.qkv(x).view(B, 1, 3, H, D // H).permute(2, 0, 3, 1, 4)  # (3,B,H,1,dh)
    q, k = apply_rope(qkv[:2], *rope).unbind(0)
    rows = torch.arange(B, device=x.device)
    slot = slot if isinstance(slot, torch.Tensor) else torch.full((B,), slot, device=x.device, dtype=torch.long)
    kv.k[rows, :, slot] = k[:, :, 0]
    kv.v[rows, :, slot] = qkv[2][:, :, 0]
    scores = scaled_scores(q, kv.k, attn.cap)  # (B,H,1,S)
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    y = torch.softmax(scores, dim=-1) @ kv.v  # (B,H,1,dh)
    return attn.proj(y.transpose(1, 2).reshape(B, 1, D))


def _block_step(blk: Block, x, rope, kv: _KV, slot, key_mask) -> torch.Tensor:
    x = x + blk.attn_post(_attend_cached(blk.attn, blk.attn_pre(x), rope, kv, slot, key_mask))
    return x + blk.mlp_post(blk.mlp(blk.mlp_pre(x)))


class CachedDecoder:
    """Incremental forward pass of a ByteLM: `step(ids_t)` -> next-byte logits (B,V) and the boundary."""

    def __init__(self, model, batch: int, noise: torch.Tensor):
        self.m, self.B = model, batch
        cfg = model.cfg
        dev = next(model.parameters()).device
        self.dev, self.dh, self.W = dev, cfg.d_model // cfg.n_heads, cfg.byte_window
        H = cfg.n_heads

        def kv(n):
            return _KV(torch.zeros(batch, H, n, self.dh, device=dev), torch.zeros(batch, H, n, self.dh, device=dev))

        self.down = [kv(self.W) for _ in model.down]
        self.up = [kv(self.W) for _ in model.up]
        self.slot_pos = torch.full((self.W,), -1, dtype=torch.long, device=dev)  # byte position held per slot
        self.cap = 64
        self.mid = [kv(self.cap) for _ in model.mid]
        self.count = torch.zeros(batch, dtype=torch.long, device=dev)  # tokens so far per row
        self.last_tok = torch.zeros(batch, cfg.d_model, device=dev)  # Y' of each row's latest token
        self.pos = 0
        self.state = model.boundary.init_step_state(batch, noise)

    def _grow(self) -> None:
        for kv in self.mid:
            kv.k = F.pad(kv.k, (0, 0, 0, self.cap))
            kv.v = F.pad(kv.v, (0, 0, 0, self.cap))
        self.cap *= 2

    @torch.no_grad()
    def step(self, ids_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids_t (B,) the byte at the current position -> (logits (B,V) for the next byte, boundary (B,) bool)."""
        m, t = self.m, self.pos
        pos = torch.tensor([t], device=self.dev)
        rope = rope_tables(pos, self.dh, m.cfg.rope_base)
        slot = t % self.W
        self.slot_pos[slot] = t
        win_mask = ((self.slot_pos >= 0) & (self.slot_pos > t - self.W)).expand(self.B, -1)  # (B,W)
        x = m.embed(ids_t)[:, None]  # (B,1,D)
        for blk, kv in zip(m.down, self.down):
            x = _block_step(blk, x, rope, kv, slot, win_mask)
        a_t, p_t = m.boundary.step(x[:, 0], ids_t, t, self.state)  # (B,) bool, (B,)
        tok_in = m.boundary.step_token_input(x[:, 0], a_t, self.state)  # (B,D) select: x_t; dynamic: group mean
        if bool(a_t.any()):
            if int(self.count.max()) >= self.cap:
                self._grow()
            tok_mask = torch.arange(self.cap, device=self.dev)[None] <= self.count[:, None]  # (B,cap)
            y = tok_in[:, None]
            for blk, kv in zip(m.mid, self.mid):
                y = _block_step(blk, y, rope, kv, self.count, tok_mask)
            # Rows without a boundary wrote a k/v at slot `count` that their next token overwrites; their
            # tokens are not advanced, so that slot stays outside their mask.
            self.last_tok = m.boundary.step_token_output(y[:, 0], a_t, p_t, self.last_tok, self.state)
            self.count = self.count + a_t.long()
        h = x + self.last_tok[:, None]  # distribute-add
        for blk, kv in zip(m.up, self.up):
            h = _block_step(blk, h, rope, kv, slot, win_mask)
        self.pos += 1
        return m._head(m.norm_out, m.head, h)[:, 0], a_t


def _prescribed(model, ids: torch.Tensor) -> torch.Tensor | None:
    """Flags of strategies that annotate text (BPE guidance), recomputed on each row's bytes so far: for the
    newest byte this is the shifted rule applied to the prefix, the only causal choice while generating."""
    rows = []
    for row in ids.tolist():
        flags = [True] * len(row)  # BOS and special ids separate documents: always boundaries
        start = 1
        for i in range(1, len(row) + 1):
            if i == len(row) or row[i] >= 256:
                if i > start:
                    ann = model.boundary.annotate(bytes(row[start:i]))
                    if ann is None:
                        return None
                    flags[start:i] = [bool(f) for f in ann]
                start = i + 1
        rows.append(flags)
    return torch.tensor(rows, device=ids.device)


def _sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator) -> torch.Tensor:
    """Next byte ids (B,) from logits (B,V) over bytes and EOS."""
    logits = logits.clone()
    logits[:, EOS + 1:] = float("-inf")
    logits[:, BOS] = float("-inf")
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_l, idx = logits.sort(-1, descending=True)
        cum = sorted_l.softmax(-1).cumsum(-1)
        drop = cum - sorted_l.softmax(-1) > top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(1, idx, sorted_l.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]


@torch.no_grad()
def generate(model, prompts: list[str | bytes], max_new_bytes: int = 200, *, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop: list[bytes] | None = None,
             use_cache: bool = True, on_text: Callable[[int, str], None] | None = None) -> list[bytes]:
    """Continue each prompt by up to max_new_bytes bytes. Stops a row at EOS or when its output ends with one
    of `stop`. `on_text(row, text)` streams decoded text as it is produced (UTF-8 decoded incrementally, so a
    multi-byte character is emitted whole). Boundary noise is drawn from `seed` (fixed per position)."""
    model.eval()
    data = [p.encode() if isinstance(p, str) else bytes(p) for p in prompts]
    B, dev = len(data), next(model.parameters()).device
    total = max(len(p) for p in data) + max_new_bytes
    gen = torch.Generator().manual_seed(seed)
    noise = torch.rand(B, total, generator=gen).to(dev)
    if model.bcfg.eval_boundaries == "greedy":
        noise.fill_(0.5)  # a_t = [p_t > 0.5]
    stepper = CachedDecoder(model, B, noise) if use_cache and model.boundary.has_step else None
    seqs = [[BOS, *p] for p in data]
    out: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(B)]
    for t in range(total):
        if stepper is not None:
            ids_t = torch.tensor([s[t] for s in seqs], device=dev)
            logits, _ = stepper.step(ids_t)
        else:
            ids = torch.tensor([s[: t + 1] for s in seqs], device=dev)
            logits = model(ids, noise=noise[:, : t + 1], prescribed=_prescribed(model, ids)).logits[:, -1]
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
    return [bytes(o) for o in out]
