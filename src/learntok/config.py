"""Configuration: frozen dataclasses, one per component.

    TrainConfig            a whole run: lengths, batching, devices, logging, checkpoints
      .model  ModelConfig    the U-Net and its loss weights
      .boundary  <strategy>  the boundary strategy's own options (e.g. LearnedConfig in boundaries/learned.py)
      .data   DataConfig     where the bytes come from and how they become sequences
      .optim  OptimConfig    AdamW and the learning-rate schedule

Every field carries an attribute docstring; `tyro` turns them into `learntok train --help`. Leaf names are
unique across the nested dataclasses so the command line spells them without prefixes (`--d-model`,
`--policy-window`, `--lr`). Presets are plain functions returning a `TrainConfig` (learntok.presets).
`to_dict` / `from_dict` are the JSON form of config.json; `from_dict` also reads version-1 configs (the flat
`BoundaryConfig` of learntok 0.1) and version-2 ones (before `policy_norm` was a flag) and converts them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, Literal, TypeVar

import tyro

from learntok.boundaries import BoundaryConfig, config_class
from learntok.boundaries.learned import LearnedConfig

CONFIG_VERSION = 3
"""Bumped whenever a field changes meaning; `from_dict` converts older versions (`upgrade`) and refuses others."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The autoregressive U-Net (docs/method.md): byte encoder -> tokens -> byte decoder, and its losses."""

    d_model: int = 128
    """Width of every stage (d_enc = d_mid = d_dec)."""
    n_heads: int = 2
    """Attention heads at both levels; d_model / n_heads must be even (RoPE)."""
    n_down: int = 1
    """Byte-level encoder layers (sliding-window attention) before the boundaries are drawn."""
    n_mid: int = 2
    """Token-level layers (full causal attention over tokens)."""
    n_up: int = 1
    """Byte-level decoder layers (sliding-window attention) after upsampling."""
    byte_window: int = 64
    """Sliding-window size of byte-level attention: byte i sees bytes i-window+1 .. i."""
    byte_mlp_mult: float = 1.0
    """Byte-level GeGLU hidden width as a multiple of d_model (paper: 1)."""
    token_mlp_mult: float = 4.0
    """Token-level GeGLU hidden width as a multiple of d_model (paper: 4)."""
    attn_softcap: float = 50.0
    """Gemma-2 attention-logit soft-cap c in c*tanh(z/c); 0 disables it."""
    final_softcap: float = 30.0
    """Gemma-2 final-logit soft-cap (both output heads); 0 disables it (the authors' code has it off)."""
    rope_base: float = 10000.0
    """RoPE base. Token-level positions are the byte indices of the boundary bytes."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of matrices."""
    attn_backend: Literal["auto", "eager", "sdpa", "flex"] = "auto"
    """Attention kernel: eager (pure PyTorch, supports soft-capping), sdpa (PyTorch fused; only without the
    attention soft-cap), flex (FlexAttention, fused with the soft-cap under torch.compile), auto (flex on CUDA;
    on CPU sdpa when attn_softcap == 0, else eager)."""
    residual_dtype: Literal["fp32", "autocast"] = "fp32"
    """dtype of the residual stream between blocks under autocast (--precision bf16-mixed): fp32, or
    the autocast dtype, bf16, as in the authors' pure-bf16 code. bf16 takes 9 % less activation
    memory; docs/gpu.md measures its effect on the loss. Norms, logits, losses and the estimator
    compute in fp32 either way; without autocast the stream is the weights' dtype."""
    token_bucket: int = 0
    """Token-level length: 0 = each batch's exact largest token count, the token level packed to the real
    tokens (fewest FLOPs; the shape changes every batch); N = that count rounded up to a multiple of N, the
    padded slots computed and ignored (static shapes, so --compile builds one graph per bucket). Results are the
    same either way; this is an execution choice, not a change of model."""
    lambda_early: float = 1e-1
    """Weight of the early-exit head's language-modelling loss (eq. 27)."""
    code_loss_weights: bool = False
    """Weight L_auto by (1 - lambda_early) as the authors' code does, instead of by 1 (eq. 27)."""
    arch: Literal["unet", "token"] = "unet"
    """unet: the byte-level U-Net; token: a standard BPE-tokenized transformer (n_mid blocks over BPE tokens, no
    byte layers; needs --boundaries bpe --bpe-vocab-size N), the tokenized baseline."""
    early_loss_to_encoder: Literal["rewards", "always", "never"] = "rewards"
    """Which strategies' encoders the early-exit loss trains: rewards (only those whose estimator uses the
    early-exit head, i.e. learned; for the others it is a detached probe), always (every strategy: the control
    that gives baselines the same auxiliary loss), or never (a detached probe for every strategy; learned then
    takes its rewards from the probe: the control from the other side)."""

    ngram_sizes: tuple[int, ...] = ()
    """Hashed byte n-gram embeddings added to the byte embedding (the Byte Latent Transformer's; not in the paper):
    the sizes n, e.g. 3 4 5 6 7 8; empty: none. A lookup, so no FLOPs; causal (position t reads bytes <= t)."""
    ngram_table: int = 16384
    """Rows of each n-gram size's hashed embedding table (--ngram-sizes)."""
    chunk_table: int = 0
    """Rows of a hashed embedding of each token's bytes, added to the token level's input (a learned vocabulary of
    the chunks the boundaries cut, at the cost of a lookup; not in the paper); 0: none. A token closed at byte b
    reads bytes <= b only."""
    inner_layers: int = 0
    """A second boundary level (a two-level hierarchy, bytes -> tokens -> super-tokens; not in the paper, which
    leaves deeper hierarchies open): this many full-causal token layers before and as many after it, around the
    n_mid layers, which then run over super-tokens. The second level's strategy is --boundaries' own (learned or
    uniform) at --inner-rate; 0: one level, the paper's U-Net (docs/method.md §9)."""
    inner_rate: float = 0.5
    """With --inner-layers: the second level's target rate, super-token boundaries per token."""
    inner_gamma: float | None = None
    """With --inner-layers and --boundaries learned: the second level's discount per token (its returns sum
    gamma'^k R_{j+k} over the tokens after j); None: --gamma, the first level's discount per byte. Below 1 it
    biases the second level's gradient for lower variance, as --gamma does the first's (docs/method.md §9)."""
    inner_start: float = 0.0
    """With --inner-layers: the share of training before the second level decides (of the learning-rate schedule:
    of the bytes after warm-up, or of --time-budget / --flops-budget with those schedules). Until then every token
    is its own super-token in training and the second level's strategy does not train: the token levels learn a
    one-level model first, and the second level's grouping then meets a model not yet adapted to any (a curriculum;
    not in the paper). 0: it decides from the first step. Outside training (evaluation, a loaded checkpoint) it
    always decides."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ngram_sizes", tuple(int(n) for n in self.ngram_sizes))  # JSON gives a list
        if any(n < 2 for n in self.ngram_sizes) or self.ngram_table < 1 or self.chunk_table < 0:
            raise ValueError(f"ngram_sizes must be >= 2, ngram_table >= 1 and chunk_table >= 0, got "
                             f"{self.ngram_sizes}, {self.ngram_table}, {self.chunk_table}")
        if self.n_heads < 1 or self.d_model < 1:
            raise ValueError(f"d_model and n_heads must be >= 1, got {self.d_model}, {self.n_heads}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even size")
        if self.token_bucket < 0:
            raise ValueError(f"token_bucket must be >= 0, got {self.token_bucket}")
        if min(self.n_down, self.n_up) < 1 or self.n_mid < 0 or self.byte_window < 1:
            raise ValueError("n_down and n_up must be >= 1, n_mid >= 0 and byte_window >= 1")
        if self.inner_layers < 0 or not 0 < self.inner_rate < 1:
            raise ValueError(f"inner_layers must be >= 0 and inner_rate in (0, 1), got {self.inner_layers}, "
                             f"{self.inner_rate:g}")
        if self.inner_gamma is not None and (not self.inner_layers or not 0 <= self.inner_gamma <= 1):
            raise ValueError(f"--inner-gamma needs --inner-layers and a value in [0, 1], got {self.inner_gamma:g} "
                             f"with --inner-layers {self.inner_layers}")
        if self.inner_start and (not self.inner_layers or not 0 < self.inner_start < 1):
            raise ValueError(f"--inner-start needs --inner-layers and a value in [0, 1), got {self.inner_start:g} "
                             f"with --inner-layers {self.inner_layers}")
        if self.inner_layers and self.arch != "unet":
            raise ValueError("--inner-layers (a second boundary level) needs --arch unet")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the bytes come from and how documents become fixed-length sequences."""

    source: Annotated[str, tyro.conf.arg(name="data")] = "stdlib"
    """Training data: 'stdlib' (this Python's standard-library sources), a file, directory or glob of
    .txt/.md/.py/.jsonl/.parquet (optionally .gz/.xz/.zst), or hf:NAME[:SPLIT] for a local Hugging Face
    dataset."""
    val_data: str | None = None
    """Validation data (same spellings). Default: a split of --data (its valid file, or a hash split)."""
    text_field: str = "text"
    """Field holding the text in .jsonl/.parquet/Hugging Face rows."""
    encoding: str = "utf-8"
    """How whole-file documents (.txt, .md, .py, ...) are read: 'utf-8' (files that are not UTF-8 are skipped as
    binary), 'bytes' (every file's bytes as they are: a byte-level model needs no decoding), or a Python codec
    such as 'latin-1' (decoded, then trained on as UTF-8)."""
    seq_len: int = 512
    """Bytes predicted per sequence; the model sees BOS plus seq_len - 1 bytes (paper: 4096)."""
    pack: bool = True
    """Pack documents (EOS-separated) into sequences; --no-pack keeps only documents of at least seq_len
    bytes and truncates them (the paper's rule)."""
    val_fraction: float = 0.05
    """Share of documents held out (by a hash of the document key) when no validation split is given."""
    val_bytes: int = 262_144
    """Bytes of validation data used per evaluation (the first sequences of the validation split)."""
    stream: bool = False
    """With hf: data, stream the rows instead of reading them (each process its share, shuffled by a buffer; no
    memory grows with the dataset; docs/data.md says when a resume is exact)."""
    shuffle_buffer: int = 10_000
    """Rows in the shuffle buffer of --stream (1 = stream order)."""
    verify_data: bool = True
    """Check the checksums of a prepared corpus's shards when opening it (about 1 s per GB; sizes are always
    checked)."""


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW and the learning-rate schedule: linear warm-up, then cosine decay."""

    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of --lr at the end of the cosine."""
    warmup_bytes: float = 0.0
    """Linear warm-up length in bytes."""
    schedule: Literal["bytes", "time", "flops"] = "bytes"
    """What the cosine runs over: bytes (to --max-steps/--max-bytes; reproducible), time (elapsed /
    --time-budget: every run decays fully within its wall-clock budget, for equal-time comparisons;
    --max-steps/--max-bytes then only cap the run; not bit-reproducible), or flops (FLOPs spent /
    --flops-budget under --flops-convention: equal-compute comparisons of strategies whose FLOPs per byte vary;
    reproducible). Warm-up is in bytes."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (not on norms, biases or the byte embedding)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2 (paper: 0.999)."""
    grad_clip: float = 1.0
    """Global gradient-norm clipping threshold; 0 disables it."""

    def __post_init__(self) -> None:
        finite = all(math.isfinite(x) for x in (self.lr, self.weight_decay, self.grad_clip, self.warmup_bytes,
                                                 self.beta1, self.beta2, self.min_lr_ratio))
        if not finite or self.lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0 or self.warmup_bytes < 0:
            raise ValueError(f"lr must be finite and > 0 and weight_decay, grad_clip, warmup_bytes finite and >= 0 "
                             f"(got lr={self.lr}, weight_decay={self.weight_decay}, grad_clip={self.grad_clip}, "
                             f"warmup_bytes={self.warmup_bytes})")


