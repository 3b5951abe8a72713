"""A two-level hierarchy (`--inner-layers N`; not in the paper, which leaves deeper hierarchies open):

    X  = encode(x)                    n_down byte layers
    a  ~ strategy(X)                  first level: token boundaries over bytes, a_0 = 1
    Z  = inner_down(select(X, a))     N full-causal layers over tokens, RoPE at their boundary bytes
    s  ~ strategy'(Z)                 second level: super-token boundaries over tokens, s_0 = 1
    Y2 = mid(select(Z, s))            n_mid layers over super-tokens
    Y1 = inner_up(Z + Y2[c'(j)])      N layers over tokens, each token reading its super-token back
    logits = head(decode(X + Y1[c(t)]))

The second level's strategy is the first's (`--boundaries learned` or `uniform`, same options) at --inner-rate
super-tokens per token; with --inner-start it decides only after that share of training (before it, every token
is its own super-token: a curriculum). Both levels are causal by the same argument: token j is built at its
boundary byte b_j and read back by bytes >= b_j; super-token k at its first token, read back by later tokens.

Estimator (learned). A boundary's return counts rewards its decision can reach, as at one level:
- first level: r_t = log p(x_{t+1}) - log p_early(x_{t+1}), the early head reading X (the paper's);
- second level: per token j, R_j = sum over the bytes t that read token j of log p(x_{t+1}) - log p_early2(x_{t+1}),
  where early2 reads X + Z[c(t)] (the hierarchy without its second level). It depends on the first level's
  boundaries but not on the second's, so it is a baseline for the second level's decisions (no bias given the
  first). Returns are discounted per token (gamma per token, not per byte; --inner-gamma sets its own).
Both policies see rewards of the full model, so each term is a score-function estimate of the gradient of the
same objective (E over both levels' draws; the second is drawn given the first). The second level's policy loss
is summed over its decisions and divided by the first level's decision count, not by its own (a random count
that would reweight batches by their token count): tests/test_hier.py checks the joint estimator against exact
enumeration.

Second-level uniforms come from the same per-byte noise as the first, so prefixes draw what whole sequences draw
(generation): token j's draw is frac(4096 u_{b_j} + 1/2), the low 12 of the float's 24 random bits, which the first
level's comparison u_t < p_t uses only when p_t is within 2^-12 of u_t.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from learntok.boundaries import build_strategy
from learntok.boundaries.base import BATCH_STATS, BatchSums, BoundaryOutput, StatsReducer, override_boundaries
from learntok.boundaries.pooling import Tokens, distribute_add
from learntok.model.lm import ByteLM, GenerationState, ModelOutput, matrix_count
from learntok.nn.layers import Block, Packing, RMSNorm
from learntok.vocab import IGNORE

INNER_STRATEGIES = ("learned", "uniform")
"""Strategies a second level can use: they act on any sequence of states (no bytes, no prescribed flags)."""
SPLIT = 4096.0
"""The second level's uniforms are frac(SPLIT x u): the low bits of the first level's."""


def inner_uniforms(noise: torch.Tensor) -> torch.Tensor:
    """The second level's uniforms (B,T) from the first level's (B,T): frac(4096 u + 1/2), per byte. Greedy
    evaluation's 0.5 everywhere maps to 0.5: greedy at both levels."""
    return torch.frac(noise.float() * SPLIT + 0.5)


def compose_uniforms(u1: torch.Tensor, u2: torch.Tensor) -> torch.Tensor:
    """Noise whose first-level uniforms are u1 to 12 bits and whose second-level ones are u2 (tests)."""
    return (torch.floor(u1 * SPLIT).clamp(max=SPLIT - 1) + torch.remainder(u2 - 0.5, 1.0)) / SPLIT


