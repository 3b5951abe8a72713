"""Data parallelism with PyTorch's own stack (docs/distributed.md): torchrun sets RANK / WORLD_SIZE /
LOCAL_RANK, we initialise the process group (NCCL on CUDA, gloo on CPU) and wrap the model in
DistributedDataParallel (default) or FSDP2 (`fully_shard`). A single process is the same code path with world
size 1.

The estimator's batch statistics (per-position mean return, eq. 17; mean p for eq. 24) must be those of the
global batch, across ranks and accumulation micro-steps. A strategy carries their sums as `BatchSums`
(learntok.boundaries.base), whose `stacked()` vectors add up over micro-batches and ranks; a reducer (a
`StatsReducer`) maps the local sums of one micro-batch to the global ones (`GlobalStats.reducer` picks it each
step):

- None                 one process, no accumulation: the micro-batch is the global batch;
- `AllReduceStats`     several ranks, no accumulation: all-reduce the sums inside the forward pass;
- `FixedStats`         accumulation, `--batch-stats prepass` (the default, eq. 17 exactly): a no-grad pre-pass
                       over the step's micro-batches (same boundary noise) returns each one's sums with its
                       output, the loop adds them and all-reduces them once, and the training pass uses them;
                       `--batch-stats lagged`: the previous step's global sums (no pre-pass; see `GlobalStats`).

Reducers are pure functions of their input: a compiled stage must not mutate Python state (dynamo would guard
on it and recompile per micro-batch).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as tdist

from learntok.boundaries.base import BatchSums, StatsReducer, SumsT
from learntok.device import resolve_device, to_device


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    group: bool = False
    """A process group is in use (torchrun, at any world size): the model is wrapped and statistics reduced."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1 or self.group


