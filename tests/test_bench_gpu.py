"""bench/bench_gpu.py and the GPU runbook keep working where tests run (CPU): the report's arithmetic, the rounds
that replay the warm-up (so that timing compiles nothing), the rejection rules, the provenance, the Markdown,
one real run end to end, and a runbook that names real stages, tests and flags within its time limits."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from learntok.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
RUNBOOK = ROOT / "bench" / "gpu_session.sh"
STAGE_LIMIT_S = 480
"""Each stage of the runbook ends within 8 minutes (the lent machine's limit is 10 per command)."""


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cpu_run(bench, tmp_path_factory):
    """One real run on the CPU: the comparison with a kernel table, one probe, a small GEMM as the ceiling."""
    out = tmp_path_factory.mktemp("bench-gpu")
    argv = ["bench_gpu.py", "--device", "cpu", "--configs", "tiny", "--modes", "eager", "--micro-batch", "2",
            "--rounds", "1", "--steps", "1", "--warmup", "1", "--micro-batches", "1", "--gemm-size", "64",
            "--profile", "3", "--out", str(out)]
    saved, sys.argv = sys.argv, argv
    try:
        bench.main()
    finally:
        sys.argv = saved
    return json.loads((out / "bench_gpu.json").read_text()), (out / "bench_gpu.md").read_text()


def _tiny(bench, bucket: int = 0):
    return bench.BenchConfig(ModelConfig(d_model=32, n_heads=2, n_down=1, n_mid=1, n_up=1, byte_window=8,
                                         token_bucket=bucket), 2, 64)


def test_attention_flops_count_windowed_and_causal_matmuls(bench):
    cfg = ModelConfig(d_model=12, n_heads=2, n_down=1, n_mid=2, n_up=1, byte_window=4)
    # 2 rows x 100 bytes, 20 tokens per row: byte 12*200*4*12*2 layers, tokens 6*2*20^2*12*2 layers
    assert bench.attention_flops(cfg, 200, 40, 2) == 12 * 200 * 4 * 12 * 2 + 6 * 2 * 400 * 12 * 2
    # a window longer than the row sees the row
    assert bench.attention_flops(cfg, 6, 0, 2) == 12 * 6 * 3 * 12 * 2


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


def test_rounds_replay_the_same_steps_from_the_saved_state(bench):
    r = bench.Runner(_tiny(bench, bucket=1), "learned", torch.device("cpu"), "fp32", compile=False, steps=3)
    r.step()
    r.snapshot()
    saved = [t.clone() for t in r._state()]
    first, second = bench.replay(r), bench.replay(r)
    assert first[1:] == second[1:]  # the same tokens and padding: the same token buckets
    after = [t.clone() for t in r._state()]
    assert any(not torch.equal(a, b) for a, b in zip(after, saved))  # the steps trained
    r.restore()
    assert all(torch.equal(a, b) for a, b in zip(r._state(), saved))


@pytest.mark.slow
def test_warmup_compiles_every_bucket_the_timed_rounds_meet(bench, monkeypatch):
    """Bucket 1 (a graph per token count), six steps a round: the warm-up meets several token counts, and the
    timed rounds, which replay it, build no graph (dynamo's eager backend: compilation is not the point)."""
    from learntok.model.lm import ByteLM

    real = ByteLM.compile_stages
    monkeypatch.setattr(ByteLM, "compile_stages", lambda self, **o: real(self, backend="eager", **o))
    args = types.SimpleNamespace(steps=6, warmup=1)
    try:
        rows = bench.bench("t", _tiny(bench, bucket=1), "compiled", ["learned", "uniform"], args,
                           torch.device("cpu"), "fp32", {"peak": None, "gemm": None}, rounds=2)
    finally:
        torch._dynamo.reset()
    learned, uniform = rows
    assert learned["graphs_compiled_warmup"] > 2, "stage 1 and several buckets"
    assert learned["graphs_compiled_while_timing"] == uniform["graphs_compiled_while_timing"] == 0
    assert learned["rejected"] is None and learned["ratio_rejected"] is None
    assert learned["learned_over_uniform"] > 0 and len(learned["step_s_rounds"]) == 2


@pytest.mark.parametrize("graphs,syncs,want", [
    (0, None, None), (0, 1, None), (0, 0, None),
    (2, 1, "2 graph(s) compiled while timing"), (0, 3, "3 host syncs per step"),
    (1, 2, "1 graph(s) compiled while timing; 2 host syncs per step"),
])
def test_rows_that_compiled_while_timing_or_synced_more_than_once_are_rejected(bench, graphs, syncs, want):
    assert bench.rejection({"graphs_compiled_while_timing": graphs, "host_syncs_per_step": syncs}) == want


def test_only_synchronising_calls_count_as_host_syncs_not_the_debug_modes_own_notice(bench):
    """torch 2.11 on an H200 (2026-11-28): setting the sync debug mode warns that it "is a prototype feature"
    (the word synchronization in it), which the first GPU run counted as a second sync per step."""
    import warnings

    def caught(message, line):
        return warnings.WarningMessage(UserWarning(message), UserWarning, "site.py", line)

    n, sites = bench.sync_sites([
        caught("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
               "operations", 1),
        caught("called a synchronizing CUDA operation (function operator())", 2),
        caught("some other warning", 3),
    ])
    assert (n, sites) == (1, ["site.py:2"])


def test_nvidia_smi_reading_picks_the_device_by_uuid(bench, monkeypatch):
    fields = "GPU-{u}, NVIDIA H100 80GB HBM3, 580.159.04, 81559, {sm}, 2619, 1980, 2619, 700.00, 41, P0"
    text = "\n".join([fields.format(u="aaaa", sm=345), fields.format(u="bbbb", sm=1980)]) + "\n"
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=text))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid="bbbb"))
    got = bench.nvidia_smi(torch.device("cuda"))
    assert got["gpu"] == "NVIDIA H100 80GB HBM3" and got["driver"] == "580.159.04"
    assert got["sm_clock_mhz"] == 1980 and got["max_mem_clock_mhz"] == 2619 and got["pstate"] == "P0"

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(bench.subprocess, "run", missing)
    assert bench.nvidia_smi(torch.device("cuda")) == {}
    assert bench.nvidia_smi(torch.device("cpu")) == {}