B = TypeVar("B", bound=BoundaryConfig)


@dataclass(frozen=True, kw_only=True)
class TrainConfig(Generic[B]):
    """A whole training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    boundary: B = field(default_factory=LearnedConfig)  # pyright: ignore
    """The boundary strategy's options; --boundaries NAME picks the strategy (and which options exist)."""
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    preset: str = "tiny"
    """Preset to start from: tiny, small, paper-147m, paper-90m-code, paper-aspect-N (other flags override)."""
    resume: str = ""
    """Resume the run in this directory from its latest checkpoint (its config.json; other flags override)."""
    overwrite: bool = False
    """Replace an existing run in --out (default: the command line picks a fresh OUT-2, OUT-3, ...)."""
    out: str = "runs/tiny"
    """Run directory: config.json, metrics.jsonl, checkpoints."""
    batch_size: int = 8
    """Sequences per optimizer update (the global batch, over all processes)."""
    micro_batch_size: int = 0
    """Sequences per forward pass in each process; 0 = the whole per-process batch (no accumulation)."""
    max_steps: int = 0
    """Optimizer updates to train for; when given (> 0) it overrides --max-bytes."""
    max_bytes: float = 0.0
    """Training length in bytes (used when max_steps is 0)."""
    time_budget: float = 0.0
    """Stop training after this many seconds of training time (0 = no limit)."""
    flops_budget: float = 0.0
    """Stop training once this many training FLOPs are spent, counted by --flops-convention (0 = no limit)."""
    flops_convention: Literal["6n", "6n-padded", "total"] = "6n"
    """How --flops-budget counts: 6n (the paper's 6 x matrix parameters per byte / real token), 6n-padded
    (token level at its padded slots), total (6n plus attention's products); learntok.model.flops."""
    seed: int = 0
    """Seed for initialisation, data order and boundary sampling."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto (CUDA when available)."""
    batch_stats: Literal["prepass", "lagged"] = "prepass"
    """Where the estimator's batch-relative baseline (and the rate loss's mean p) comes from when a micro-batch
    is not the whole batch (accumulation, several processes). prepass: the current global batch, eq. 17
    exactly, at the price of one no-grad forward pass per micro-batch under accumulation. lagged: the previous
    step's global batch: no pre-pass, still unbiased (the baseline does not depend on the current draws), the
    rate controller one step late (not in the paper; docs/distributed.md). No effect in one process without
    accumulation."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun: DistributedDataParallel, or FSDP2 (fully_shard per block) for models that do not fit
    one device. Ignored in a single process."""
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    """Numerics: fp32; bf16-mixed (bf16 autocast over fp32 weights and optimizer state); bf16 (pure bf16
    weights, activations and optimizer state, as the authors' code trains); auto = bf16-mixed on CUDA, fp32 on
    CPU. Logits, losses and the estimator's returns are fp32 in every mode."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of storing them: less
    memory for long sequences, about one more forward pass of compute."""
    compile: bool = False
    """torch.compile the model's two training stages (encoder + boundaries; the rest + losses) with static
    token shapes: --token-bucket N, 64 when not given (one graph per bucket; docs/gpu.md). Each stage is one
    graph (fullgraph: a graph break is an error) except for a policy window wider than 8. Evaluation runs
    eagerly."""
    threads: int = 0
    """CPU threads for PyTorch (0 = PyTorch's default)."""
    log_every: int = 10
    """Steps between metric lines in metrics.jsonl."""
    eval_every: int = 100
    """Steps between validation evaluations (0 = only at the end)."""
    ckpt_every: int = 200
    """Steps between checkpoints (0 = only at the end). Checkpoints are written atomically; SIGTERM, SIGUSR1
    and Ctrl-C also write one."""
    max_bad_steps: int = 10
    """Stop (with a checkpoint) after this many updates in a row with a non-finite loss or gradient norm; each
    such update is skipped and logged."""
    progress: bool = True
    """Report progress between evaluations (--no-progress: only evaluations and the summary)."""
    progress_style: Literal["auto", "bar", "lines"] = "auto"
    """How: a progress bar, or one plain line per --log-every steps (for SLURM / Kubernetes logs); auto = a bar
    when stderr is a terminal, lines otherwise."""
    tensorboard: bool = False
    """Also log scalars and a boundary-map image per evaluation to RUN/tensorboard (pip install
    'learntok[tensorboard]')."""
    wandb: bool = False
    """Also log the config, every metric and a boundary-map image per evaluation to Weights & Biases (pip install
    'learntok[wandb]'; WANDB_MODE=offline needs no network)."""
    wandb_project: str = "learntok"
    """W&B project of --wandb."""
    wandb_entity: str = ""
    """W&B entity (user or team) of --wandb; empty: your default."""


