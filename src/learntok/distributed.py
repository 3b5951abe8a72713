"""Data parallelism with PyTorch's own stack: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK, we initialise the
process group (NCCL on CUDA, gloo on CPU) and wrap the model in DistributedDataParallel (default) or FSDP2
(`fully_shard`). A single process is the same code path with world size 1.

The estimator's batch statistics (per-position mean return, eq. 17; mean p for eq. 24) must be those of the
global batch, across ranks and accumulation micro-steps. `BatchStatistics` carries their sums; a reducer maps
the local sums of one micro-batch to the global ones:

- `local_stats`        one process, no accumulation: the micro-batch is the global batch;
- `AllReduceStats`     several ranks, no accumulation: all-reduce the sums inside the forward pass;
- `RecordStats`/`FixedStats`  accumulation: a no-grad pre-pass over the step's micro-batches (same boundary
                       noise) records the sums, they are all-reduced once, and the training pass uses them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.distributed as tdist

from learntok.boundaries.reinforce import BatchStatistics


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def init_distributed(device: str) -> Dist:
    """Join the torchrun process group when WORLD_SIZE > 1; choose the device (CUDA: one GPU per local rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device}: CUDA is not available on this machine")
        if world > 1:
            dev = torch.device("cuda", local_rank)
            torch.cuda.set_device(dev)
    if world > 1 and not tdist.is_initialized():
        tdist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=rank, world=world, local_rank=local_rank, device=dev)


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
    return torch.from_numpy(out).to(device)


def local_stats(s: BatchStatistics) -> BatchStatistics:
    return s


class AllReduceStats:
    """Global sums over ranks, computed inside the forward pass (no accumulation)."""

    def __init__(self, d: Dist):
        self.d = d

    def __call__(self, s: BatchStatistics) -> BatchStatistics:
        return BatchStatistics.unstack(all_reduce_sum(s.stacked(), self.d), s.g_sum.shape[0])


class RecordStats:
    """Pre-pass: remember each micro-batch's local sums (and use them locally meanwhile)."""

    def __init__(self):
        self.seen: list[BatchStatistics] = []

    def __call__(self, s: BatchStatistics) -> BatchStatistics:
        self.seen.append(BatchStatistics(*(getattr(s, f.name).detach() for f in fields(s))))
        return s

    def global_stats(self, d: Dist) -> FixedStats:
        total = self.seen[0]
        for s in self.seen[1:]:
            total = total + s
        return FixedStats(BatchStatistics.unstack(all_reduce_sum(total.stacked(), d), total.g_sum.shape[0]))


class FixedStats:
    """Training pass after a pre-pass: the global sums are already known."""

    def __init__(self, s: BatchStatistics):
        self.s = s

    def __call__(self, _local: BatchStatistics) -> BatchStatistics:
        return self.s
