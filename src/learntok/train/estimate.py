"""A training step without running it: fake tensors (shapes and dtypes, no data, no memory) through the real
model, loss and optimizer, for what a GPU step needs before one is rented.

`trace_step` runs one (or more) full training steps of a config in the CUDA configuration (bf16-mixed
autocast, FlexAttention, the state-scan sampler, bucketed token level, AdamW) on fake CPU tensors and reports
the peak of live tensor bytes (`LiveBytes`). The CPU build of PyTorch cannot run even fake CUDA operators (its
device guard aborts the process), so the trace uses fake *CPU* tensors with the CUDA code paths selected:
bf16 autocast on the CPU casts the same matmuls, FlexAttention's gradients go through its fake
implementation (`flex_backward_on_cpu`), and fake tensors take the accelerator's sampler. What it cannot see:
the CUDA caching allocator's rounding and fragmentation, cuBLAS/Triton workspaces and the CUDA context (about
0.5-1 GiB), so a real peak is somewhat higher (docs/gpu.md compares the two where a GPU measured one).
"""

from __future__ import annotations

import contextlib
import gc
import warnings
import weakref
from dataclasses import dataclass, replace

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from learntok.config import TrainConfig
from learntok.model import build_model
from learntok.model.lm import COMPILE_BUCKET
from learntok.nn import attention
from learntok.nn.attention import flex_backward_on_cpu
from learntok.train.schedule import make_optimizer
from learntok.vocab import BOS


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storage made inside it, and their peak: each operator output's storage
    is counted once, until the storage itself dies (PyTorch keeps a storage's Python object as long as the
    storage lives, also when only autograd's saved tensors hold it, so a weakref callback on it marks the
    moment it is freed). Works on fake tensors (their storage sizes are real) and on higher-order operators
    (FlexAttention), whose outputs it counts like any operator's, not their internals."""

    supports_higher_order_operators = True

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}  # live storage -> bytes

    def _track(self, out) -> None:
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._sizes:
                continue
            self._sizes[key] = storage.nbytes()
            self.live += self._sizes[key]
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.live -= self._sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._track(out)
        return out

    def reset_peak(self) -> None:
        self.peak = self.live


HOST_READS = frozenset({"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select", "_unique2",
                        "unique_consecutive", "unique_dim"})
"""Operators whose result the host must read (item/int/bool, data-dependent shapes): on a GPU each waits for
the queue to drain. Fake tensors have no values, so in a fake trace each of them fails instead."""

_VIEWS = frozenset({"_unsafe_view", "lift_fresh", "_reshape_alias"})
"""Aliasing operators that `is_view` does not flag; like views (and `prim` queries such as a tensor's device)
they launch no kernel."""


class OpCensus(TorchDispatchMode):
    """What an eager step asks of a device, op by op, on any device (fake tensors too): kernels (operators
    that are not views), the bytes they read and write (their tensor inputs and outputs: the memory traffic
    an eager GPU step pays, which dominates where elementwise work is memory-bound), by kind, and the host
    reads among them. Machine-independent, so two versions of the code compare exactly."""

    supports_higher_order_operators = True
    KINDS = {"mm": "matmul", "addmm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "flex_attention": "attention",
             "flex_attention_backward": "attention", "_to_copy": "copy/cast", "copy_": "copy/cast",
             "clone": "copy/cast", "cat": "copy/cast", "index_select": "gather/scatter", "gather": "gather/scatter",
             "scatter": "gather/scatter", "scatter_add": "gather/scatter", "index_add": "gather/scatter",
             "index_put": "gather/scatter", "embedding": "gather/scatter", "embedding_dense_backward":
             "gather/scatter"}

    def __init__(self):
        super().__init__()
        self.kernels: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.host_reads: list[str] = []

    @staticmethod
    def _bytes(tree) -> int:
        return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func)).split(".")[0]
        if name in HOST_READS:
            self.host_reads.append(name)
        out = func(*args, **kwargs)
        if not getattr(func, "is_view", False) and name not in _VIEWS and getattr(func, "namespace", "") != "prim":
            kind = self.KINDS.get(name, "elementwise/reduction")
            self.kernels[kind] = self.kernels.get(kind, 0) + 1
            self.bytes[kind] = self.bytes.get(kind, 0) + self._bytes((args, kwargs)) + self._bytes(out)
        return out


