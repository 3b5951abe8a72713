"""bench/bench_step.py's machine-independent op count (--count-ops): what it counts, and that it sees the step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from learntok.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_step", ROOT / "bench" / "bench_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_op_counter_counts_aten_calls_and_their_elements():
    bench = load_bench()
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with bench.OpCounter() as c:
        (a @ b).add_(1.0)
    assert sum(c.calls.values()) == 2 and c.elements == 2 * 15
    assert any("mm" in op for op in c.calls) and any("add_" in op for op in c.calls)


def test_a_fixed_boundary_step_counts_the_same_every_time_and_the_policy_adds_ops(capsys, monkeypatch):
    """Uniform boundaries make the count a property of the code alone; the learned policy's estimator adds ops."""
    bench = load_bench()
    small = ModelConfig(d_model=32, n_heads=2, n_down=1, n_mid=1, n_up=1, byte_window=8)
    monkeypatch.setitem(bench.CONFIGS, "test-small", (small, 2, 64))
    bench.count_ops(["test-small"])
    bench.count_ops(["test-small"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("test-small")]
    uniform = [(int(r[2]), int(r[3])) for r in rows if r[1] == "uniform"]
    learned_calls = [int(r[2]) for r in rows if r[1] == "learned"]
    assert len(uniform) == 2 and uniform[0] == uniform[1]
    assert len(learned_calls) == 2 and all(calls > uniform[0][0] for calls in learned_calls)
