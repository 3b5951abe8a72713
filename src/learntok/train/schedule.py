"""How long a run trains and at what learning rate: the step count, the warm-up + cosine schedule, AdamW, and
the clock that measures training time without evaluation and checkpoint pauses."""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from learntok.config import OptimConfig, TrainConfig

UNBOUNDED_STEPS = 10**12
"""Step count of a time-scheduled run without --max-steps / --max-bytes: its budget ends it first."""


def busy_cpu_note(threads: int) -> str | None:
    """A note when training on the CPU starts with more PyTorch threads than the machine has idle cores (cores
    minus the 1-minute load average, within half a core): the threads then wait on each other. With one other
    1-thread job on a 2-core VM, 60 steps of `tiny` took 2.0x as long with the default 2 threads as with
    --threads 1 (docs/operations.md). None otherwise, or where the load is unknown. The default is not changed
    behind the user's back: the thread count can change float rounding, so a run's numbers would depend on what
    else the machine was doing."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):  # no load average on this platform
        return None
    if threads <= 1 or cores - load >= threads - 0.5:
        return None
    return (f"note: the machine is busy (load average {load:.1f} on {cores} cores) and PyTorch uses {threads} "
            "threads; if steps are slow, --threads 1 may be several times faster")


def _same_path(a: str, b: str) -> bool:
    """Two data specs naming the same file or directory (spelled either way); specs that are not paths compare as
    text."""
    if a == b:
        return True
    try:
        return os.path.exists(a) and os.path.samefile(a, b)
    except OSError:
        return False


def check_config(cfg: TrainConfig) -> None:
    """Reject inconsistent settings with one clear line before any work is done."""
    mc, dc = cfg.model, cfg.data
    problems = []
    if dc.val_data is not None and _same_path(dc.val_data, dc.source):
        from learntok.data import is_prepared

        if not is_prepared(dc.source):  # a prepared corpus as --val-data means its val split
            problems.append(f"--val-data {dc.val_data} is --data: every validation document would be trained on "
                            "(leave --val-data out for a hold-out of --data, or give held-out text)")
    if dc.seq_len < 2:
        problems.append(f"seq_len={dc.seq_len} is too short (need at least 2 bytes)")
    if dc.seq_len < mc.byte_window:
        problems.append(f"seq_len={dc.seq_len} is shorter than the byte window ({mc.byte_window}) this model needs")
    mb = cfg.micro_batch_size or cfg.batch_size
    if cfg.batch_size < 1 or mb < 1 or cfg.batch_size % mb:
        problems.append(f"batch_size={cfg.batch_size} must be a positive multiple of micro_batch_size={mb}")
    strata = getattr(cfg.boundary, "rate_strata", 1)
    if getattr(cfg.boundary, "rate_range", None) is not None and cfg.batch_stats == "lagged":
        problems.append("--batch-stats lagged cannot serve --rate-range: the previous step's rates answer other "
                        "targets than this step draws (use the pre-pass)")
    if getattr(cfg.boundary, "rate_range", None) is not None:
        k = getattr(cfg.boundary, "policy_samples", 1)
        if cfg.batch_size % strata or (cfg.batch_size // strata) % k or cfg.batch_size // strata < 2:
            problems.append(f"--rate-strata {strata} must cut batch_size={cfg.batch_size} into blocks of at least 2 "
                            f"rows (and whole groups of --policy-samples {k}): each block's baseline is its mean")
    if mc.inner_layers:
        from learntok.model.hier import unsupported

        problems += unsupported(cfg.boundary, mc)
    if cfg.optim.schedule == "time" and cfg.time_budget <= 0:
        problems.append("--schedule time needs --time-budget SECONDS")
    if cfg.optim.schedule == "flops" and cfg.flops_budget <= 0:
        problems.append("--schedule flops needs --flops-budget FLOPS")
    if not (0 <= cfg.flops_budget < math.inf and 0 <= cfg.time_budget < math.inf):  # NaN fails both
        problems.append(f"--flops-budget and --time-budget must be finite and non-negative (got {cfg.flops_budget:g}, "
                        f"{cfg.time_budget:g})")
    if cfg.max_steps < 0 or cfg.max_bytes < 0:
        problems.append(f"--max-steps and --max-bytes must be non-negative (got {cfg.max_steps}, {cfg.max_bytes})")
    if cfg.max_steps <= 0 and cfg.max_bytes <= 0 and cfg.optim.schedule not in ("time", "flops"):
        problems.append("give a training length: --max-steps N or --max-bytes N")
    if cfg.log_every < 1 or cfg.max_bad_steps < 1 or cfg.eval_every < 0 or cfg.ckpt_every < 0:
        problems.append(f"log_every and max_bad_steps must be >= 1, eval_every and ckpt_every >= 0 (got "
                        f"{cfg.log_every}, {cfg.max_bad_steps}, {cfg.eval_every}, {cfg.ckpt_every})")
    for flag in ("wandb", "tensorboard"):
        if getattr(cfg, flag):
            try:
                importlib.import_module(flag)
            except ImportError:
                problems.append(f"--{flag} needs the {flag} package: pip install 'learntok[{flag}]'")
    if problems:
        raise ValueError("; ".join(problems))


def total_steps(cfg: TrainConfig) -> int:
    """Optimizer steps the run is set up for: --max-steps if given, else --max-bytes in whole global batches
    (a time-scheduled run without a length: until its budget ends)."""
    if cfg.max_steps > 0:
        return cfg.max_steps
    if cfg.max_bytes <= 0 and cfg.optim.schedule in ("time", "flops"):
        return UNBOUNDED_STEPS
    return max(1, math.ceil(cfg.max_bytes / (cfg.batch_size * cfg.data.seq_len)))


def progress(opt: OptimConfig, bytes_seen: float, total_bytes: float, elapsed: float = 0.0,
             time_budget: float = 0.0, flops_frac: float = 0.0) -> float:
    """How far the learning-rate schedule is, 0 to 1: 0 through the warm-up over warmup_bytes, then the share of
    total_bytes after it (with schedule = "time", of time_budget seconds; with "flops", flops_frac = FLOPs spent /
    budget)."""
    if bytes_seen < opt.warmup_bytes:
        return 0.0
    if opt.schedule == "time":
        return min(1.0, elapsed / time_budget)
    if opt.schedule == "flops":
        return min(1.0, flops_frac)
    return min(1.0, (bytes_seen - opt.warmup_bytes) / max(1.0, total_bytes - opt.warmup_bytes))


def lr_at(opt: OptimConfig, bytes_seen: float, total_bytes: float, elapsed: float = 0.0,
          time_budget: float = 0.0, flops_frac: float = 0.0) -> float:
    """Linear warm-up over warmup_bytes, then cosine decay to min_lr_ratio * lr as `progress` goes from 0 to 1."""
    if bytes_seen < opt.warmup_bytes:
        return opt.lr * (bytes_seen + 1) / opt.warmup_bytes
    frac = progress(opt, bytes_seen, total_bytes, elapsed, time_budget, flops_frac)
    return opt.lr * (opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, opt: OptimConfig, fused: bool = False, sparse: bool = False):
    """AdamW; weight decay on matrices only (not norms, biases, the byte embedding or hashed embedding tables). A
    parameter with a learning-rate scale (learntok.boundaries.rates.lr_scales: the rate controller's) gets a group
    of its own, without weight decay, whose learning rate is the schedule's times that scale (`group_lr`). `fused`:
    one CUDA kernel for the whole update (CUDA only), else the multi-tensor (foreach) implementation. `sparse`: the
    hashed embedding tables (learntok.nn.ngram) take sparse gradients and a lazy Adam of their own (SparseAdam: a
    row's moments move only when a step reads it), beside AdamW for the rest (`JointOptimizer`)."""
    from learntok.boundaries.rates import lr_scales
    from learntok.nn.ngram import hashed_tables

    tables = hashed_tables(model)
    table_ids, scales = {id(t.weight) for t in tables}, lr_scales(model)
    lazy = table_ids if sparse else set()
    for t in tables:
        t.sparse = sparse
    decay, no_decay, scaled = [], [], {}
    for name, p in model.named_parameters():
        if id(p) in lazy:
            continue
        if id(p) in scales:
            scaled.setdefault(scales[id(p)], []).append(p)
        else:
            matrix = p.dim() >= 2 and not name.startswith("embed") and id(p) not in table_ids
            (decay if matrix else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0},
              *({"params": ps, "weight_decay": 0.0, "lr_scale": k} for k, ps in scaled.items())]
    impl = {"fused": True} if fused else {"foreach": True}
    dense = torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), **impl)
    if not lazy:
        return dense
    return JointOptimizer(dense, torch.optim.SparseAdam([t.weight for t in tables], lr=opt.lr,
                                                        betas=(opt.beta1, opt.beta2)))