def to_dict(cfg: TrainConfig) -> dict:
    """A JSON-ready dict of a TrainConfig, with the config version."""
    d = dataclasses.asdict(cfg)
    d["config_version"] = CONFIG_VERSION
    return d


def build(cls: type, d: dict, where: str) -> Any:
    """Instantiate dataclass `cls` from a dict; an unknown key is an error naming it."""
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a section of keys and values, got {type(d).__name__} {d!r:.60}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown config key(s) in {where}: {', '.join(unknown)}")
    try:
        return cls(**d)
    except TypeError as e:  # a value of the wrong type met arithmetic in a check (d_model: "abc")
        raise ValueError(f"{where}: a value of the wrong type ({e})") from e


def boundary_from_dict(d: dict, where: str = "boundary") -> BoundaryConfig:
    """A strategy's options from their dict; `boundaries` names the strategy."""
    if "boundaries" not in d:
        raise ValueError(f"{where}: no 'boundaries' key naming the strategy")
    return build(config_class(d["boundaries"]), d, where)


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig}


def from_dict(d: dict) -> TrainConfig:
    """Rebuild a TrainConfig; unknown keys or an unknown config version are errors, never silently dropped."""
    d = dict(d)
    d = upgrade(d, d.pop("config_version", None))
    kw = {k: build(cls, d.pop(k), f"config.{k}") for k, cls in _SECTIONS.items() if k in d}
    if "boundary" in d:
        kw["boundary"] = boundary_from_dict(d.pop("boundary"), "config.boundary")
    return build(TrainConfig, {**d, **kw}, "config")


