"""Neural-network primitives shared by the U-Net, the boundary strategies and the entropy model: attention
kernels, Gemma-2 blocks with `forward()` (a whole sequence) and `step()` (one new position against a KV cache).
Pure PyTorch, no device code; nothing here imports the rest of learntok."""

import functools

import torch
from torch._guards import detect_fake_mode


def shape_cache(maxsize: int = 64):
    """functools.lru_cache for values that depend only on static arguments (shapes, window, device): masks,
    tables. Eagerly the value is built once; while torch.compile traces, the function runs uncached, so the graph
    builds the value itself (dynamo cannot look into a cache and would trace the function anyway, with a
    warning that silent errors are possible); and under a fake-tensor mode (learntok.train.estimate) too, whose
    tensors must not outlive it in a cache. Keep such functions cheap and free of Python loops over data."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if torch.compiler.is_compiling() or detect_fake_mode() is not None:
                return fn(*args, **kwargs)
            return cached(*args, **kwargs)

        return call
    return wrap
