"""Configuration: frozen dataclasses, one per component, and the presets.

Every field carries an attribute docstring; `tyro` turns them into `learntok train --help`. Field names are
unique across the nested dataclasses so the command line can spell them without prefixes
(`--d-model`, `--policy-window`, `--max-steps`). Presets are plain functions returning a `TrainConfig`
(see `learntok.presets`); the command line only overrides fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

CONFIG_VERSION = 1
"""Bumped whenever a field changes meaning; `from_dict` refuses configs from another version."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The autoregressive U-Net (method.md §1): byte encoder -> tokens -> byte decoder."""

    d_model: int = 128
    """Width of every stage (d_enc = d_mid = d_dec)."""
    n_heads: int = 2
    """Attention heads at both levels; d_model must be divisible by it."""
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
    """RoPE base. Token-level positions are the byte indices of the boundary bytes (method.md §8.9)."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of matrices and embeddings."""
    attn_backend: Literal["auto", "eager", "sdpa"] = "auto"
    """Attention kernel: eager (pure PyTorch, supports soft-capping), sdpa (PyTorch fused; only without the
    attention soft-cap), auto (sdpa when attn_softcap == 0, else eager)."""


@dataclass(frozen=True, kw_only=True)
class BoundaryConfig:
    """How token boundaries are drawn and, for `learned`, how the policy is trained (method.md §2-3)."""

    boundaries: str = "learned"
    """Boundary strategy: learned (the paper's score-function policy), uniform (every 1/target_rate bytes);
    see `learntok.boundaries.REGISTRY` for all."""
    target_rate: float = 0.2
    """Target downsampling rate pi_target (boundaries per byte)."""
    policy_window: int = 8
    """Previous boundaries the policy conditions on (w in eq. 21); 0 = independent Bernoulli per byte.
    The authors' code 'window 8' corresponds to 7 here, its 'w = 1' to 0 (method.md §8.1)."""
    logit_scale: float = 16.0
    """D in l_scaled = l_raw / D + logit(pi_target)."""
    logit_softcap: float = 6.0
    """Soft-cap of the boundary logits in training (c*tanh(l/c)); 0 disables it. None at evaluation."""
    force_last: bool = False
    """Also force a boundary at the last byte of every sequence (the authors' code does)."""
    detach_encoder: bool = False
    """Stop the policy gradient from flowing into the byte encoder (the paper lets it flow)."""
    gamma: float = 0.99
    """Time discount of the returns G_i = sum_j gamma^j R_{i+j+1} (eq. 16)."""
    normalize_advantage: bool = False
    """Divide advantages by their batch standard deviation (not in the paper; off by default)."""
    value_baseline: bool = False
    """Subtract a learned baseline V(X_t) ~ E[G_t | bytes <= t] (a linear head on the detached encoder state,
    trained by squared error) from the returns before the batch-relative centring. It does not depend on a_t,
    so the estimator stays unbiased; it removes the content-driven part of the returns' variance (not in the
    paper; off by default)."""
    lambda_policy: float = 1e-2
    """Weight of the policy (REINFORCE) loss."""
    lambda_target: float = 1e-2
    """Weight of the rate-targeting loss mean(l) * sg(mean(p) - pi_target) (eq. 24)."""
    lambda_early: float = 1e-1
    """Weight of the early-exit head's language-modelling loss."""
    code_loss_weights: bool = False
    """Weight L_auto by (1 - lambda_early) as the authors' code does, instead of by 1 (eq. 27)."""
    pooling: Literal["auto", "select", "mean"] = "auto"
    """Down/upsampling. auto: each strategy's own (select for learned, uniform, whitespace, bpe, entropy; mean
    pooling for dynamic; EMA dechunking for hnet), as the paper does; select: select + distribute-add for
    every strategy; mean: a token is the mean of its bytes' encoder states (strategies with their own pooling,
    dynamic and hnet, keep theirs)."""
    gumbel_temperature: float = 1.0
    """dynamic: temperature of the Gumbel-sigmoid relaxation (the paper's port: 1.0; Nawrot's code: 0.5)."""
    prior_weight: float = 1.0
    """dynamic: weight of the binomial prior pulling the boundary count toward target_rate (Nawrot: 1)."""
    ratio_loss_weight: float = 0.03
    """hnet: weight alpha of H-Net's ratio loss (N = 1/target_rate)."""
    bpe_vocab_size: int = 0
    """bpe: vocabulary size of the byte-level BPE tokenizer; 0 = search for the size whose held-out rate is
    closest to target_rate."""
    entropy_model: str = ""
    """entropy: directory of the small byte LM trained by `learntok train-entropy-model`."""
    entropy_threshold: float = 0.0
    """entropy: boundary when the next-byte entropy (nats) exceeds this; 0 = calibrate on held-out text so
    the rate is close to target_rate."""
    eval_boundaries: Literal["sample", "greedy"] = "sample"
    """Boundaries at evaluation: one sample with a fixed seed (the paper) or greedy (p > 0.5)."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the bytes come from and how documents become fixed-length sequences."""

    data: str = "stdlib"
    """Training data: 'stdlib' (this Python's standard-library sources), a file, directory or glob of
    .txt/.jsonl/.parquet (optionally .gz/.xz/.zst), or hf:NAME for a locally cached Hugging Face dataset."""
    val_data: str | None = None
    """Validation data (same spellings). Default: a split of --data (its valid file, or a hash split)."""
    text_field: str = "text"
    """Field holding the text in .jsonl/.parquet/Hugging Face rows."""
    seq_len: int = 512
    """Bytes predicted per sequence; the model sees BOS plus seq_len - 1 bytes (paper: 4096)."""
    pack: bool = True
    """Pack documents (EOS-separated) into sequences; --no-pack keeps only documents of at least seq_len
    bytes and truncates them (the paper's rule)."""
    val_fraction: float = 0.05
    """Share of documents held out (by a hash of the document key) when no validation split is given."""
    val_bytes: int = 262_144
    """Bytes of validation data used per evaluation (the first sequences of the validation split)."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A whole training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    boundary: BoundaryConfig = field(default_factory=BoundaryConfig)
    data_cfg: DataConfig = field(default_factory=DataConfig)
    preset: str = "tiny"
    """Preset to start from: tiny, small, paper-147m, paper-90m-code, paper-aspect-N (other flags override)."""
    resume: str = ""
    """Resume the run in this directory from its latest checkpoint (its config.json; other flags override)."""
    overwrite: bool = False
    """Replace an existing run in --out (default: the command line picks a fresh OUT-2, OUT-3, ...)."""
    out: str = "runs/tiny"
    """Run directory: config.json, metrics.jsonl, checkpoints."""
    batch_size: int = 8
    """Sequences per optimizer update (the effective batch)."""
    micro_batch_size: int = 0
    """Sequences per forward pass; batch_size must be a multiple. 0 = batch_size (no accumulation)."""
    max_steps: int = 0
    """Optimizer updates to train for; 0 = derive from --max-bytes."""
    max_bytes: float = 0.0
    """Training length in bytes (used when max_steps is 0; on the command line --max-bytes alone replaces the
    preset's --max-steps)."""
    time_budget: float = 0.0
    """Stop training after this many seconds of wall-clock (0 = no limit); the schedule is still set by
    --max-steps/--max-bytes."""
    schedule: Literal["bytes", "time"] = "bytes"
    """What the cosine learning-rate decay runs over: bytes (to --max-steps/--max-bytes; reproducible), or
    time (elapsed / --time-budget: every run decays fully within its wall-clock budget, for equal-time
    comparisons; --max-steps/--max-bytes then only cap the run; not bit-reproducible). Warm-up is in bytes."""
    warmup_bytes: float = 0.0
    """Linear learning-rate warm-up length in bytes, then cosine decay to min_lr_ratio * lr."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of --lr at the end of the cosine."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (not on norms, biases or embeddings)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2 (paper: 0.999)."""
    grad_clip: float = 1.0
    """Global gradient-norm clipping threshold; 0 disables it."""
    seed: int = 0
    """Seed for initialisation, data order and boundary sampling."""
    device: str = "auto"
    """cpu, cuda, cuda:N or auto (CUDA when available)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun: DistributedDataParallel, or FSDP2 (fully_shard per block) for models that do not fit
    one device. Ignored in a single process."""
    compile: bool = False
    """torch.compile the model (about 2x on CPU after a ~1 min warm-up)."""
    threads: int = 0
    """CPU threads for PyTorch (0 = PyTorch's default)."""
    log_every: int = 10
    """Steps between metric lines in metrics.jsonl."""
    eval_every: int = 100
    """Steps between validation evaluations (0 = only at the end)."""
    ckpt_every: int = 200
    """Steps between checkpoints (0 = only at the end). Checkpoints are written atomically."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = False
    """Also log scalars and a boundary-map image per evaluation to RUN/tensorboard (pip install
    'learntok[tensorboard]')."""


def to_dict(cfg: Any) -> dict:
    """A JSON-ready dict of a (nested) config, with the config version."""
    d = dataclasses.asdict(cfg)
    d["config_version"] = CONFIG_VERSION
    return d


def _build(cls: type, d: dict, where: str) -> Any:
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"unknown config key(s) in {where}: {', '.join(unknown)}")
    kwargs = {}
    for k, v in d.items():
        sub = _NESTED.get((cls, k))
        kwargs[k] = _build(sub, v, f"{where}.{k}") if sub is not None else v
    return cls(**kwargs)


_NESTED = {(TrainConfig, "model"): ModelConfig, (TrainConfig, "boundary"): BoundaryConfig,
           (TrainConfig, "data_cfg"): DataConfig}


def from_dict(d: dict) -> TrainConfig:
    """Rebuild a TrainConfig; unknown keys or another config version are errors, never silently dropped."""
    d = dict(d)
    version = d.pop("config_version", None)
    if version != CONFIG_VERSION:
        raise ValueError(f"config version {version} is not supported (this learntok reads version {CONFIG_VERSION})")
    return _build(TrainConfig, d, "config")


def load_json(path: str) -> TrainConfig:
    with open(path) as f:
        return from_dict(json.load(f))
