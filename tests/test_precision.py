"""Numerics and memory options of training: --precision (fp32, bf16-mixed, pure bf16) on the CPU fallback the
GPU path shares, activation checkpointing (same gradients, recomputed), and FlexAttention refused for CPU
training with one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from learntok.cli import main
from learntok.device import resolve_precision
from learntok.train import train

from .conftest import build_model, tiny_train_config


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss/auto"] for r in rows if "loss/auto" in r]


def test_auto_precision_is_bf16_mixed_on_cuda_and_fp32_on_cpu():
    assert resolve_precision("auto", torch.device("cuda")) == "bf16-mixed"
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"


def test_bf16_runs_track_the_fp32_run(tmp_path, text_corpus):
    """Six learned-boundary steps in each mode: every loss finite, within bf16's tolerance of fp32's, and not
    bit-equal to it (bf16 really ran). Pure bf16 keeps bf16 weights in the checkpoint."""
    runs = {}
    for p in ("fp32", "bf16-mixed", "bf16"):
        train(tiny_train_config(tmp_path / p, text_corpus, precision=p), log=lambda *_: None)
        runs[p] = _losses(tmp_path / p)
    for p in ("bf16-mixed", "bf16"):
        assert len(runs[p]) == len(runs["fp32"]) == 6
        diff = max(abs(a - b) for a, b in zip(runs[p], runs["fp32"]))
        assert 0 < diff < 0.1, (p, runs[p], runs["fp32"])
    from safetensors.torch import load_file
    weights = load_file(next((tmp_path / "bf16").glob("step_*/model.safetensors")))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


def test_activation_checkpointing_gives_the_same_gradients():
    """Recomputed blocks (byte levels and the packed token level) give the gradients the stored ones give."""
    grads = []
    for recompute in (False, True):
        m = build_model("learned")
        m.activation_checkpointing = recompute
        ids = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(2))
        out = m(ids, ids.roll(-1, 1), noise=torch.rand(3, 40, generator=torch.Generator().manual_seed(3)))
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-6, msg=n)


def test_activation_checkpointing_trains(tmp_path, text_corpus):
    a = tiny_train_config(tmp_path / "a", text_corpus, max_steps=3)
    b = tiny_train_config(tmp_path / "b", text_corpus, max_steps=3, activation_checkpointing=True)
    train(a, log=lambda *_: None)
    train(b, log=lambda *_: None)
    torch.testing.assert_close(_losses(tmp_path / "b"), _losses(tmp_path / "a"), rtol=1e-5, atol=1e-6)


def test_flex_backend_on_cpu_training_is_one_line(tmp_path, text_corpus, capsys):
    code = main(["train", "--data", str(text_corpus), "--out", str(tmp_path / "r"), "--preset", "tiny",
                 "--max-steps", "1", "--attn-backend", "flex", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot train on CPU" in err[0], err


@pytest.mark.parametrize("value", ["fp16", "bf"])
def test_unknown_precision_is_one_line(tmp_path, value, capsys):
    code = main(["train", "--out", str(tmp_path / "r"), "--precision", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "precision" in err[0], err


def test_policy_samples_repeat_each_sequence_in_consecutive_rows(tmp_path, text_corpus):
    """--policy-samples 2: every training batch holds each sequence twice, side by side, with different
    boundaries (the noise is keyed on the row); the run trains and its losses are finite."""
    from learntok.boundaries import boundary_config
    from learntok.model.lm import ByteLM

    seen = []
    real = ByteLM.forward

    def spy(self, ids, *a, **k):
        out = real(self, ids, *a, **k)
        if self.training and torch.is_grad_enabled():
            seen.append((ids.clone(), out.boundaries.mask.clone()))
        return out

    cfg = tiny_train_config(tmp_path / "k2", text_corpus, max_steps=3,
                            boundary=boundary_config("learned", policy_samples=2))
    ByteLM.forward = spy
    try:
        train(cfg, log=lambda *_: None)
    finally:
        ByteLM.forward = real
    assert len(seen) == 3
    for ids, mask in seen:
        assert ids.shape[0] == 4
        assert torch.equal(ids[0], ids[1]) and torch.equal(ids[2], ids[3]) and not torch.equal(ids[0], ids[2])
        assert not torch.equal(mask[0], mask[1])
    assert all(map(math.isfinite, _losses(tmp_path / "k2")))


def test_policy_samples_that_split_a_micro_batch_are_one_line(tmp_path, text_corpus, capsys):
    code = main(["train", "--data", str(text_corpus), "--out", str(tmp_path / "r"), "--preset", "tiny",
                 "--max-steps", "1", "--policy-samples", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--policy-samples 3" in err[0], err


def test_fp32_on_cuda_turns_tf32_off_after_a_bf16_run_turned_it_on():
    """TF32 is a process-wide flag: a bf16 run turns it on for its fp32 matmuls, and an fp32 run later in the
    same process (a test comparing "fp32" runs) must turn it off again, not inherit it. The flag is set
    through torch's new API where it exists, so reading the legacy flag still works (mixing both is an
    error in torch >= 2.9). No CUDA needed: the flags are process state."""
    from learntok.device import configure_matmul, set_tf32, tf32_enabled

    saved = tf32_enabled()
    try:
        configure_matmul("bf16-mixed", torch.device("cuda"))
        assert tf32_enabled()
        configure_matmul("fp32", torch.device("cuda"))
        assert not tf32_enabled()
        assert torch.backends.cuda.matmul.allow_tf32 is False  # no mixed-API error
        configure_matmul("bf16-mixed", torch.device("cpu"))  # nothing on CPU
        assert not tf32_enabled()
    finally:
        set_tf32(saved)


@pytest.mark.parametrize("residual", ["autocast", "fp32"])
def test_the_residual_stream_is_bf16_under_bf16_mixed_when_asked(residual):
    """Under bf16 autocast every block's input (the residual stream) is bf16 with --residual-dtype autocast and
    fp32 with fp32 (the default); without autocast it is the weights' fp32 either way. Logits stay fp32, and the
    two streams give the same logits up to bf16 rounding."""
    from learntok.boundaries import boundary_config
    from learntok.config import ModelConfig
    from learntok.model import build_model

    def run(residual_dtype: str, mixed: bool):
        torch.manual_seed(0)
        m = build_model(ModelConfig(d_model=32, n_heads=2, n_mid=1, byte_window=8, residual_dtype=residual_dtype),
                        boundary_config("uniform"))
        seen = []
        for blk in [*m.down, *m.mid, *m.up]:
            blk.register_forward_pre_hook(lambda mod, args: seen.append(args[0].dtype))
        ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            out = m(ids, ids)
        return out, set(seen)

    out, dtypes = run(residual, mixed=True)
    assert dtypes == {torch.bfloat16 if residual == "autocast" else torch.float32}
    assert out.logits.dtype == torch.float32 and out.loss.dtype == torch.float32
    assert run(residual, mixed=False)[1] == {torch.float32}
    other, _ = run("fp32" if residual == "autocast" else "autocast", mixed=True)
    torch.testing.assert_close(out.logits, other.logits, atol=2e-2, rtol=0)  # logits ~0.5; 4e-3 seen


def test_fsdp_keeps_fp32_runs_fp32_and_the_residual_stream_its_own_dtype():
    """FSDP2 on CUDA used bf16 parameters whatever --precision said (an fp32 run computed in bf16) and cast every
    block's inputs to bf16 (the residual stream too). Now only bf16-mixed gathers bf16 parameters, and it leaves
    the blocks' inputs alone; with bf16 weights under autocast the stream is still fp32 by default."""
    from learntok.boundaries import boundary_config
    from learntok.config import ModelConfig
    from learntok.model import build_model
    from learntok.train.parallel import fsdp_mixed_precision

    cuda = torch.device("cuda")
    mixed = fsdp_mixed_precision("bf16-mixed", cuda)
    assert mixed.param_dtype == torch.bfloat16 and mixed.reduce_dtype == torch.float32
    assert not mixed.cast_forward_inputs
    for precision, dev in (("fp32", cuda), ("bf16", cuda), ("bf16-mixed", torch.device("cpu"))):
        assert fsdp_mixed_precision(precision, dev).param_dtype is None
    m = build_model(ModelConfig(d_model=32, n_heads=2, n_mid=1, byte_window=8), boundary_config("uniform"))
    m.embed.to(torch.bfloat16)  # what FSDP2 gathers under bf16-mixed
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m._embed(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.float32
