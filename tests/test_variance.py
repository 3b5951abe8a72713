"""`learntok diagnose variance`: every estimator of the chain is measured on the same draws, the paper's
reductions reduce the variance, and the centred estimator points where the reference does."""

from __future__ import annotations

import json

import pytest
import torch

from learntok.cli import main
from learntok.evaluation.variance import noise_and_signal, policy_gradient_variance, variant_names
from learntok.vocab import BOS

from .conftest import build_model, tiny_train_config


def test_variance_falls_along_the_chain_and_the_reference_is_its_own_direction():
    model = build_model("learned", policy_window=0, gamma=0.9)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(32, 127, (4, 33), generator=g)
    batch[:, 0] = BOS
    rows, info = policy_gradient_variance(model, batch, samples=12, reference_factor=4)
    assert [r.name for r in rows] == 2 * variant_names(0.9) and {r.group for r in rows} == {"policy", "encoder"}
    var = {(r.group, r.name): r for r in rows}
    assert var["policy", "naive"].variance > 10 * var["policy", "centred"].variance
    assert var["policy", "to-go"].variance < var["policy", "naive"].variance
    assert var["policy", "centred, gamma=1"].cosine > 0.5  # a third of the reference's own draws
    assert info["reference_samples"] == 48 and model.training


def test_diagnose_command_writes_its_table(tmp_path, text_corpus, capsys):
    from learntok.train import train

    run = tmp_path / "run"
    train(tiny_train_config(run, text_corpus, max_steps=2), log=lambda *_: None)
    assert main(["diagnose", "variance", str(run), "--samples", "4", "--batch-size", "2", "--init"]) == 0
    assert "| policy | naive |" in capsys.readouterr().out
    rows = json.loads((run / "diagnose-init" / "variance.json").read_text())["rows"]
    assert len(rows) == 2 * len(variant_names(0.99))  # policy and encoder groups
    assert main(["diagnose", "variance", str(run), "--samples", "1"]) == 2
    assert main(["diagnose", "variance", str(run), "--gammas", "1.5"]) == 2
    assert main(["diagnose", "variance", str(run), "--samples", "4", "--batch-size", "2", "--gammas", "0.5"]) == 0
    names = [r["name"] for r in json.loads((run / "diagnose-gammas" / "variance.json").read_text())["rows"]]
    assert "centred, gamma=0.5" in names and "gamma=0.5" in names
    assert main(["diagnose", "variance", str(run), "--level", "2"]) == 2
    assert "boundary level 2: this model has one level" in capsys.readouterr().err


def test_snr_is_corrected_for_the_noise_in_the_mean():
    """Draws with no signal read SNR ~ 0 (the plain ratio would read ~1/n); draws with a known signal read it."""
    g = torch.Generator().manual_seed(0)
    P, n = 400, 64
    noise = torch.randn(200, n, P, generator=g)  # tr(Cov) = P
    none = [noise_and_signal(x)[1] for x in noise]
    assert abs(sum(none) / len(none)) < 0.003  # plain ||mean||^2 / tr would be 1/n = 0.0156
    mu = torch.zeros(P)
    mu[0] = (0.05 * P) ** 0.5  # ||mu||^2 / tr(Cov) = 0.05
    some = [noise_and_signal(x + mu)[1] for x in noise]
    assert abs(sum(some) / len(some) - 0.05) < 0.005
    var, _ = noise_and_signal(noise[0])
    assert abs(var / P - 1) < 0.05


def test_a_model_with_a_value_head_is_measured_with_its_baseline_too():
    """--value-baseline adds the "value" estimator (the run's own): the centred returns minus the centred V(X_t),
    so a baseline equal on every row changes nothing and a row-dependent one shifts each row by its own value."""
    from learntok.boundaries.reinforce import batch_relative_advantage
    from learntok.evaluation.variance import _advantages

    model = build_model("learned", policy_window=0, gamma=0.9, value_baseline=True)
    batch = torch.randint(32, 127, (4, 17), generator=torch.Generator().manual_seed(0))
    batch[:, 0] = BOS
    rows, _ = policy_gradient_variance(model, batch, samples=3, reference_factor=2)
    names = variant_names(0.9, value=True)
    assert names.index("value") == names.index("centred") + 1 and [r.name for r in rows] == 2 * names

    g = torch.Generator().manual_seed(1)
    logp, early, value = (-torch.rand(4, 16, generator=g) for _ in range(3))
    keep = torch.rand(4, 16, generator=g) > 0.3
    r, total = (logp - early) * keep, (logp * keep).sum(1)
    centred = _advantages("centred", r, total, keep, 0.9)
    with_value = _advantages("value", r, total, keep, 0.9, value)
    torch.testing.assert_close(with_value, centred - batch_relative_advantage(value, keep))
    assert not torch.allclose(with_value, centred)
    same = value[:1].expand(4, 16)
    torch.testing.assert_close(_advantages("value", r, total, keep, 0.9, same), centred)


