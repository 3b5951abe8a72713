"""What the small-scale study needs: mean pooling for select-based strategies, boundary overrides and the
held-out diagnostics, and the wall-clock learning-rate schedule."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from learntok.boundaries import boundary_config
from learntok.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from learntok.evaluation.diagnostics import boundary_diagnostics
from learntok.train import check_config, lr_at, train
from learntok.vocab import BOS

from .conftest import build_model

MEAN_POOLED = ["learned", "uniform", "uniform-random", "whitespace"]


def _ids(B: int, T: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(32, 127, (B, T + 1), generator=g)
    ids[:, 0] = BOS
    ids[:, 7::6] = ord(" ")
    return ids


@pytest.mark.parametrize("strategy", MEAN_POOLED)
def test_mean_pooling_tokens_are_group_means_and_causal(strategy, tmp_path):
    m = build_model(strategy, tmp_path, pooling="mean")
    B, T, j = 2, 40, 17
    seq = _ids(B, T, 1)
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(3))
    x = m.encode(seq[:, :-1])
    out = m.boundary.propose(x, seq[:, :-1], noise=noise, generator=None)
    tok = m.boundary.downsample(x, out)
    for b in range(B):  # token k = mean of x over (boundary k-1, boundary k]
        ends = out.mask[b].nonzero().flatten().tolist()
        starts = [0] + [e + 1 for e in ends[:-1]]
        for k, (s, e) in enumerate(zip(starts, ends)):
            torch.testing.assert_close(tok.x[b, k], x[b, s:e + 1].mean(0), rtol=1e-5, atol=1e-5)
    seq2 = seq.clone()
    seq2[:, j:] = _ids(B, T, 2)[:, j:]
    o1 = m(seq[:, :-1], seq[:, 1:], noise=noise)
    o2 = m(seq2[:, :-1], seq2[:, 1:], noise=noise)
    torch.testing.assert_close(o1.logits[:, :j], o2.logits[:, :j], rtol=0, atol=1e-5)
    assert not torch.allclose(o1.logits[:, j:], o2.logits[:, j:])


@pytest.mark.parametrize("strategy", ["learned", "whitespace"])
def test_mean_pooling_cached_generation_equals_full_forward(strategy, tmp_path):
    m = build_model(strategy, tmp_path, pooling="mean", model_kw={"byte_window": 8}).eval()
    B, T = 3, 40
    ids = _ids(B, T - 1, 4)
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = m(ids, noise=noise)
    state = m.init_state(B, noise)
    logits = torch.stack([m.step(ids[:, t], state)[0] for t in range(T)], 1)
    torch.testing.assert_close(logits, full.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strategy", ["dynamic", "hnet"])
def test_mean_pooling_leaves_strategies_with_their_own_pooling_alone(strategy):
    from learntok.boundaries import build_strategy

    assert build_strategy(boundary_config("uniform", pooling="mean"), 16).mean_pooling
    assert not build_strategy(boundary_config(strategy, pooling="mean"), 16).mean_pooling


def test_boundary_override_replaces_the_draw(tmp_path):
    m = build_model("learned", tmp_path).eval()
    seq = _ids(2, 30, 5)
    none = torch.zeros(2, 30, dtype=torch.bool)
    with torch.no_grad():
        out = m(seq[:, :-1], seq[:, 1:], noise=torch.rand(2, 30), boundaries=none)
        ref = m(seq[:, :-1], seq[:, 1:], noise=torch.rand(2, 30))
    assert out.n_tokens.tolist() == [1, 1]  # only the forced BOS boundary
    assert out.boundaries.mask[:, 0].all() and not out.boundaries.mask[:, 1:].any()
    assert not torch.allclose(out.logits, ref.logits)


def _batches(n: int = 2) -> list:
    return [(_ids(4, 48, 10 + i), None) for i in range(n)]


def test_diagnostics_of_spacebyte_boundaries(tmp_path):
    m = build_model("whitespace", tmp_path)
    d = boundary_diagnostics(m, _batches(), "cpu")
    assert d["spacebyte_f1"] == pytest.approx(1.0)
    assert d["spacebyte_precision"] == pytest.approx(1.0) and d["spacebyte_recall"] == pytest.approx(1.0)
    assert 0 < d["spacebyte_f1_chance"] < 1
    assert d["wordstart_f1"] == 0.0  # a SpaceByte boundary is never followed by another one
    assert d["sensitivity"] == pytest.approx(d["bpb_rate0"] - d["bpb"])
    assert d["placement"] == pytest.approx(d["bpb_random"] - d["bpb"])
    assert m.training  # restored


def test_diagnostics_rate0_equals_a_forward_without_boundaries(tmp_path):
    m = build_model("uniform", tmp_path).eval()
    batches = _batches(1)
    d = boundary_diagnostics(m, batches, "cpu")
    seq = batches[0][0]
    with torch.no_grad():
        out = m(seq[:, :-1], seq[:, 1:], boundaries=torch.zeros(seq[:, :-1].shape, dtype=torch.bool))
    assert d["bpb_rate0"] == pytest.approx(float(out.nll.sum()) / (math.log(2) * out.nll.numel()), rel=1e-6)
    assert d["rate"] == pytest.approx(0.2, abs=0.02)
    assert d["sensitivity"] != 0.0


def _cfg(tmp_path, optim: dict | None = None, **kw) -> TrainConfig:
    return TrainConfig(out=str(tmp_path / "run"), model=ModelConfig(d_model=32, n_heads=2, byte_window=16),
                       boundary=boundary_config("uniform"), data=DataConfig(seq_len=64),
                       optim=OptimConfig(warmup_bytes=0, lr=1e-3, **(optim or {})), batch_size=2, progress=False,
                       eval_every=0, **kw)


def test_time_schedule_decays_over_the_budget(tmp_path):
    cfg = _cfg(tmp_path, optim=dict(schedule="time", min_lr_ratio=0.1), time_budget=100.0)
    assert lr_at(cfg.optim, 1e9, 1.0, elapsed=0.0, time_budget=100.0) == pytest.approx(1e-3)
    assert lr_at(cfg.optim, 1e9, 1.0, elapsed=50.0, time_budget=100.0) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    assert lr_at(cfg.optim, 10.0, 1e9, elapsed=100.0, time_budget=100.0) == pytest.approx(1e-4)
    assert lr_at(cfg.optim, 10.0, 1e9, elapsed=500.0, time_budget=100.0) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="--schedule time needs --time-budget"):
        check_config(dataclasses.replace(cfg, time_budget=0.0))
    check_config(cfg)  # no --max-steps / --max-bytes needed


@pytest.mark.slow
def test_time_scheduled_run_stops_at_its_budget(tmp_path):
    res = train(_cfg(tmp_path, optim=dict(schedule="time"), time_budget=2.0, ckpt_every=0), log=lambda *_: None)
    assert 0 < res.steps and res.seconds == pytest.approx(2.0, abs=1.5)
    import json
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["train/lr"] for r in rows if "train/lr" in r]
    assert lrs[-1] < lrs[0]


@pytest.mark.slow
def test_resuming_a_run_whose_time_budget_is_used_up_is_one_line(tmp_path):
    """`--resume RUN --max-steps N` after a --time-budget run used to do nothing ("time budget reached", exit 0) and
    append a second final evaluation to metrics.jsonl; now it says to give a larger budget and changes nothing."""
    from dataclasses import replace

    cfg = _cfg(tmp_path, optim=dict(schedule="time"), time_budget=0.5, ckpt_every=0)
    train(cfg, log=lambda *_: None)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match="time budget of 0.5 s was used up.*larger --time-budget"):
        train(replace(cfg, resume=str(tmp_path / "run"), max_steps=1000), log=lambda *_: None)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    res = train(replace(cfg, resume=str(tmp_path / "run"), time_budget=1.0), log=lambda *_: None)
    assert res.seconds > 0.5
    # stopped between the last checkpoint and the final evaluation (a kill, a preemption): resuming evaluates only
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines[:-1]) + "\n")  # the final evaluation's line, lost
    done = train(replace(cfg, resume=str(tmp_path / "run"), time_budget=1.0), log=lambda *_: None)
    last = json.loads(metrics.read_text().splitlines()[-1])
    assert "val/bpb" in last and last["step"] == done.steps == json.loads(lines[-1])["step"]
    assert last["val/bpb"] == pytest.approx(json.loads(lines[-1])["val/bpb"], abs=0)  # the same model, evaluated


def _run_script():
    """experiments/small_scale/run.py as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "experiments" / "small_scale" / "run.py"
    spec = importlib.util.spec_from_file_location("small_scale_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_curve_table_keeps_rows_a_shorter_baseline_lacks():
    """A byte count every learned seed reached is a row; a baseline that stopped short (a slower arm) shows a
    dash there instead of removing the row for everyone; differences pair each baseline with its seed."""
    def arm(strategy, seed, curve):
        return {"strategy": strategy, "seed": seed, "compare": "time", "curve": curve}

    M = 1_000_000
    results = {"arms": [arm("learned", 0, [[1 * M, 3.0], [2 * M, 2.5], [2.5 * M, 2.4]]),
                        arm("learned", 1, [[1 * M, 3.2], [2 * M, 2.7], [2.6 * M, 2.6]]),
                        arm("uniform", 0, [[1 * M, 2.9], [2 * M, 2.6], [2.4 * M, 2.5]]),
                        arm("uniform", 1, [[1 * M, 3.1], [2 * M, 2.8], [2.7 * M, 2.7]]),
                        arm("hnet", 0, [[1 * M, 2.8], [1.5 * M, 2.7]])]}
    lines = _run_script().curve_table(results)
    assert lines[3] == "| bytes | learned [0, 1] | uniform [0, 1] | uniform − learned | hnet [0] | hnet − learned |"
    rows = [line.strip("| ").split(" | ") for line in lines[5:]]
    assert rows == [["1.0 M", "3.1000 ± 0.1414", "3.0000 ± 0.1414", "-0.1000 ± 0.0000", "2.8000", "-0.2000"],
                    ["2.0 M", "2.6000 ± 0.1414", "2.7000 ± 0.1414", "0.1000 ± 0.0000", "—", "—"],
                    ["end", "2.5000 ± 0.1414", "2.6000 ± 0.1414", "0.1000 ± 0.0000", "2.7000", "0.3000"]]
