"""The GPU path end to end (issue 16), on a CUDA device: a bf16 training run on the GPU tracks the fp32 CPU
run's loss curve, cached generation on the GPU equals the full forward pass, `torchrun --nproc-per-node 1`
trains under DDP over NCCL like a plain process, the compiled step (inductor) trains like the eager one with no
graph break, and the GPU-only FlexAttention backward pass trains like the eager backend.

Skipped without CUDA. `LEARNTOK_TEST_DEVICE=cpu pytest tests/test_gpu.py` runs the same checks on the CPU
(bf16 autocast, gloo, dynamo's eager backend instead of inductor, no flex training), which keeps their logic
tested where no GPU is; `bench/gpu_session.sh` runs them on a lent GPU."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from learntok.boundaries import boundary_config
from learntok.train import train

from .conftest import build_model, tiny_model, tiny_train_config, write_text_corpus
from .test_distributed import _run, _weights
from .test_generate import STEP_STRATEGIES, assert_cached_steps_equal_full_forward

DEVICE = os.environ.get("LEARNTOK_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
CUDA = DEVICE.startswith("cuda")
pytestmark = [
    pytest.mark.skipif(not DEVICE, reason="needs a CUDA GPU (LEARNTOK_TEST_DEVICE=cpu runs these checks on CPU)"),
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
]

CURVE_STEPS, CURVE_WINDOW = 200, 25
CURVE_TOL = {"bf16-mixed": 0.05, "bf16": 0.15}
"""Largest allowed gap (nats) between a bf16 run's and the fp32 CPU run's mean training loss over any window of
CURVE_WINDOW steps. The runs draw the same batches and boundary noise; bf16 rounding moves boundaries whose
probability sits near their uniform, so the curves drift apart slowly rather than agreeing to the bit."""


def _losses(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss/auto"' in x]
    return [r["loss/auto"] for r in rows]


def _window_means(xs: list[float]) -> list[float]:
    return [sum(xs[i:i + CURVE_WINDOW]) / CURVE_WINDOW for i in range(0, len(xs) - CURVE_WINDOW + 1, CURVE_WINDOW)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_text_corpus(tmp_path_factory.mktemp("gpu") / "corpus")


def _curve_config(out: Path, corpus: Path, **kw):
    return tiny_train_config(out, corpus, max_steps=CURVE_STEPS, batch_size=8, lr=3e-3, warmup_bytes=8 * 64 * 20,
                             model=tiny_model(d_model=64, n_heads=4), **kw)


@pytest.fixture(scope="module")
def fp32_cpu_curve(corpus, tmp_path_factory) -> list[float]:
    out = tmp_path_factory.mktemp("fp32-cpu") / "run"
    train(_curve_config(out, corpus, device="cpu", precision="fp32"), log=lambda *_: None)
    return _losses(out)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_bf16_training_on_the_device_tracks_the_fp32_cpu_curve(precision, corpus, fp32_cpu_curve, tmp_path):
    train(_curve_config(tmp_path / "run", corpus, device=DEVICE, precision=precision), log=lambda *_: None)
    ours = _losses(tmp_path / "run")
    assert len(ours) == len(fp32_cpu_curve) == CURVE_STEPS
    a, b = _window_means(ours), _window_means(fp32_cpu_curve)
    gap = max(abs(x - y) for x, y in zip(a, b))
    print(f"{precision} on {DEVICE} vs fp32 on cpu: window means {[round(x, 3) for x in a]} vs "
          f"{[round(x, 3) for x in b]}, largest gap {gap:.4f}")
    assert a[-1] < a[0] - 0.5 and b[-1] < b[0] - 0.5  # both learned something
    assert gap < CURVE_TOL[precision]
    assert ours != fp32_cpu_curve  # bf16 really ran


@pytest.fixture
def strict_fp32():
    """Full fp32 matmuls on CUDA (an earlier bf16 run enables TF32 process-wide). Through learntok.device's
    helpers: torch >= 2.9 refuses to read the legacy allow_tf32 flag once the new one has been set."""
    from learntok.device import set_tf32, tf32_enabled

    saved = tf32_enabled()
    set_tf32(False)
    yield
    set_tf32(saved)


@pytest.mark.parametrize("strategy", STEP_STRATEGIES)
def test_cached_generation_on_the_device_equals_the_full_forward_pass(strategy, tmp_path, strict_fp32):
    """On CUDA the full pass attends with FlexAttention (the auto backend) and the cached step with
    attend_cached: the same boundaries, logits within 1e-4."""
    m = build_model(strategy, tmp_path, model_kw={"byte_window": 8}).eval()
    assert_cached_steps_equal_full_forward(m, DEVICE)


def test_sampling_and_segmenting_run_on_the_device(tmp_path):
    """Next-byte sampling draws on the logits' device; the segmenter feeds the model's device."""
    from learntok.generation import generate
    from learntok.segment import Segmenter

    m = build_model("learned", tmp_path).eval().to(DEVICE)
    out = generate(m, ["def", "import os\n"], 12, temperature=0.8, top_k=50, top_p=0.9, seed=1)
    assert all(len(o) <= 12 for o in out) and any(out)
    text = b"tokenization on the device, in several windows of sixteen bytes"
    assert len(Segmenter(m, window=16).boundaries(text)) == len(text)


def test_torchrun_with_one_process_on_the_device_is_ddp_over_nccl(corpus, tmp_path):
    """World size 1 under a launcher: a process group (NCCL on CUDA) and a DDP wrapper, a plain run's result."""
    cfg = tiny_train_config(tmp_path / "x", corpus, max_steps=3, batch_size=4, lr=1e-2, device=DEVICE,
                            precision="fp32")
    _run(replace(cfg, out=str(tmp_path / "plain")), world=1)
    _run(replace(cfg, out=str(tmp_path / "group")), world=1, launcher=True)
    group = json.loads((tmp_path / "group" / "group.json").read_text())
    assert group == {"backend": "nccl" if CUDA else "gloo", "world": 1, "ddp": 1}
    a, b = _weights(tmp_path / "plain"), _weights(tmp_path / "group")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_compiled_training_on_the_device_matches_eager_with_no_graph_break(corpus, tmp_path, monkeypatch,
                                                                          strict_fp32):
    """`--compile` on the device: inductor on CUDA (dynamo's eager backend on CPU, where inductor takes minutes),
    bucketed token shapes, the paper's w = 8 policy window; 0 graph breaks, at most one stage-2 graph per
    bucket, and the eager run's losses."""
    from torch._dynamo.utils import counters

    from learntok.model.lm import ByteLM

    if not CUDA:
        real = ByteLM.compile_stages
        monkeypatch.setattr(ByteLM, "compile_stages", lambda self, **o: real(self, backend="eager", **o))
    bcfg = boundary_config("learned", policy_window=8)
    losses = []
    counters.clear()
    for compiled in (False, True):
        out = tmp_path / f"run-{compiled}"
        train(tiny_train_config(out, corpus, boundary=bcfg, compile=compiled, max_steps=30, device=DEVICE,
                                precision="fp32"), log=lambda *_: None)
        losses.append(_losses(out))
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    assert breaks == 0
    assert losses[1] == pytest.approx(losses[0], abs=2e-3 if CUDA else 1e-5)


