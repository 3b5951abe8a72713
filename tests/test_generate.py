"""Cached generation (`ByteLM.step`) equals the full forward pass, for every strategy with a step()."""

from __future__ import annotations

import pytest
import torch

from learntok.boundaries import available, strategy_class
from learntok.generation import generate
from learntok.vocab import BOS

from .conftest import build_model

STEP_STRATEGIES = [s for s in available() if strategy_class(s).has_step]


def assert_cached_steps_equal_full_forward(m, device: str = "cpu") -> None:
    """Byte by byte through `m.step` on `device`: the full forward pass's boundaries, logits within 1e-4."""
    B, T = 3, 40  # longer than the byte window: the ring buffer wraps
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(32, 127, (B, T), generator=g)
    ids[:, 0] = BOS
    ids[1, 5:9] = ord(" ")
    noise = torch.rand(B, T, generator=g)
    m, ids, noise = m.to(device), ids.to(device), noise.to(device)
    with torch.no_grad():
        full = m(ids, noise=noise)
        state = m.init_state(B, noise)
        logits, bounds = [], []
        for t in range(T):
            lg, a = m.step(ids[:, t], state)
            logits.append(lg)
            bounds.append(a)
    assert full.logits.device.type == torch.device(device).type
    assert torch.equal(torch.stack(bounds, 1), full.boundaries.mask)
    torch.testing.assert_close(torch.stack(logits, 1), full.logits, rtol=1e-4, atol=1e-4)
    assert full.boundaries.mask[:, 1:].any()  # the token cache was exercised


@pytest.mark.parametrize("strategy", STEP_STRATEGIES)
def test_cached_steps_equal_full_forward(strategy, tmp_path):
    assert_cached_steps_equal_full_forward(build_model(strategy, tmp_path, model_kw={"byte_window": 8}).eval())


def test_generate_batched_ragged_prompts_and_streaming(tmp_path):
    m = build_model("learned", tmp_path).eval()
    streamed: dict[int, str] = {0: "", 1: ""}
    out = generate(m, ["def", "import os\n"], 12, seed=1, on_text=lambda b, s: streamed.__setitem__(b, streamed[b] + s))
    assert len(out) == 2 and all(len(o) <= 12 for o in out)
    assert streamed[0] == out[0].decode("utf-8", errors="replace")
    # cached and uncached generation agree (same noise, greedy decoding)
    a = generate(m, ["x = "], 10, temperature=0, seed=3)
    b = generate(m, ["x = "], 10, temperature=0, seed=3, use_cache=False)
    assert a == b
    assert len(a[0]) == 10
    assert generate(m, ["x = "], 10, temperature=0, seed=3, stop=[a[0][:3]]) == [a[0][:3]]


def test_generation_with_bpe_guidance_recomputes_flags_on_the_prefix(tmp_path):
    m = build_model("bpe", tmp_path).eval()
    out = generate(m, ["def f(x):", "import"], 6, temperature=0, seed=0)
    assert len(out) == 2 and all(len(o) == 6 for o in out)


@pytest.mark.parametrize("mode", ["bf16-weights", "bf16-autocast"])
def test_cached_generation_runs_in_bf16(mode, tmp_path):
    """A model trained with --precision bf16 (bf16 weights) or used under bf16 autocast generates: the caches
    take the weights' dtype and the keys the projections give."""
    m = build_model("learned", tmp_path).eval()
    if mode == "bf16-weights":
        m.to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16-autocast"):
        out = generate(m, ["def", "import os\n"], 12, temperature=0.8, seed=1)
    assert all(len(o) <= 12 for o in out) and any(out)