class JointOptimizer:
    """Two optimizers stepped as one (AdamW for dense parameters, SparseAdam for sparse embedding tables): the
    training loop sets learning rates on `param_groups`, steps, zeroes, saves and loads it like one optimizer."""

    def __init__(self, *parts: torch.optim.Optimizer):
        self.parts = parts

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.parts for g in o.param_groups]

    def step(self) -> None:
        for o in self.parts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"joint": [o.state_dict() for o in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        if "joint" not in state or len(state["joint"]) != len(self.parts):
            raise ValueError("the checkpoint's optimizer state is not this run's: its hashed embedding tables were "
                             "trained with dense gradients (several processes or --compile); resume it the same way")
        for o, s in zip(self.parts, state["joint"]):
            o.load_state_dict(s)


def clip_gradients(params, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_, also over sparse gradients (the hashed tables'): the total 2-norm of every
    gradient, and all of them scaled by max_norm / norm when it exceeds max_norm. Returns the norm before."""
    params = [p for p in params if p.grad is not None]
    if not any(p.grad.is_sparse for p in params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    for p in params:  # coalesced once: a row read by several positions is one row (SparseAdam needs it so too)
        if p.grad.is_sparse:
            p.grad = p.grad.coalesce()
    parts = [p.grad.values() if p.grad.is_sparse else p.grad for p in params]  # values(): a view when coalesced
    norm = torch.nn.utils.get_total_norm(parts)
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in parts:
        g.mul_(scale.to(g.dtype))
    return norm


def group_lr(group: dict, lr: float) -> float:
    """The learning rate of an optimizer group at schedule value `lr` (its `lr_scale` times it)."""
    return lr * group.get("lr_scale", 1.0)


class Stopwatch:
    """Training time: wall-clock seconds minus those spent in `paused()` blocks (evaluation, checkpoints)."""

    def __init__(self, start: float = 0.0):
        self._origin = time.perf_counter() - start

    def elapsed(self) -> float:
        return time.perf_counter() - self._origin

    @contextmanager
    def paused(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self._origin += time.perf_counter() - t
