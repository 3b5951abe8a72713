"""Device and numeric precision, shared by training and every command that loads a model."""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16")


def resolve_device(name: str) -> torch.device:
    """cpu, cuda, cuda:N, or auto (CUDA when available); a CUDA device on a machine without CUDA is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"--device {name}: not a device name (cpu, cuda, cuda:N or auto)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return dev


def resolve_precision(precision: str, device: torch.device) -> str:
    """auto: bf16-mixed on CUDA, fp32 on CPU (whose bf16 matmuls are slower than fp32 on most CPUs)."""
    if precision == "auto":
        return "bf16-mixed" if device.type == "cuda" else "fp32"
    return precision


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's context: bf16 autocast for bf16-mixed (fp32 weights and optimizer state, bf16
    matmuls and attention; norms, losses and logits stay fp32), nothing for fp32 and pure bf16."""
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To a GPU it is copied from pinned memory without blocking, so the host goes
    on queueing work instead of waiting for the copy (a training step's batch and boundary noise)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def out_of_memory(e: BaseException) -> bool:
    """An out-of-memory error, also when torch.compile wraps it (InductorError, BackendCompilerFailed) or a
    library re-raises it with another type: the chain of causes is searched."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def configure_matmul(precision: str, device: torch.device) -> None:
    """On CUDA: TF32 for the fp32 matmuls that remain under bf16 (Ampere and later), and strict fp32 matmuls for
    `fp32`, set either way: the flag is process-wide, so an earlier bf16 run in the same process must not leave
    a later fp32 run in TF32."""
    if device.type == "cuda":
        set_tf32(precision != "fp32")


def set_tf32(enabled: bool) -> None:
    """TF32 for CUDA fp32 matmuls on or off. torch >= 2.9 has a new flag (fp32_precision) that must not be mixed
    with the legacy one (allow_tf32): reading the legacy flag after both were set is an error. Use this and
    `tf32_enabled`, never allow_tf32 directly."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = "tf32" if enabled else "ieee"
    else:
        matmul.allow_tf32 = enabled


def tf32_enabled() -> bool:
    """Whether CUDA fp32 matmuls run in TF32 (as `set_tf32` set it)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)