@pytest.mark.skipif(not CUDA, reason="FlexAttention has no backward pass on CPU")
def test_flex_backend_trains_like_the_eager_backend(corpus, tmp_path, strict_fp32):
    losses = {}
    for backend in ("eager", "flex"):
        model = tiny_model(attn_backend=backend, attn_softcap=50.0)
        train(tiny_train_config(tmp_path / backend, corpus, model=model, max_steps=20, device=DEVICE,
                                precision="fp32"), log=lambda *_: None)
        losses[backend] = _losses(tmp_path / backend)
    assert losses["flex"] == pytest.approx(losses["eager"], abs=1e-3)


def test_a_two_level_model_trains_and_generates_on_the_device(corpus, tmp_path, strict_fp32):
    """The hierarchy (--inner-layers) on the device: with FlexAttention (the CUDA default) it trains like the
    eager backend, both levels' policies included, and its cached steps (byte levels cached, the token levels
    again at each new token) give the full forward pass's boundaries and logits."""
    hier = dict(inner_layers=1, inner_rate=0.5)
    losses = {}
    for backend in ("eager", "flex") if CUDA else ("eager",):
        model = tiny_model(attn_backend=backend, attn_softcap=50.0, **hier)
        train(tiny_train_config(tmp_path / backend, corpus, model=model, max_steps=20, device=DEVICE,
                                precision="fp32"), log=lambda *_: None)
        losses[backend] = _losses(tmp_path / backend)
    assert losses["eager"][-1] < losses["eager"][0]
    if CUDA:
        assert losses["flex"] == pytest.approx(losses["eager"], abs=1e-3)
    m = build_model("learned", tmp_path, {**hier, "byte_window": 8}, target_rate=0.6).eval()
    assert_cached_steps_equal_full_forward(m, DEVICE)


def test_two_level_training_compiles_without_graph_breaks(corpus, tmp_path, monkeypatch, strict_fp32):
    """--compile with --inner-layers (block by block: inductor on CUDA, dynamo's eager backend on CPU): 0 graph
    breaks and the eager run's losses."""
    from torch._dynamo.utils import counters

    from learntok.model.hier import HierLM

    if not CUDA:
        real = HierLM.compile_stages
        monkeypatch.setattr(HierLM, "compile_stages", lambda self, **o: real(self, backend="eager", **o))
    losses = []
    counters.clear()
    for compiled in (False, True):
        out = tmp_path / f"run-{compiled}"
        train(tiny_train_config(out, corpus, model=tiny_model(inner_layers=1, inner_rate=0.5), compile=compiled,
                                max_steps=20, device=DEVICE, precision="fp32"), log=lambda *_: None)
        losses.append(_losses(out))
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    assert breaks == 0
    assert losses[1] == pytest.approx(losses[0], abs=2e-3 if CUDA else 1e-5)


@pytest.mark.skipif(not CUDA, reason="sync debug mode is a CUDA feature")
def test_a_bucketed_training_step_waits_for_the_device_once():
    """With --token-bucket a step's forward, backward and fused AdamW make one synchronising call, the read of
    the bucket's token count (the paper's w = 8 policy draws by the scan, with no host read)."""
    import importlib.util
    import sys
    from dataclasses import replace as dc_replace

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_gpu", root / "bench" / "bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = bench
    spec.loader.exec_module(bench)
    tiny = bench._configs()["tiny"]
    bc = dc_replace(tiny, model=dc_replace(tiny.model, token_bucket=64, attn_backend="flex"))
    runner = bench.Runner(bc, "learned", torch.device(DEVICE), "bf16-mixed", compile=False)
    for _ in range(3):  # flex kernels compile on first use
        runner.step()
    n, sites = bench.host_syncs(runner)
    print(f"host syncs per step: {n} at {sites}")
    assert n <= 1, sites