_V1_OPTIM = ("lr", "min_lr_ratio", "warmup_bytes", "schedule", "weight_decay", "beta1", "beta2", "grad_clip")
_V1_MODEL = ("lambda_early", "code_loss_weights")
_V1_BOUNDARY = {"boundaries", "target_rate", "policy_window", "logit_scale", "logit_softcap", "force_last",
                "detach_encoder", "gamma", "normalize_advantage", "value_baseline", "lambda_policy", "lambda_target",
                "pooling", "gumbel_temperature", "prior_weight", "ratio_loss_weight", "bpe_vocab_size",
                "entropy_model", "entropy_threshold", "eval_boundaries"}
"""The options of version 1's flat BoundaryConfig (besides _V1_MODEL)."""


def upgrade(d: dict, version) -> dict:
    """A config dict (or a dict with its `model` and `boundary` sections) of `version`, in the current version."""
    if version == 1:
        d, version = upgrade_v1(d), 2
    if version == 2:
        d, version = upgrade_v2(d), 3
    if version != CONFIG_VERSION:
        raise ValueError(f"config version {version} is not supported (this learntok reads versions 1 to "
                         f"{CONFIG_VERSION})")
    return d


def upgrade_v2(d: dict) -> dict:
    """Version 2 -> 3: the learned policy's RMSNorm became an option (`policy_norm`); runs before it had it."""
    boundary = d.get("boundary", {})
    if boundary.get("boundaries") == "learned" and "policy_norm" not in boundary:
        d = {**d, "boundary": {**boundary, "policy_norm": True}}
    return d