def test_cpu_run_writes_provenance_rows_probes_and_kernels(cpu_run):
    res, md = cpu_run
    prov = res["provenance"]
    for key in ("gpu", "driver", "cuda", "torch", "triton", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz",
                "gemm_tflops", "gemm_tflops_after", "peak_tflops", "command", "time_utc"):
        assert key in prov, key
    assert prov["torch"] == torch.__version__ and prov["gemm_size"] == 64 and prov["gemm_tflops"] > 0
    rows = {r["strategy"]: r for r in res["rows"]}
    assert set(rows) == {"learned", "uniform"}
    learned = rows["learned"]
    assert learned["bytes_per_s"] > 0 and 0.05 < learned["rate"] < 0.6
    assert learned["mfu"] is None  # no data-sheet peak for a CPU
    assert learned["mfu_vs_gemm"] > 0  # against the measured GEMM
    assert learned["graphs_compiled_while_timing"] == 0 and learned["rejected"] is None  # eager: nothing compiled
    assert learned["host_syncs_per_step"] is None  # counted on CUDA only
    assert learned["learned_over_uniform"] > 0 and len(learned["top_kernels"]) == 3
    probe, = res["memory"]
    assert probe["strategy"] == "learned" and probe["micro_batch"] == 1 and probe["runners_in_memory"] == 1
    assert "| tiny | eager | learned | 2x512 |" in md and "| tiny | eager | 1x512 |" in md
    assert "- measured GEMM ceiling:" in md and f"torch {torch.__version__}" in md
    assert "## Top kernels of one step: tiny, eager, learned" in md


def test_markdown_shows_rejections_and_out_of_memory(bench, cpu_run):
    res = copy.deepcopy(cpu_run[0])
    learned, uniform = res["rows"]
    uniform["rejected"] = bench.rejection({"graphs_compiled_while_timing": 0, "host_syncs_per_step": 4})
    learned["ratio_rejected"] = f"uniform: {uniform['rejected']}"
    res["memory"].append({"config": "tiny", "mode": "eager", "strategy": "learned", "micro_batch": 64,
                          "seq_len": 512, "out_of_memory": True, "rejected": "out of memory"})
    md = bench.markdown(res)
    assert f"{learned['learned_over_uniform']:.3f} (rejected)" in md
    assert "| 4 host syncs per step |" in md
    assert "| tiny | eager | 64x512 | - |" in md and "rejected: out of memory" in md


def _stages(script: str) -> dict[str, str]:
    """The runbook's case branches: stage name -> its commands (continued lines joined)."""
    body = script.split("\ncase $stage in\n")[-1]
    return dict(re.findall(r"^(\w[\w-]*)\)\n(.*?)^ *;;", body, re.S | re.M))