@contextlib.contextmanager
def eager_flex():
    """FlexAttention through its uncompiled path: torch.compile refuses to run under a tracing dispatch mode.
    `LiveBytes` sees the operator's outputs only, so the memory counted is the fused kernel's (output and
    log-sum-exp), not the unfused path's score matrix."""
    import torch.nn.attention.flex_attention as fa

    saved = attention.FLEX_COMPILE, fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    attention.FLEX_COMPILE, fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = False, True  # the operator itself
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            yield
    finally:
        attention.FLEX_COMPILE, fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = saved


@dataclass
class StepTrace:
    """What `trace_step` saw."""

    params_gib: float
    """Weights (fp32, or bf16 with --precision bf16)."""
    steady_gib: float
    """Live between steps: weights, gradients (None after zero_grad) and AdamW's two moments."""
    peak_gib: float
    """Peak during a training step (forward activations kept for backward at their largest, plus the above)."""
    token_slots: int
    """Token-level length assumed per sequence (the bucketed count; a trace has no boundaries to count)."""
    loss_dtype: torch.dtype
    n_params: int


def trace_step(cfg: TrainConfig, micro_batch: int, *, rate: float | None = None, steps: int = 2,
               census: OpCensus | None = None) -> StepTrace:
    """Trace `steps` training steps of `micro_batch` sequences of cfg's length on fake tensors in the CUDA
    configuration (precision auto -> bf16-mixed, attention auto -> flex) and return their memory.

    rate: the boundary rate to size the token level for (default: the strategy's target rate, plus 25 % head
    room, as a batch's largest count exceeds the mean), rounded up to the bucket (--token-bucket, or
    --compile's 64). The second step is the steady state (AdamW's moments exist); `census`
    records the last step's forward and backward pass (not the optimizer's)."""
    if cfg.activation_checkpointing:
        raise ValueError("activation checkpointing is not estimated: the fake trace of FlexAttention's uncompiled "
                         "path keeps recomputed outputs alive, which would overstate the peak")
    model_cfg = cfg.model
    if model_cfg.attn_backend == "auto":
        model_cfg = replace(model_cfg, attn_backend="flex")
    bucket = model_cfg.token_bucket or COMPILE_BUCKET
    T = cfg.data.seq_len
    target = rate if rate is not None else 1.25 * getattr(cfg.boundary, "target_rate", 1.0)
    slots = min(T, -(-int(target * T) // bucket) * bucket)
    precision = "bf16-mixed" if cfg.precision == "auto" else cfg.precision
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), flex_backward_on_cpu(), eager_flex(), LiveBytes() as mem:
        model = build_model(replace(model_cfg, token_bucket=bucket), cfg.boundary).train()
        if precision == "bf16":
            model.to(torch.bfloat16)
        # No values to count: the assumed buckets, the token level's over bytes and, in a two-level model, the
        # super-token level's over its token slots (its target rate + 25 % of them; all of them before
        # --inner-start, when every token is its own super-token).
        inner = 1.0 if getattr(model_cfg, "inner_start", 0.0) else getattr(model_cfg, "inner_rate", 0.5) * 1.25
        supers = min(slots, -(-int(inner * slots) // bucket) * bucket)
        model.token_slots = lambda mask: slots if mask.shape[1] == T else supers
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        opt = make_optimizer(model, cfg.optim, fused=False)
        ids = torch.full((micro_batch, T), BOS, dtype=torch.long)
        noise = torch.zeros(micro_batch, T)
        peak = 0
        for step in range(steps):
            # Each step's rise above what was live at its start, on top of the state that must be live then
            # (weights and AdamW's moments).
            steady = params + sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                                  if torch.is_tensor(t))
            mem.reset_peak()
            start = mem.live
            with census if census is not None and step == steps - 1 else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                    out = model(ids, ids, noise=noise)
                out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_dtype = out.loss.dtype
            del out
            gc.collect()
            peak = max(peak, steady + mem.peak - start)
    gib = 2.0**30
    return StepTrace(params_gib=params / gib, steady_gib=steady / gib, peak_gib=peak / gib, token_slots=slots,
                     loss_dtype=loss_dtype, n_params=sum(p.numel() for p in model.parameters()))