def upgrade_v1(d: dict) -> dict:
    """Version 1 (learntok 0.1: one flat BoundaryConfig, `data_cfg`, optimizer fields on TrainConfig) -> 2.

    Options move to where they live now; options of other strategies, which the run's strategy never read,
    are dropped (so the conversion changes nothing the run did); unknown keys stay, to be reported."""
    d = dict(d)
    boundary = dict(d.pop("boundary", {}))
    model = dict(d.pop("model", {}))
    for k in _V1_MODEL:
        if k in boundary:
            model[k] = boundary.pop(k)
    cls = config_class(boundary.get("boundaries", "learned"))
    own = {f.name for f in dataclasses.fields(cls)}
    data = dict(d.pop("data_cfg", {}))
    if "data" in data:
        data["source"] = data.pop("data")
    return {**{k: v for k, v in d.items() if k not in _V1_OPTIM}, "model": model, "data": data,
            "optim": {k: d[k] for k in _V1_OPTIM if k in d},
            "boundary": {k: v for k, v in boundary.items() if k in own or k not in _V1_BOUNDARY}}


def load_json(path: str) -> TrainConfig:
    """A TrainConfig from a run's config.json (its `run_info` provenance is ignored); ValueError naming the file
    for one that is not valid JSON, not an object, an exported model's, or missing a section."""
    with open(path) as f:
        try:
            d = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not valid JSON ({e}); the run's config is damaged") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path}: not a run's config (a JSON {type(d).__name__}, not an object)")
    if "architectures" in d or "format" in d:
        raise ValueError(f"{path}: an exported model's config, not a training run's (--resume continues runs; eval, "
                         "generate and learntok.from_pretrained read exports)")
    missing = [k for k in ("model", "boundary", "data", "optim") if k not in d] if d.get("config_version", 1) != 1 \
        else []
    if missing:
        raise ValueError(f"{path}: the run's config has no {', '.join(missing)} section(s); it is damaged")
    d.pop("run_info", None)
    try:
        return from_dict(d)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