def test_gpu_runbook_names_real_stages_tests_and_benchmark_flags_within_its_limits():
    """bench/gpu_session.sh runs only on a lent GPU: keep what it names in step with the code here."""
    script = RUNBOOK.read_text().replace("\\\n", " ")  # join continued lines
    stages = _stages(script)
    usage = re.search(r'usage: bench/gpu_session.sh ([\w|-]+)', script).group(1).split("|")
    assert set(usage) == {"wheels", *stages} and set(stages) == {"smoke", "bench", "memory", "eager", "flex"}
    for name in stages:
        assert f"bench/gpu_session.sh {name} " in script, f"stage {name} is documented in the header"

    tests = re.findall(r"tests/test_\w+\.py", script)
    assert {"tests/test_gpu.py", "tests/test_flex.py"} <= set(tests) and all((ROOT / t).exists() for t in tests)
    gpu_tests = re.findall(r"^def (test_\w+)", (ROOT / "tests" / "test_gpu.py").read_text(), re.M)
    core = re.search(r'^CORE="(.*)"$', script, re.M).group(1).split(" or ")
    for term in core:
        assert any(term in t for t in gpu_tests), f"-k term {term!r} selects no test in tests/test_gpu.py"
    assert any(not any(term in t for term in core) for t in gpu_tests)  # the eager stage runs the others
    assert '-k "$CORE"' in stages["smoke"] and '-k "not ($CORE)"' in stages["eager"]
    pytest_line = re.search(r"^PYTEST=\((.*)\)$", script, re.M).group(1)
    assert "-p no:cacheprovider -o addopts=" in pytest_line

    for name, body in stages.items():
        limits = [int(k) + int(n) for k, n in re.findall(r"timeout -k (\d+) (\d+) ", body)]
        commands = [line for line in body.splitlines()
                    if re.search(r"bench/bench_\w+\.py", line) or "PYTEST[@]" in line]
        assert len(limits) == len(commands) > 0, f"{name}: every command under its own timeout"
        assert sum(limits) <= STAGE_LIMIT_S - 20, f"{name}: {sum(limits)} s of limits, 20 s left for the rest"
        for line in commands:
            if "PYTEST[@]" in line:
                assert re.search(r"--timeout=\d+ ", line) and f'--junitxml="$out/{name}-tests.xml"' in line
            else:
                source = (ROOT / re.search(r"bench/bench_\w+\.py", line).group(0)).read_text()
                flags = set(re.findall(r"(--[a-z][a-z-]+)", line))
                assert flags and all(f'"{f}"' in source for f in flags), line
                assert f'--out "$out/{name}"' in line


def test_flex_block_bench_counts_the_scores_each_block_pair_computes(capsys):
    """bench/bench_flex_blocks.py: at a byte window of 64, today's 128 x 128 blocks compute about 4 scores per
    visible one, smaller blocks fewer; without CUDA it says why in one line and exits 2; bad pairs are refused."""
    spec = importlib.util.spec_from_file_location("bench_flex_blocks", ROOT / "bench" / "bench_flex_blocks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ratios = [mod.scores_computed(1024, 64, b) for b in ((128, 128), (128, 64), (64, 64), (32, 32))]
    assert ratios == sorted(ratios, reverse=True) and 3.8 < ratios[0] < 4.0 and 1.4 < ratios[-1] < 1.6
    assert mod.scores_computed(1024, 64, (64, 64)) == pytest.approx(2.0, abs=0.1)
    with pytest.raises(Exception, match="powers of two"):
        mod.parse_block("100x64")
    assert mod.parse_variant("64x64:autotune") == ((64, 64), True) and mod.parse_variant("128x64")[1] is False
    with pytest.raises(Exception, match="QxK:autotune"):
        mod.parse_variant("64x64:fast")
    try:
        raise RuntimeError("backend='inductor' raised:") from ValueError("first\nQ and KV block size must be ...")
    except RuntimeError as e:
        assert mod._reason(e) == "ValueError: Q and KV block size must be ..."  # the kernel's own message
    if not torch.cuda.is_available():
        assert mod.main(["--seq", "512", "--variants", "128x128", "64x64:autotune", "64x64"]) == 2
        out, err = capsys.readouterr()
        assert "64x64: computes" in out and err.count("\n") == 1 and "no CUDA device" in err
