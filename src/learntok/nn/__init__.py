"""Neural-network primitives shared by the U-Net, the boundary strategies and the entropy model: attention
kernels, Gemma-2 blocks with `forward()` (a whole sequence) and `step()` (one new position against a KV cache).
Pure PyTorch, no device code; nothing here imports the rest of learntok."""

import functools

import torch


def shape_cache(maxsize: int = 64):
    """functools.lru_cache for values that depend only on static arguments (shapes, window, device): masks,
    tables. Eagerly the value is built once; while torch.compile traces, the function runs uncached, so the graph
    builds the value itself (dynamo cannot look into a cache and would trace the function anyway, with a
    warning that silent errors are possible). Keep such functions cheap and free of Python loops over data."""
    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return fn(*args, **kwargs) if torch.compiler.is_compiling() else cached(*args, **kwargs)

        return call
    return wrap
