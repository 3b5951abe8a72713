"""The boundary-strategy interface: its config, its output, and the class every strategy subclasses.

A strategy sees the encoder output X (B,T,D) and the byte ids, and returns a `BoundaryOutput`. The U-Net
never branches on which strategy it runs: it calls `propose`, then `downsample` / `upsample` (which a strategy
may override with its own pooling), then `losses` with the per-byte log-likelihoods; for cached generation
`init_step_state` / `step` / `step_token_input` / `step_token_output`.

Each strategy's options are a frozen dataclass that subclasses `BoundaryConfig` in the strategy's own module
and sets the default of `boundaries` to the strategy's registered name; `--boundaries NAME` selects it, so
`learntok train --boundaries uniform --gamma 0.9` is an error (gamma is an option of `learned`).

Two contracts with the training loop live here too: `StatsReducer` (how a score-function strategy's batch
statistics become the global batch's) and the K-samples row layout (`repeat_samples` / `sample_groups`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Protocol, Self, TypeVar

import numpy as np
import torch
import torch.nn as nn

from learntok.boundaries.pooling import RunningMean, Tokens, distribute_add, mean_pool, select

BATCH_STATS = "batch_stats"
"""Key under which `losses` may return this micro-batch's local `BatchSums` (not a loss, not logged): the model
hands them out as `ModelOutput.batch_stats`, for the training loop to reduce over the global batch."""

LearnsBy = Literal["score_function", "straight_through", "prescribed", "random"]


class BatchSums(Protocol):
    """A score-function strategy's sums over a micro-batch of what its estimator averages over the batch (e.g.
    the per-position return for the baseline of eq. 17). The global batch's sums are the elementwise sums of the
    `stacked()` vectors of all micro-batches on all ranks; only the strategy knows the layout."""

    def stacked(self) -> torch.Tensor:
        """The sums as one 1-D tensor."""
        ...

    def unstacked(self, v: torch.Tensor) -> Self:
        """Sums of the same kind and shape holding the values `v`, a `stacked()` vector (e.g. the global one)."""
        ...


SumsT = TypeVar("SumsT", bound=BatchSums)
"""A strategy's own `BatchSums` type: a reducer returns the type it was given."""


class StatsReducer(Protocol):
    """What `BoundaryStrategy.losses` receives as `reduce`: maps this micro-batch's local sums to the global
    batch's (all ranks and accumulation micro-steps), of the same type. The training loop supplies it
    (learntok.train.parallel: all-reduced in the forward pass, from a pre-pass, or the previous step's). It is a
    pure function: it may run inside a compiled graph, so it must not mutate Python state."""

    def __call__(self, local: SumsT) -> SumsT: ...


def repeat_samples(x: torch.Tensor, k: int) -> torch.Tensor:
    """The K-samples row layout (`samples_per_sequence`): each of x's rows K times, in consecutive rows, so rows
    b*K .. b*K+K-1 are the K samples of sequence b. The training loop lays out its batch with it."""
    return x.repeat_interleave(k, 0) if k > 1 else x


