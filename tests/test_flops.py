"""The three FLOPs conventions (learntok.model.flops) as training logs them: the paper's 6N, 6N with padded
token slots, and 6N plus attention, checked against hand counts on runs whose token counts are known."""

from __future__ import annotations

import pytest

from learntok.boundaries import boundary_config
from learntok.model.flops import window_pairs
from learntok.train import train
from learntok.viz.curves import load_metrics

from .conftest import tiny_train_config


def test_window_pairs_by_enumeration():
    for T in (1, 5, 64):
        for W in (None, 1, 3, 8, 100):
            brute = sum(min(t + 1, W or T) for t in range(T))
            assert window_pairs(T, W) == brute, (T, W)


def _last(tmp_path, corpus, strategy: str, **kw):
    cfg = tiny_train_config(tmp_path / strategy, corpus, boundary=boundary_config(strategy, **kw), max_steps=2)
    train(cfg, log=lambda *_: None)
    return cfg, load_metrics(tmp_path / strategy).evals[-1]


def test_flat_attention_is_counted_in_total_only(tmp_path, text_corpus):
    """flat: every byte a token, so 6N = 6 (byte + token params) x bytes, nothing is padded, and total adds the
    byte windows and full causal attention over every position."""
    cfg, row = _last(tmp_path, text_corpus, "flat")
    from learntok.model import build_model

    m = build_model(cfg.model, cfg.boundary)
    pb, pt = m.matrix_params()
    T, rows = cfg.data.seq_len, 2 * cfg.batch_size  # two steps
    assert row["flops"] == pytest.approx(6 * (pb + pt) * rows * T)
    assert row["flops_padded"] == pytest.approx(row["flops"])
    d, mc = cfg.model.d_model, cfg.model
    attn = 12 * d * rows * ((mc.n_down + mc.n_up) * window_pairs(T, mc.byte_window) + mc.n_mid * T * (T + 1) / 2)
    assert row["flops_total"] - row["flops"] == pytest.approx(attn)


def test_padded_slots_cost_only_variable_rates(tmp_path, text_corpus):
    """uniform: every row has the same token count, so padding costs nothing; learned: rows differ, so the
    padded count is larger than the paper's."""
    _, uni = _last(tmp_path, text_corpus, "uniform")
    assert uni["flops_padded"] == pytest.approx(uni["flops"]) and uni["flops_total"] > uni["flops"]
    _, lrn = _last(tmp_path, text_corpus, "learned")
    assert lrn["flops_padded"] > lrn["flops"]


def test_a_flops_budget_ends_the_run_and_drives_the_schedule(tmp_path, text_corpus):
    """--schedule flops --flops-budget B: training stops at the first step whose counter (in the chosen
    convention) reaches B, the cosine reaching its floor there; a resume after that is one line; under the
    total convention the same budget buys fewer steps."""
    from dataclasses import replace

    from learntok.config import OptimConfig

    uni = boundary_config("uniform")  # the same tokens every step: FLOPs per step are constant
    probe = tiny_train_config(tmp_path / "probe", text_corpus, max_steps=1, boundary=uni)
    train(probe, log=lambda *_: None)
    probe_row = load_metrics(tmp_path / "probe").evals[-1]
    per_step, per_step_total = probe_row["flops"], probe_row["flops_total"]
    assert per_step_total > per_step
    budget = 4 * (per_step + per_step_total) / 2  # 5 steps of 6N, 4 of total
    optim = OptimConfig(warmup_bytes=0, lr=3e-3, schedule="flops")
    cfg = tiny_train_config(tmp_path / "f", text_corpus, max_steps=0, optim=optim, flops_budget=budget, boundary=uni)
    train(cfg, log=lambda *_: None)
    m = load_metrics(tmp_path / "f")
    assert m.evals[-1]["flops"] >= budget > m.train[-2]["flops"]
    lrs = [r["train/lr"] for r in m.train]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.5 * 3e-3
    with pytest.raises(ValueError, match="FLOPs budget .* was used up"):
        train(replace(cfg, resume=str(tmp_path / "f")), log=lambda *_: None)
    total = replace(cfg, out=str(tmp_path / "t"), flops_convention="total")
    train(total, log=lambda *_: None)
    assert m.evals[-1]["step"] == 5 and load_metrics(tmp_path / "t").evals[-1]["step"] == 4
    with pytest.raises(ValueError, match="--schedule flops needs --flops-budget"):
        train(replace(cfg, out=str(tmp_path / "x"), flops_budget=0.0), log=lambda *_: None)
    # a periodic evaluation at the step that spends the budget is the final one: one line, not two
    every = replace(cfg, out=str(tmp_path / "e"), eval_every=5)
    res = train(every, log=lambda *_: None)
    evals = load_metrics(tmp_path / "e").evals
    assert [r["step"] for r in evals] == [5] and res.val_bpb == evals[-1]["val/bpb"]
