"""Device selection, shared by training and every command that loads a model."""

from __future__ import annotations

import torch


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