def test_other_discounts_are_measured_uncentred_and_centred():
    """--gammas G adds "gamma=G" and "centred, gamma=G" (once each, none for the run's gamma or 1); a centred
    estimator at G centres the returns discounted by G: at the run's gamma it is "centred", at 0 the centred
    one-step rewards."""
    from learntok.boundaries.reinforce import batch_relative_advantage
    from learntok.evaluation.variance import _advantages

    names = variant_names(0.9, extra=(0.5, 0.9, 1.0, 0.0, 0.5))
    assert [n for n in names if n.startswith("centred")] == ["centred, gamma=1", "centred, gamma=0.5",
                                                             "centred, gamma=0", "centred"]
    assert "gamma=0.5" in names and "gamma=0" in names and len(names) == len(set(names))
    alike = variant_names(0.9, extra=(0.30000001, 0.3, 0.9999999, 0.90000001))  # discounts that print alike
    assert len(alike) == len(set(alike)) and "centred, gamma=0.3" in alike and alike.count("centred, gamma=1") == 1
    g = torch.Generator().manual_seed(2)
    r = torch.randn(4, 10, generator=g)
    keep = torch.rand(4, 10, generator=g) > 0.2
    r, total = r * keep, r.sum(1)
    torch.testing.assert_close(_advantages("centred, gamma=0", r, total, keep, 0.9), batch_relative_advantage(r, keep))
    torch.testing.assert_close(_advantages("centred, gamma=0.9", r, total, keep, 0.9),
                               _advantages("centred", r, total, keep, 0.9))
    assert not torch.allclose(_advantages("centred, gamma=0.5", r, total, keep, 0.9),
                              _advantages("centred", r, total, keep, 0.9))
    model = build_model("learned", policy_window=0, gamma=0.9)
    batch = torch.randint(32, 127, (4, 17), generator=torch.Generator().manual_seed(0))
    batch[:, 0] = BOS
    rows, info = policy_gradient_variance(model, batch, samples=3, reference_factor=2, gammas=(0.5,))
    assert [r.name for r in rows] == 2 * variant_names(0.9, extra=(0.5,)) and info["gammas"] == [0.5]
    model.eval()
    with pytest.raises(ValueError, match="discounts must be in"):
        policy_gradient_variance(model, batch, samples=3, gammas=(1.5,))
    assert not model.training  # refused before anything changed


def _run_estimator_against_own_loss(model, batch, level, strategy, monkeypatch, gamma=None) -> float:
    """Cosine, on one draw, of the diagnostic's run estimator (at discount `gamma`, default the strategy's own) to
    the gradient of the strategy's own policy loss."""
    from learntok.evaluation.variance import _advantages, _decisions

    captured = {}
    real = type(strategy).losses.__get__(strategy)  # the class method, whatever an earlier call patched
    monkeypatch.setattr(strategy, "losses", lambda *a, **k: captured.setdefault("aux", real(*a, **k)))
    ids, targets = batch[:, :-1], batch[:, 1:]
    out = model(ids, targets, noise=torch.rand(ids.shape, generator=torch.Generator().manual_seed(5)))
    bo, r, total, keep = _decisions(out, targets, level)
    assert keep.sum() > 4 and r.shape == bo.mask.shape
    adv = _advantages("normalised" if model.bcfg.normalize_advantage else "centred", r, total, keep,
                      float(strategy.cfg.gamma if gamma is None else gamma))
    params = [p for p in strategy.parameters() if p.requires_grad]
    ours = torch.autograd.grad((bo.log_prob * adv * keep).sum(), params, retain_graph=True)
    theirs = torch.autograd.grad(captured["aux"]["loss/policy"], params)
    return float(torch.nn.functional.cosine_similarity(*[torch.cat([x.flatten() for x in xs])
                                                          for xs in (ours, theirs)], dim=0))


def test_the_first_level_is_measured_with_the_estimator_its_training_loss_uses(monkeypatch):
    """With a forced last boundary, whose byte's reward still enters every return (as in training)."""
    model = build_model("learned", policy_window=0, gamma=0.9, force_last=True)
    batch = torch.randint(32, 127, (4, 33), generator=torch.Generator().manual_seed(0))
    batch[:, 0] = BOS
    assert _run_estimator_against_own_loss(model, batch, 1, model.boundary, monkeypatch) < -0.9999


def test_the_second_level_is_measured_with_the_estimator_its_training_loss_uses(monkeypatch):
    """--level 2 on a two-level model: per-token decisions, rewarded with the return its own loss credits them
    (the bytes reading each token back, against the second early exit): on one draw the run's estimator points
    exactly against the gradient of the model's second-level policy loss."""
    model = build_model("learned", None, {"inner_layers": 1, "inner_rate": 0.5}, policy_window=0, gamma=0.9)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(32, 127, (4, 49), generator=g)
    batch[:, 0] = BOS
    rows, info = policy_gradient_variance(model, batch, samples=4, reference_factor=2, level=2)
    assert info["level"] == 2 and [r.name for r in rows] == 2 * variant_names(0.9)
    assert all(r.variance > 0 and r.snr == r.snr for r in rows)  # gradients reached the second level's policy
    params = [p for p in model.inner.parameters() if p.requires_grad]
    assert info["groups"]["policy"] == sum(p.numel() for p in params)

    assert _run_estimator_against_own_loss(model, batch, 2, model.inner, monkeypatch) < -0.9999
    # --inner-gamma: the second level trains with its own discount per token, and is measured with it
    own = build_model("learned", None, {"inner_layers": 1, "inner_rate": 0.5, "inner_gamma": 0.3}, policy_window=0,
                      gamma=0.9)
    assert own.inner.cfg.gamma == 0.3 and own.boundary.cfg.gamma == 0.9
    assert policy_gradient_variance(own, batch, samples=2, reference_factor=1, level=2)[1]["gamma"] == 0.3
    assert _run_estimator_against_own_loss(own, batch, 2, own.inner, monkeypatch) < -0.9999
    assert _run_estimator_against_own_loss(own, batch, 2, own.inner, monkeypatch, gamma=0.9) > -0.999
    with pytest.raises(ValueError, match="boundary level 2: this model has one level"):
        policy_gradient_variance(build_model("learned", policy_window=0), batch, samples=2, level=2)