def sample_groups(x: torch.Tensor, k: int) -> torch.Tensor:
    """(B, ...) rows laid out by `repeat_samples` -> (B/K, K, ...): the K samples of each sequence, as a view.
    A strategy that compares the samples of one text (learned's leave-one-out baseline) groups rows with it."""
    if x.shape[0] % k:
        raise ValueError(f"{x.shape[0]} rows do not split into groups of {k} samples per sequence")
    return x.view(x.shape[0] // k, k, *x.shape[1:])


@dataclass(frozen=True, kw_only=True)
class BoundaryConfig:
    """Options every boundary strategy has."""

    boundaries: str = ""
    """Boundary strategy (learned, uniform, uniform-random, whitespace, bpe, dynamic, hnet, entropy, flat);
    `learntok train --boundaries NAME --help` lists its options."""
    pooling: Literal["auto", "select", "mean"] = "auto"
    """Down/upsampling. auto: the strategy's own (select + distribute-add for learned, uniform, whitespace, bpe,
    entropy; mean pooling for dynamic; EMA dechunking for hnet), as the paper does; select: select +
    distribute-add for every strategy; mean: a token is the mean of its bytes' encoder states (dynamic and hnet
    keep their own). flat ignores it: every byte is its own token."""

    def __post_init__(self) -> None:
        own = type(self).__dataclass_fields__["boundaries"].default
        if self.boundaries != own:
            raise ValueError(f"{type(self).__name__} holds the options of --boundaries {own}, not {self.boundaries}")

    def converted(self, cls: type[BoundaryConfig]) -> BoundaryConfig:
        """The options of strategy config `cls`, keeping the values of the options both have (e.g. a preset's
        target rate and pooling when the command line switches to another strategy)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"boundaries"}
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in names})


@dataclass(frozen=True, kw_only=True)
class RateConfig(BoundaryConfig):
    """Options of strategies that aim at a downsampling rate."""

    target_rate: float = 0.2
    """Target downsampling rate pi_target (boundaries per byte)."""
    force_last: bool = False
    """Also force a boundary at the last byte of every sequence (the authors' code does)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.target_rate < 1:
            raise ValueError(f"target_rate must be in (0, 1), got {self.target_rate}")


@dataclass(frozen=True, kw_only=True)
class SampledConfig(RateConfig):
    """Options of strategies that draw boundaries from probabilities they learn (learned, dynamic)."""

    detach_encoder: bool = False
    """Stop the boundary predictor's gradient from flowing into the byte encoder (the paper lets it flow)."""
    eval_boundaries: Literal["sample", "greedy"] = "sample"
    """Boundaries at evaluation: one sample with a fixed seed (the paper) or greedy (p > 0.5)."""


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


@dataclass(kw_only=True)
class StepState:
    """What a strategy carries from one generated byte to the next; strategies subclass it."""

    noise: torch.Tensor
    """(B, T_total) boundary uniforms of every position to be generated."""
    group: RunningMean = field(default_factory=RunningMean)
    """The open group's running mean, for mean pooling."""


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
    """Base class. Subclasses set `config` and the class attributes, and implement `propose`."""

    config: ClassVar[type[BoundaryConfig]] = BoundaryConfig
    """The dataclass of this strategy's options (its `boundaries` default is the registered name)."""
    learns_by: ClassVar[LearnsBy]
    """How the boundaries are learned."""
    exactly_causal: ClassVar[bool] = True
    """False for strategies whose boundaries peek ahead by construction (BPE guidance: a token's extent depends
    on bytes after it); they report a measured leak rate instead of passing the exact no-lookahead test."""
    uses_rewards: ClassVar[bool] = False
    """True if `losses` needs per-byte log-likelihoods of the main and early-exit heads (the early-exit
    head then trains the encoder too; otherwise it is a detached probe)."""
    own_pooling: ClassVar[bool] = False
    """True if the strategy overrides `downsample` / `upsample` with its own pooling (dynamic, hnet);
    `--pooling mean` then leaves it alone."""
    has_step: ClassVar[bool] = False
    """True if `init_step_state` / `step` are implemented (cached generation); otherwise generation
    recomputes the full forward pass for every byte."""
    rate_knob: ClassVar[bool] = False
    """True if the strategy takes target rates at run time: `propose(..., rates=)` (learntok.boundaries.rates)
    and `set_rate` (the rate every later call asks for)."""

    @property
    def traces_whole(self) -> bool:
        """True if torch.compile captures `propose` without a graph break, so `ByteLM.compile_stages` compiles
        with fullgraph=True (a break is then an error, not a silent slowdown). Every registered strategy does
        (tests/test_compile.py); a subclass with a data-dependent Python loop returns False."""
        return True

    @property
    def samples_per_sequence(self) -> int:
        """Rows each training sequence occupies in the batch (K boundary samples of the same text, laid out by
        `repeat_samples`; `sample_groups` groups them back). Default 1."""
        return 1

    def __init__(self, cfg: BoundaryConfig, dim: int):
        super().__init__()
        if not isinstance(cfg, self.config):
            raise TypeError(f"{type(self).__name__} needs a {self.config.__name__}, got {type(cfg).__name__}")
        self.cfg = cfg

    @property
    def mean_pooling(self) -> bool:
        """`--pooling mean` on a strategy with the default pooling: tokens are the means of their bytes."""
        return self.cfg.pooling == "mean" and not self.own_pooling

    def reset_parameters(self, init_std: float) -> None:
        """Initialise this strategy's weights; the U-Net calls it once, in its own initialisation order.
        Default: every Linear weight ~ N(0, init_std^2), biases as PyTorch made them."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=init_std)

    def set_rate(self, rate: float | None) -> None:
        """Ask for boundary rate `rate` in every later call (None: the trained default); strategies with a
        `rate_knob` implement it."""
        raise ValueError(f"--boundaries {self.cfg.boundaries} has no rate knob (--rate needs a learned policy)")

    def training_rates(self, seed: int, step: int, rows, total_rows: int, device):
        """The per-row target rates (`Rates`) of training step `step` for global rows `rows` of `total_rows`, or
        None (the default: one fixed rate, the strategy's own)."""
        return None

    def prepare(self, train_docs: list[bytes], val_docs: list[bytes], run_dir: Path | None) -> None:
        """Called once before training or evaluation with the raw documents, e.g. to train a BPE tokenizer
        (saved in, and on resume reloaded from, `run_dir`). Default: nothing."""

    def artifacts(self) -> list[str]:
        """Files/directories (relative to the run directory) that `prepare` saved and that a shared model needs
        (e.g. the BPE tokenizer); `save_pretrained` copies them. Default: none."""
        return []

    def artifact_sources(self, run_dir: Path) -> dict[str, Path]:
        """Where each of `artifacts()` is read from when the model is exported from `run_dir` (default: the run
        directory itself)."""
        return {name: Path(run_dir) / name for name in self.artifacts()}

    def exported_config(self, bcfg: dict) -> dict:
        """The boundary section an exported model's config.json stores (default: `bcfg` unchanged; a strategy
        whose files live outside the run points them at the exported copies)."""
        return bcfg

    def annotate(self, doc: bytes) -> np.ndarray | None:
        """Per-byte prescribed boundary flags of one document (bool, len(doc)), computed once per document by
        the data pipeline and cached beside the bytes; they reach `propose` as `prescribed`. None (the
        default) means the strategy needs no such flags."""
        return None

    @property
    def annotator(self):
        """`annotate` if this strategy prescribes boundaries from text (e.g. BPE), else None."""
        return self.annotate if type(self).annotate is not BoundaryStrategy.annotate else None

    def propose(self, x: torch.Tensor, ids: torch.Tensor, *, noise: torch.Tensor | None,
                generator: torch.Generator | None, prescribed: torch.Tensor | None = None) -> BoundaryOutput:
        """Draw boundaries. x (B,T,D) encoder output, ids (B,T) byte ids; noise (B,T) uniforms in [0,1)
        if given (tests inject it), else drawn from `generator`; prescribed (B,T) bool flags from `annotate`.
        A strategy with a `rate_knob` also takes `rates=` (learntok.boundaries.rates.Rates, per-row targets)."""
        raise NotImplementedError

    def downsample(self, x: torch.Tensor, out: BoundaryOutput, size: int | None = None) -> Tokens:
        """Tokens from the encoder output x (B,T,D) at `out.mask`; size: token slots M (None = the largest
        count; the U-Net passes a bucketed one under --token-bucket)."""
        if self.mean_pooling:
            return mean_pool(x, out.mask, out.mask.float(), size)
        return select(x, out.mask, size)

    def upsample(self, y_tok: torch.Tensor, x: torch.Tensor, tokens: Tokens, out: BoundaryOutput) -> torch.Tensor:
        return distribute_add(y_tok, x, tokens)

    def losses(self, out: BoundaryOutput, logp: torch.Tensor | None, logp_early: torch.Tensor | None,
               valid: torch.Tensor, reduce: StatsReducer | None = None) -> dict[str, torch.Tensor]:
        """Auxiliary loss terms (keys `loss/...`, already weighted, summed into the total) and statistics.

        logp, logp_early: (B,T) log-likelihood of each position's target under the main and early-exit
        heads (detached). valid: (B,T) bool, False at padding. reduce: maps this micro-batch's `BatchSums` to
        the global batch's (`StatsReducer`); None = this batch is global. A strategy that uses `reduce` also
        returns the local sums it gave it under the key BATCH_STATS. Code here may run inside a compiled graph,
        so it must not mutate Python state."""
        return {}

    def matrix_params(self) -> int:
        """Parameters of this strategy's matrices, for the 6 x params FLOPs accounting (per byte)."""
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2)

    # -- cached generation ---------------------------------------------------------------------------------

    def init_step_state(self, batch: int, noise: torch.Tensor) -> StepState:
        """State for `step`; noise (B, T_total) holds the boundary uniforms of every future position."""
        return StepState(noise=noise)

    def step(self, x_t: torch.Tensor, ids_t: torch.Tensor, t: int,
             state: StepState) -> tuple[torch.Tensor, torch.Tensor]:
        """Boundary at byte position t from the encoder state x_t (B,D) and byte ids_t (B,), updating `state`:
        returns (a_t (B,) bool, p_t (B,)). Must equal `propose` on the full sequence with the same noise."""
        raise NotImplementedError

    def step_token_input(self, x_t: torch.Tensor, a_t: torch.Tensor, state: StepState) -> torch.Tensor:
        """The token-level input for rows where a token ends at this byte (select: x_t (B,D); mean pooling:
        the running mean of the group ending here)."""
        return state.group.update(x_t, a_t) if self.mean_pooling else x_t

    def step_token_output(self, y_t: torch.Tensor, a_t: torch.Tensor, p_t: torch.Tensor, last: torch.Tensor,
                          state: StepState) -> torch.Tensor:
        """What later bytes add back (distribute-add: the newest token's output y_t where a_t)."""
        return torch.where(a_t[:, None], y_t, last)

    def step_upsample(self, x_t: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The decoder's input for this byte from its encoder state and `step_token_output`'s value (B,D):
        distribute-add, as `upsample`."""
        return x_t + last