def launched_by_torchrun() -> bool:
    """torchrun (or another env:// launcher) set the rendezvous variables, whatever the world size."""
    return all(k in os.environ for k in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"))


def init_distributed(device: str) -> Dist:
    """Join the process group when launched by torchrun (also with one process: `torchrun --nproc-per-node 1`
    runs DDP over NCCL, the multi-GPU path on one GPU) or when the caller already initialised one; choose the
    device (CUDA: one GPU per local rank). A plain `learntok train` has no group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    group = world > 1 or launched_by_torchrun() or tdist.is_initialized()
    dev = resolve_device(device)
    if dev.type == "cuda" and group:
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if group and not tdist.is_initialized():
        tdist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    if group:
        world, rank = tdist.get_world_size(), tdist.get_rank()
    return Dist(rank=rank, world=world, local_rank=local_rank, device=dev, group=group)


def _all_reduce(t: torch.Tensor, d: Dist, op) -> torch.Tensor:
    """Reduce a copy of `t` over ranks on the process group's device (NCCL only takes CUDA tensors; host
    scalars such as logged values are moved there and back). Identity in a single process."""
    if not d.active:
        return t
    r = t.to(d.device, copy=True)
    tdist.all_reduce(r, op=op)
    return r.to(t.device)


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Sum over ranks (a copy; identity in a single process)."""
    return _all_reduce(t, d, tdist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Maximum over ranks (a copy; identity in a single process)."""
    return _all_reduce(t, d, tdist.ReduceOp.MAX)


def boundary_noise(seed: int, step: int, rows: np.ndarray, T: int, device: torch.device) -> torch.Tensor:
    """(len(rows), T) uniforms for the boundary sampler, keyed on (seed, step, global row index): a row gets the
    same noise whichever rank or micro-batch it lands in, so 2 processes x b equal 1 process x 2b, and a
    resumed run draws what the uninterrupted run drew."""
    out = np.stack([np.random.default_rng([seed, step, int(r)]).random(T, dtype=np.float32) for r in rows])
    return to_device(torch.from_numpy(out), device)


class AllReduceStats:
    """Global sums over ranks, computed inside the forward pass (no accumulation)."""

    def __init__(self, d: Dist):
        self.d = d

    def __call__(self, local: SumsT) -> SumsT:
        return local.unstacked(all_reduce_sum(local.stacked(), self.d))


class FixedStats:
    """The global sums are already known (from the pre-pass, or the previous step's under `lagged`): given as
    a strategy's `BatchSums` or their `stacked()` vector (a checkpoint holds the vector), and returned in the
    form of the local sums."""

    def __init__(self, total: BatchSums | torch.Tensor):
        self.total = total if isinstance(total, torch.Tensor) else total.stacked()

    def __call__(self, local: SumsT) -> SumsT:
        return local.unstacked(self.total)


def global_sum(parts: list[BatchSums], d: Dist) -> torch.Tensor:
    """The `stacked()` sum of this process's micro-batches' local sums over all ranks (one all-reduce)."""
    vectors = [s.stacked() for s in parts]
    return all_reduce_sum(sum(vectors[1:], vectors[0]), d)


class GlobalStats:
    """Where the estimator's global-batch statistics come from, step after step (`--batch-stats`).

    prepass (default): the current step's global batch, as eq. 17 defines the baseline; under accumulation this
    costs a no-grad forward pass per micro-batch (about a third of a step's compute).
    lagged: the previous step's global batch. The baseline mean_b G_t is then independent of the current
    draws, so the policy gradient stays unbiased (a baseline need only not depend on a_t); the rate loss's
    mean p and --normalize-advantage's spread lag one step too, a change of the controller, not of the model.
    No pre-pass; the first step (no previous one) uses each micro-batch's own statistics. The lag is part of a
    checkpoint (`state_dict`), so a resumed run continues as the uninterrupted one."""

    def __init__(self, d: Dist, accum: int, mode: str = "prepass"):
        if mode not in ("prepass", "lagged"):
            raise ValueError(f"batch_stats must be prepass or lagged, got {mode!r}")
        self.d, self.accum, self.mode = d, accum, mode
        self.previous: torch.Tensor | None = None
        """The last step's global sums, `stacked()` (lagged)."""

    @property
    def needed(self) -> bool:
        """A micro-batch is not the global batch: statistics must be reduced."""
        return self.d.active or self.accum > 1

    def reducer(self, pre_pass: Callable[[], list[BatchSums]]) -> StatsReducer | None:
        """The reducer for this step's training pass. `pre_pass()` runs every micro-batch once without
        gradients and returns their local sums (called only for prepass under accumulation)."""
        if not self.needed:
            return None
        if self.mode == "lagged":  # at the first step (no lag yet) each micro-batch's own statistics
            return FixedStats(self.previous) if self.previous is not None else None
        if self.accum == 1:
            return AllReduceStats(self.d)
        return FixedStats(global_sum(pre_pass(), self.d))

    def observe(self, parts: list[BatchSums]) -> None:
        """The step's micro-batches' local sums, after its training pass: the next step's lag (lagged only)."""
        if self.needed and self.mode == "lagged" and parts:
            self.previous = global_sum(parts, self.d)

    def state_dict(self) -> dict | None:
        return None if self.previous is None else {"stacked": self.previous.detach().cpu()}

    def load_state_dict(self, sd: dict | None, device: torch.device) -> None:
        self.previous = None if sd is None else sd["stacked"].to(device)


def reduce_means(rec: dict[str, float], d: Dist, max_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """Average logged scalars over ranks (the maximum for `max_keys`)."""
    if not d.active:
        return rec
    keys = sorted(k for k in rec if k not in max_keys)
    vals = all_reduce_sum(torch.tensor([rec[k] for k in keys], dtype=torch.float64), d) / d.world
    out = dict(zip(keys, vals.tolist()))
    for k in max_keys:
        if k in rec:
            out[k] = float(all_reduce_max(torch.tensor(rec[k]), d))
    return out


def fsdp_mixed_precision(precision: str, device: torch.device):
    """FSDP2's MixedPrecisionPolicy for --precision on `device` (see `wrap_model`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed" and device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    return MixedPrecisionPolicy()


def wrap_model(model: torch.nn.Module, parallel: str, d: Dist, precision: str = "fp32") -> torch.nn.Module:
    """DistributedDataParallel (default) or FSDP2 under torchrun; the bare model in a single process.

    FSDP2 with bf16-mixed on CUDA gathers bf16 parameters for the forward pass and reduces gradients in fp32,
    and leaves the blocks' inputs as they are (cast_forward_inputs=False), so the residual stream keeps the dtype
    --residual-dtype gives it (autocast casts the matmuls' inputs anyway). Otherwise no casting: fp32 stays
    fp32, and pure bf16's parameters are bf16 already."""
    if not d.active:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        mp = fsdp_mixed_precision(precision, d.device)
        for blk in model.transformer_blocks():
            fully_shard(blk, mp_policy=mp)
        return fully_shard(model, mp_policy=mp)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def full_state(model: torch.nn.Module, wrapped: torch.nn.Module, opt: torch.optim.Optimizer, sharded: bool
               ) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state dicts; collective under FSDP2 (`sharded`), so every rank
    calls it."""
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(wrapped, options=opts), get_optimizer_state_dict(wrapped, opt, options=opts)
    return model.state_dict(), opt.state_dict()


def load_optimizer_state(wrapped: torch.nn.Module, opt: torch.optim.Optimizer, state: dict, sharded: bool) -> None:
    """Load a full optimizer state dict (into the local shards under FSDP2)."""
    if "joint" in state and not hasattr(opt, "parts"):
        raise ValueError("the run trained its hashed embedding tables with sparse gradients (one eager process); "
                         "resume it the same way (without --compile or torchrun)")
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(wrapped, opt, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(state)
