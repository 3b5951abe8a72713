"""bench/bench_gpu.py keeps working where tests run (CPU): the report's arithmetic, the largest-batch search,
and one real step per runner end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from learntok.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_attention_flops_count_windowed_and_causal_matmuls(bench):
    cfg = ModelConfig(d_model=12, n_heads=2, n_down=1, n_mid=2, n_up=1, byte_window=4)
    # 2 rows x 100 bytes, 20 tokens per row: byte 12*200*4*12*2 layers, tokens 6*2*20^2*12*2 layers
    assert bench.attention_flops(cfg, 200, 40, 2) == 12 * 200 * 4 * 12 * 2 + 6 * 2 * 400 * 12 * 2
    # a window longer than the row sees the row
    assert bench.attention_flops(cfg, 6, 0, 2) == 12 * 6 * 3 * 12 * 2


@pytest.mark.parametrize("capacity,limit,want", [(37, 256, 37), (1, 256, 1), (0, 256, 0), (500, 256, 256)])
def test_largest_micro_batch_search(bench, monkeypatch, capacity, limit, want):
    tried = []

    class FakeRunner:
        def __init__(self, *a, micro_batch, **k):
            tried.append(micro_batch)
            if micro_batch > capacity:
                raise torch.OutOfMemoryError("fake")

        def step(self):
            pass

    monkeypatch.setattr(bench, "Runner", FakeRunner)
    assert bench.max_micro_batch(None, torch.device("cpu"), "fp32", False, limit) == want
    assert len(tried) <= 2 * limit.bit_length() + 1


def test_out_of_memory_is_recognised_inside_compiler_errors(bench):
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as e:
            raise RuntimeError("BackendCompilerFailed: backend='inductor' raised an exception") from e
    except RuntimeError as wrapped:
        assert bench.out_of_memory(wrapped)
    assert bench.out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not bench.out_of_memory(RuntimeError("shape mismatch"))


def test_cpu_smoke_run_writes_json_and_markdown(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py", "--device", "cpu", "--configs", "tiny", "--modes", "eager",
                                      "--rounds", "1", "--steps", "1", "--warmup", "1", "--out", str(tmp_path)])
    bench.main()
    res = json.loads((tmp_path / "bench_gpu.json").read_text())
    rows = {r["strategy"]: r for r in res["rows"]}
    assert set(rows) == {"learned", "uniform"}
    assert rows["learned"]["bytes_per_s"] > 0 and 0.05 < rows["learned"]["rate"] < 0.6
    assert rows["learned"]["mfu"] is None  # no peak known for a CPU
    assert rows["learned"]["graphs_compiled_while_timing"] == 0  # eager: nothing compiled
    assert rows["learned"]["host_syncs_per_step"] is None  # counted on CUDA only
    assert "| tiny | eager | learned | 8x512 |" in (tmp_path / "bench_gpu.md").read_text()


def test_gpu_runbook_names_real_tests_and_real_benchmark_flags():
    """bench/gpu_session.sh is run only on a lent GPU: keep what it names in step with the code here."""
    import re

    script = (ROOT / "bench" / "gpu_session.sh").read_text().replace("\\\n", " ")  # join continued lines
    tests = re.findall(r"tests/test_\w+\.py", script)
    assert "tests/test_gpu.py" in tests and all((ROOT / t).exists() for t in tests)
    source = (ROOT / "bench" / "bench_gpu.py").read_text()
    for line in script.splitlines():
        if "bench/bench_gpu.py" in line:
            flags = set(re.findall(r"(--[a-z][a-z-]+)", line))
            assert flags and all(f'"{f}"' in source for f in flags), line