@dataclasses.dataclass
class HierState(GenerationState):
    """`GenerationState` with each row's tokens so far (the token levels run again at each new token)."""

    noise: torch.Tensor | None = None
    """(B, T_total) the per-byte uniforms: the second level draws token j with its boundary byte's."""
    tok_x: torch.Tensor | None = None
    """(B,S,D) each row's token inputs so far (row b's token j in slot j; S grows as tokens arrive)."""
    tok_pos: torch.Tensor | None = None
    """(B,S) long: their boundary bytes' positions."""


@dataclasses.dataclass
class PairSums:
    """Both levels' batch sums as one `BatchSums` (the training loop reduces them with one vector)."""

    first: BatchSums
    second: BatchSums

    def stacked(self) -> torch.Tensor:
        return torch.cat([self.first.stacked(), self.second.stacked()])

    def unstacked(self, v: torch.Tensor) -> PairSums:
        n = self.first.stacked().numel()
        return PairSums(self.first.unstacked(v[:n]), self.second.unstacked(v[n:]))


def _level_reducer(reduce: StatsReducer | None, level: int) -> StatsReducer | None:
    """One level's reducer from the pair's (`PairSums`): the other level's slot holds zeros (an all-reduce adds
    nothing to it; precomputed totals ignore it). Both levels run one strategy over T columns, so their sums have
    one shape."""
    if reduce is None:
        return None

    def one(local):
        zeros = local.unstacked(torch.zeros_like(local.stacked()))
        out = reduce(PairSums(local, zeros) if level == 0 else PairSums(zeros, local))
        return out.first if level == 0 else out.second
    return one


def _pad_columns(out: BoundaryOutput, T: int) -> BoundaryOutput:
    """A second-level output (B,M) padded to (B,T) columns: the batch statistics then have one shape in every
    micro-batch and process whatever its token count (padding: no boundary, not free)."""
    changes = {}
    for f in dataclasses.fields(out):
        v = getattr(out, f.name)
        if torch.is_tensor(v) and v.dim() == 2:  # (B,M) fields; per-row ones (B,) stay
            changes[f.name] = F.pad(v, (0, T - v.shape[1]))  # False / 0 past the tokens
    return dataclasses.replace(out, **changes)


def unsupported(bcfg, cfg=None) -> list[str]:
    """What a two-level model cannot run with these boundary options (and model config `cfg`): one line each,
    empty if nothing. The config check (before any work) and the model's constructor both ask it."""
    problems = []
    if cfg is not None and cfg.inner_gamma is not None and not hasattr(bcfg, "gamma"):
        problems.append(f"--inner-gamma needs --boundaries learned (a discount of policy-gradient returns), got "
                        f"{bcfg.boundaries}")
    if bcfg.boundaries not in INNER_STRATEGIES:
        problems.append(f"--inner-layers needs --boundaries {' or '.join(INNER_STRATEGIES)} (its second level uses "
                        f"the first's strategy), got {bcfg.boundaries}")
    if getattr(bcfg, "rate_range", None) is not None:
        problems.append("--inner-layers does not combine with --rate-range yet")
    return problems


class HierLM(ByteLM):
    """The U-Net with a second boundary level between its token layers (module docstring)."""

    levels = 2
    """Boundary levels `learntok.draw` can draw (`super_boundaries`: the second)."""

    def __init__(self, cfg, bcfg):
        if problems := unsupported(bcfg, cfg):
            raise ValueError("; ".join(problems))
        super().__init__(cfg, bcfg)
        d, H, N = cfg.d_model, cfg.n_heads, cfg.inner_layers
        hidden = round(cfg.token_mlp_mult * d)
        self.inner_down = nn.ModuleList(Block(d, H, hidden, None, cfg.attn_softcap, cfg.attn_backend) for _ in range(N))
        self.inner_up = nn.ModuleList(Block(d, H, hidden, None, cfg.attn_softcap, cfg.attn_backend) for _ in range(N))
        own = {} if cfg.inner_gamma is None else {"gamma": cfg.inner_gamma}  # --inner-gamma: its own discount
        self.inner = build_strategy(dataclasses.replace(bcfg, target_rate=cfg.inner_rate, force_last=False, **own), d)
        for part in (self.inner_down, self.inner_up):
            part.apply(self._init)
        self.inner.reset_parameters(cfg.init_std)
        self.inner_open = True  # whether it decides in training (`set_progress`: not before --inner-start)
        n_layers = cfg.n_down + cfg.n_mid + cfg.n_up + 2 * N  # as ByteLM scales its own blocks
        for name, p in [*self.inner_down.named_parameters(), *self.inner_up.named_parameters()]:
            if name.endswith("attn.proj.weight") or name.endswith("mlp.down.weight"):
                nn.init.normal_(p, std=cfg.init_std / n_layers**0.5 / 2**0.5)
        self.norm_early2 = RMSNorm(d)  # the second level's early exit starts as a copy of the output head
        with torch.random.fork_rng(devices=[]):
            self.head_early2 = nn.Linear(d, self.head.out_features, bias=False)
        with torch.no_grad():
            self.norm_early2.weight.copy_(self.norm_out.weight)
            self.head_early2.weight.copy_(self.head.weight)

    def set_progress(self, frac: float) -> None:
        """Training's progress through its schedule (0 to 1), told before each step: before --inner-start the
        second level does not decide in training (every token its own super-token) and its strategy does not train
        (`idle_parameters`). Outside training it always decides, so a checkpoint scores one way wherever it is read."""
        self.inner_open = frac >= self.cfg.inner_start

    def idle_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimizer must leave alone this step (the loop drops their gradients, so AdamW neither
        decays them nor counts the step in their moments): the second level's strategy before --inner-start."""
        return [] if self.inner_open else list(self.inner.parameters())

    def compile_stages(self, **options) -> None:
        """--compile for a two-level model: each transformer block compiled on its own (`compile_blocks`), not
        whole stages. Its step reads two counts from the device, the token and the super-token buckets, and a
        stage graph would break at the second; blocks hold the attention and MLP kernels either way."""
        self.compile_blocks(**options)

    def transformer_blocks(self) -> list[nn.Module]:
        """`ByteLM.transformer_blocks` with the inner layers' (compiled and sharded like the others; both token
        levels keep static shapes under `compile_blocks`)."""
        return [*self.down, *self.inner_down, *self.mid, *self.inner_up, *self.up]

    # -- whole sequences -----------------------------------------------------------------------------------

    def forward(self, ids, targets=None, *, noise=None, generator=None, prescribed=None, batch_stats=None,
                boundaries=None, rates=None) -> ModelOutput:
        """As `ByteLM.forward`; `boundaries` overrides the first level only, and `rates` is not supported."""
        if rates is not None:
            raise ValueError("a two-level model takes no target rates")
        if noise is None:  # per-byte uniforms for both levels, drawn as the first level would draw them
            greedy = not self.training and getattr(self.boundary.cfg, "eval_boundaries", "sample") == "greedy"
            noise = torch.full(ids.shape, 0.5, device=ids.device) if greedy else \
                torch.rand(ids.shape, generator=generator, device=ids.device)
        x, out, tokens, size, packing, z, out2, rope = self._levels(ids, noise, generator, prescribed, boundaries)
        supers, y1 = self._above(z, out2, tokens.pos, rope, packing)
        h = self.boundary.upsample(y1, x, tokens, out)  # (B,T,D)
        for blk in self.up:
            h = self._block(blk, h, rope)
        result = ModelOutput(logits=self._head(self.norm_out, self.head, h), boundaries=out, n_tokens=tokens.count,
                             token_slots=size, n_super=supers.count, inner_boundaries=out2,
                             super_slots=supers.x.shape[1] if self.token_bucket else None)
        if targets is not None:
            self._losses(result, x, targets, _level_reducer(batch_stats, 0))
            self._inner_losses(result, x, z, tokens, out2, targets, _level_reducer(batch_stats, 1))
        result.terms["boundary/inner_rate"] = (supers.count.sum() / tokens.count.sum()).float().detach()
        return result

    def _levels(self, ids, noise, generator=None, prescribed=None, boundaries=None):
        """Both levels' boundaries of (B,T) ids with per-byte uniforms `noise`: the byte states X, the first
        level's output and tokens (with their slot count and packing), the token states Z after the inner layers,
        the second level's output over tokens (padding never a boundary) and the byte RoPE table."""
        rope = self._byte_rope(ids)
        x, out = self._propose(ids, noise, generator, prescribed, None, rope)
        if boundaries is not None:
            out = override_boundaries(out, boundaries)
        size = self.token_slots(out.mask)
        tokens = self.boundary.downsample(x, out, size)  # (B,M,D)
        if self.chunks is not None:
            tokens.x = tokens.x + self.chunks(ids, out.mask, tokens.pos).to(tokens.x.dtype)
        packing = Packing.from_counts(tokens.count, tokens.x.shape[1]) if size is None else None
        z, out2 = self._second(tokens.x, tokens.pos, tokens.count, noise, rope, packing)
        return x, out, tokens, size, packing, z, out2, rope

    def _second(self, tok_x, pos, count, noise, rope, packing):
        """Token inputs (B,M,D) at byte positions pos (B,M), count (B,) real per row, through the inner layers
        (z) and the second level's draw over them (out2), each token drawn with its boundary byte's uniform from
        the per-byte `noise`: a text's draws depend neither on its later bytes nor on its batch (greedy
        evaluation: 0.5 at both levels). Padding is never a boundary (s_0 = 1 is real)."""
        real = torch.arange(tok_x.shape[1], device=tok_x.device)[None] < count[:, None]  # (B,M) real tokens
        z = self._tokens(self.inner_down, tok_x, pos, rope, packing)  # (B,M,D)
        u2 = inner_uniforms(noise).gather(1, pos)  # (B,M)
        out2 = self.inner.propose(z, real.long(), noise=u2, generator=None)
        if self.training and not self.inner_open:  # --inner-start: every token its own super-token
            out2 = override_boundaries(out2, real)
        out2.mask = out2.mask & real
        return z, out2

    def _above(self, z, out2, pos, rope, packing):
        """Super-tokens (the mid layers over them) and back to tokens through the inner up layers: (supers, y1
        (B,M,D)). Under --token-bucket the super-token level is padded to a bucket too (static shapes), else
        packed to the real super-tokens."""
        size = self.token_slots(out2.mask)
        supers = self.inner.downsample(z, out2, size)  # (B,K,D); pos: token indices
        y2 = self._tokens(self.mid, supers.x, pos.gather(1, supers.pos), rope,
                          None if size else Packing.from_counts(supers.count, supers.x.shape[1]))
        return supers, self._tokens(self.inner_up, self.inner.upsample(y2, z, supers, out2), pos, rope, packing)

    def super_boundaries(self, ids: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The second level's decisions at the bytes of (B,T) ids, drawn with per-byte uniforms `noise` as
        `forward` draws them: (probs, mask) (B,T), token j's p and s at its boundary byte b_j; 0 and False at the
        bytes that start no token (no super-token can start there). learntok.draw's level 2."""
        _, _, tokens, _, _, _, out2, _ = self._levels(ids, noise)
        real = torch.arange(out2.mask.shape[1], device=ids.device)[None] < tokens.count[:, None]  # (B,M)
        probs = torch.where(real, out2.probs.float(), 0.0)
        at_bytes = ids.new_zeros(ids.shape, dtype=torch.float32)
        probs = at_bytes.scatter_reduce(1, tokens.pos, probs, "amax")  # padding slots add 0 wherever they point
        mask = at_bytes.scatter_reduce(1, tokens.pos, out2.mask.float(), "amax") > 0.5
        return probs, mask

    def _tokens(self, blocks: nn.ModuleList, x: torch.Tensor, pos: torch.Tensor, rope_byte, packing: Packing | None
                ) -> torch.Tensor:
        """Full-causal layers over (B,M,D) states at byte positions pos (B,M): packed to the real ones, or every
        slot (--token-bucket; padding sits after the real ones, which causality keeps it from)."""
        if not len(blocks):
            return x
        if packing is None:
            rope = self._rope_at(rope_byte, pos)  # (B,1,M,dh/2)
            for blk in blocks:
                x = self._block(blk, x, rope)
            return x
        y, rope = packing.pack(x), self._rope_at(rope_byte, packing.pack(pos))  # (N,D), (1,N,dh/2)
        for blk in blocks:
            y = self._block(blk, y, rope, packing)
        return packing.unpack(y)

    def _inner_losses(self, res: ModelOutput, x: torch.Tensor, z: torch.Tensor, tokens: Tokens,
                      out2: BoundaryOutput, targets: torch.Tensor, reduce: StatsReducer | None) -> None:
        """The second level's early-exit loss and its strategy's terms (keys `.../inner_...`), added to `res`."""
        cfg = self.cfg
        valid = targets != IGNORE
        n = valid.sum().clamp(min=1)
        early_in = distribute_add(z, x, tokens)  # X + Z[c(t)]: the hierarchy without its second level
        if not self._early_trains(self.inner):
            early_in = early_in.detach()
        nll2 = self._nll(self._head(self.norm_early2, self.head_early2, early_in), targets)
        l_early2 = nll2.sum() / n
        res.nll_early2 = nll2.detach()
        res.loss = res.loss + cfg.lambda_early * l_early2
        res.terms["loss/early2"] = l_early2.detach()
        (B, T), M = targets.shape, z.shape[1]
        # R_j: the rewards of the bytes that read token j back, the first its decision can reach.
        r = ((nll2.detach() - res.nll.detach()) * valid).float()  # log p - log p_early2 per byte
        reward = F.pad(r.new_zeros(B, M).scatter_add_(1, tokens.index, r), (0, T - M))  # (B,T) columns
        real = F.pad(torch.arange(M, device=x.device)[None] < tokens.count[:, None], (0, T - M))
        padded = _pad_columns(out2, T)
        aux = self.inner.losses(padded, reward, torch.zeros_like(reward), real, reduce=reduce)
        second = aux.pop(BATCH_STATS, None)
        if second is not None:
            res.batch_stats = PairSums(res.batch_stats, second)
        # The strategy divides its losses by its own decision count, which depends on the first level's draw: a
        # weight per micro-batch (and rank) that a sum over the global batch does not have. The policy loss is a
        # sum per first-level decision instead (the joint estimator's scale); the rate loss per expected decision
        # (the first level's decisions x its target rate), which keeps its scale.
        if "loss/policy" in aux:  # a learned strategy (fixed groups have no losses and no free decisions)
            kept2 = (real & padded.free).sum().clamp(min=1)
            kept1 = (valid & res.boundaries.free).sum().clamp(min=1)
            aux["loss/policy"] = aux["loss/policy"] * kept2 / kept1
            if "loss/target" in aux:
                aux["loss/target"] = aux["loss/target"] * kept2 / (kept1 * self.boundary.cfg.target_rate)
        for k, v in aux.items():
            group, name = k.split("/", 1)
            res.terms[f"{group}/inner_{name}"] = v.detach() if torch.is_tensor(v) else v
            if group == "loss":  # before --inner-start the strategy does not train (0 x keeps DDP's graph whole)
                res.loss = res.loss + (v if self.inner_open else 0 * v)

    # -- one byte at a time --------------------------------------------------------------------------------

    def init_state(self, batch: int, noise: torch.Tensor) -> HierState:
        """As `ByteLM.init_state`, without token caches: the byte levels step with their caches, and each new
        token runs the token levels again over its row's tokens so far (`_step_tokens`)."""
        base = super().init_state(batch, noise)
        kept = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        dev = noise.device
        return HierState(**{**kept, "mid": []}, noise=noise,
                         tok_x=base.last_tok.new_zeros(batch, 16, self.cfg.d_model),
                         tok_pos=torch.zeros(batch, 16, dtype=torch.long, device=dev))

    def _step_tokens(self, tok_in: torch.Tensor, a_t: torch.Tensor, rope, state: HierState) -> torch.Tensor:
        """The newest token's output (B,D) in the rows where a_t: its input joins the row's tokens, and the token
        levels (inner layers, second level, mid, inner layers back) run over every row's tokens so far as
        `forward` runs them (all B rows, so a compiled attention kernel sees one batch size; other rows' values
        are not used). A token costs the token levels over the tokens so far instead of one cached step (a
        choice: per-layer token caches and the second level's own step would avoid it); the bytes between
        tokens cost the byte levels' cached step, as at one level."""
        t, B = state.pos, tok_in.shape[0]
        if int(state.count.max()) >= state.tok_x.shape[1]:
            state.tok_x = F.pad(state.tok_x, (0, 0, 0, state.tok_x.shape[1]))
            state.tok_pos = F.pad(state.tok_pos, (0, state.tok_x.shape[1] - state.tok_pos.shape[1]))
        rows = torch.arange(B, device=tok_in.device)
        slot = state.count.clamp(max=state.tok_x.shape[1] - 1)
        state.tok_x[rows, slot] = torch.where(a_t[:, None], tok_in.to(state.tok_x.dtype), state.tok_x[rows, slot])
        state.tok_pos[rows, slot] = torch.where(a_t, t, state.tok_pos[rows, slot])
        count = (state.count + a_t.long()).clamp(min=1)  # tokens per row (a row's first token is at BOS)
        M = int(count.max())
        x, pos = state.tok_x[:, :M], state.tok_pos[:, :M]
        table = self._rope(torch.arange(t + 1, device=tok_in.device))
        packing = Packing.from_counts(count, M)
        z, out2 = self._second(x, pos, count, state.noise[:, : t + 1], table, packing)
        _, y1 = self._above(z, out2, pos, table, packing)
        return y1[rows, count - 1].to(tok_in.dtype)

    # -- accounting ----------------------------------------------------------------------------------------

    def level_params(self) -> tuple[int, int, int]:
        """Matrix parameters per byte, per token and per super-token."""
        byte = matrix_count([self.down, self.up, self.head, self.head_early, self.head_early2])
        return (byte + self.boundary.matrix_params(), matrix_count([self.inner_down, self.inner_up])
                + self.inner.matrix_params(), matrix_count([self.mid]))

    def matrix_params(self) -> tuple[int, int]:
        """(byte-level, token-level) matrix parameters, the token level holding both token stacks and the
        second level's (FLOPs: `flops_conventions`, which counts each at its own length)."""
        byte, tok, sup = self.level_params()
        return byte, tok + sup

    def train_flops(self, n_bytes: float, n_tokens: float, n_supers: float | None = None) -> float:
        """6N FLOPs of n_bytes bytes that formed n_tokens tokens and n_supers super-tokens (the mid layers' count:
        required, or the mid layers would go uncounted)."""
        if n_supers is None:
            raise ValueError("a two-level model's FLOPs need its super-token count (n_supers)")
        byte, tok, sup = self.level_params()
        return 6.0 * (byte * n_bytes + tok * n_tokens + sup * n_supers)

    def flops_conventions(self, rows, seq_len, tokens, slots, token_pairs, supers=0.0, super_slots=0.0,
                          super_pairs=0.0) -> dict:
        """As `ByteLM.flops_conventions`, with the super-token level's counts (the mid layers run there)."""
        from learntok.model.flops import conventions, window_pairs

        byte, tok, sup = self.level_params()
        cfg = self.cfg
        byte_pairs = rows * window_pairs(seq_len, cfg.byte_window)
        attention = cfg.d_model * ((cfg.n_down + cfg.n_up) * byte_pairs + 2 * cfg.inner_layers * token_pairs
                                   + cfg.n_mid * super_pairs)
        return conventions(byte * rows * seq_len, tok, tokens, slots, attention, levels=((sup, supers, super_slots),))


