"""Configuration: strategy options that belong to their strategy, conversion between strategies, configs of
learntok 0.1 (version 1), and the rules the command line applies."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from learntok.boundaries import boundary_config, config_class
from learntok.boundaries.learned import LearnedConfig
from learntok.boundaries.uniform import UniformConfig
from learntok.cli.train import parse_train_args
from learntok.config import from_dict, to_dict
from learntok.presets import get_preset

V1_TINY = (
    {'model': {'d_model': 128, 'n_heads': 2, 'n_down': 1, 'n_mid': 3, 'n_up': 1, 'byte_window': 8, 'byte_mlp_mult':
    1.0, 'token_mlp_mult': 4.0, 'attn_softcap': 50.0, 'final_softcap': 30.0, 'rope_base': 10000.0, 'init_std': 0.02,
    'attn_backend': 'auto'}, 'boundary': {'boundaries': 'learned', 'target_rate': 0.2, 'policy_window': 0,
    'logit_scale': 2.0, 'logit_softcap': 6.0, 'force_last': False, 'detach_encoder': True, 'gamma': 0.9,
    'normalize_advantage': True, 'value_baseline': False, 'lambda_policy': 0.01, 'lambda_target': 0.01,
    'lambda_early': 0.1, 'code_loss_weights': False, 'pooling': 'mean', 'gumbel_temperature': 1.0, 'prior_weight':
    1.0, 'ratio_loss_weight': 0.03, 'bpe_vocab_size': 0, 'entropy_model': '', 'entropy_threshold': 0.0,
    'eval_boundaries': 'sample'}, 'data_cfg': {'data': 'stdlib', 'val_data': None, 'text_field': 'text', 'seq_len':
    512, 'pack': True, 'val_fraction': 0.05, 'val_bytes': 262144}, 'preset': 'tiny', 'resume': '', 'overwrite':
    False, 'out': 'runs/tiny', 'batch_size': 8, 'micro_batch_size': 0, 'max_steps': 1000, 'max_bytes': 0.0,
    'time_budget': 0.0, 'schedule': 'bytes', 'warmup_bytes': 200000.0, 'lr': 0.003, 'min_lr_ratio': 0.1,
    'weight_decay': 0.1, 'beta1': 0.9, 'beta2': 0.999, 'grad_clip': 1.0, 'seed': 0, 'device': 'auto', 'parallel':
    'ddp', 'compile': False, 'threads': 0, 'log_every': 10, 'eval_every': 250, 'ckpt_every': 250, 'progress': True,
    'tensorboard': False, 'config_version': 1})
"""config.json of learntok 0.1's `tiny` preset (config version 1: one flat boundary config, `data_cfg`, optimizer
fields on TrainConfig), as that version wrote it."""


def test_version_1_configs_are_converted_without_changing_what_the_run_did():
    cfg = from_dict(json.loads(json.dumps(V1_TINY)))
    tiny = get_preset("tiny")
    # a v1 learned run had the policy RMSNorm (the presets dropped it after issue 17): it keeps it
    assert cfg.boundary == replace(tiny.boundary, policy_norm=True)
    assert cfg.model == tiny.model and cfg.optim == tiny.optim
    assert cfg.data == tiny.data and cfg.max_steps == 1000  # v1's length was a step count
    # options of other strategies, which a learned run never read, are dropped; a uniform run keeps its own
    v1 = json.loads(json.dumps(V1_TINY))
    v1["boundary"]["boundaries"] = "uniform"
    uni = from_dict(v1)
    assert uni.boundary == UniformConfig(pooling="mean") and uni.model.lambda_early == 0.1
    v1["boundary"]["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        from_dict(v1)


def test_strategy_options_live_with_their_strategy():
    assert boundary_config("uniform", target_rate=0.25) == UniformConfig(target_rate=0.25)
    with pytest.raises(TypeError, match="gamma"):
        boundary_config("uniform", gamma=0.9)
    with pytest.raises(ValueError, match="not learned"):
        UniformConfig(boundaries="learned")
    with pytest.raises(ValueError, match="target_rate"):
        LearnedConfig(target_rate=1.5)
    assert "gamma" not in {f for f in config_class("whitespace").__dataclass_fields__}


def test_switching_strategy_keeps_the_options_both_have():
    tiny = get_preset("tiny")
    uni = tiny.boundary.converted(UniformConfig)
    assert uni == UniformConfig(pooling="mean", target_rate=tiny.boundary.target_rate)
    dyn = tiny.boundary.converted(config_class("dynamic"))
    assert dyn.detach_encoder and dyn.pooling == "mean"
    assert parse_train_args(["--boundaries", "uniform", "--target-rate", "0.25"]).boundary == \
        UniformConfig(pooling="mean", target_rate=0.25)


def test_round_trip_of_every_preset_and_strategy():
    for name in ["tiny", "small", "paper-147m", "paper-90m-code", "paper-aspect-8"]:
        cfg = get_preset(name)
        assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg
    for strategy in ["uniform", "whitespace", "bpe", "dynamic", "hnet", "entropy"]:
        cfg = replace(get_preset("tiny"), boundary=boundary_config(strategy))
        assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg


def test_a_resumed_run_cannot_switch_strategy(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(get_preset("tiny"))))
    with pytest.raises(ValueError, match="cannot switch to uniform"):
        parse_train_args(["--resume", str(run), "--boundaries", "uniform"])
    assert parse_train_args(["--resume", str(run), "--gamma", "0.5"]).boundary.gamma == 0.5
    (tmp_path / "ws.toml").write_text('boundaries = "whitespace"\n')  # nor through a config file
    with pytest.raises(ValueError, match="cannot switch to whitespace"):
        parse_train_args(["--resume", str(run), "--config", str(tmp_path / "ws.toml")])


def test_a_resumed_run_refuses_settings_it_would_half_apply(tmp_path):
    """--seed (the data order kept the run's), --batch-size / --seq-len (the schedule counts the run's steps),
    --out, --overwrite and --preset with --resume were taken silently, or half."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(replace(get_preset("tiny"), overwrite=True))))
    for flags, named in ((["--seed", "7"], "--seed 7 (the run has 0)"), (["--batch-size", "4"], "--batch-size 4"),
                         (["--seq-len", "256"], "--seq-len 256"), (["--out", "elsewhere"], "--out elsewhere"),
                         (["--overwrite"], "--overwrite"), (["--preset", "small"], "--preset small")):
        with pytest.raises(ValueError, match=re.escape(named)):
            parse_train_args(["--resume", str(run), *flags])
    assert parse_train_args(["--resume", str(run), "--seed", "0"]).out == str(run)  # the run's own values pass


def test_the_policy_norm_is_an_option_and_older_runs_keep_it():
    from learntok.model.lm import ByteLM

    from .conftest import tiny_model

    assert not LearnedConfig().policy_norm and get_preset("paper-147m").boundary.policy_norm is False
    assert get_preset("tiny").boundary.policy_norm is False  # dropped after issue 17's re-screen (a tie)
    with_norm = ByteLM(tiny_model(), LearnedConfig(policy_norm=True)).state_dict()
    assert "boundary.norm.weight" in with_norm
    assert "boundary.norm.weight" not in ByteLM(tiny_model(), LearnedConfig()).state_dict()
    v2 = to_dict(get_preset("paper-147m"))
    del v2["boundary"]["policy_norm"]
    v2["config_version"] = 2  # written before the option existed, when the norm was always there
    assert from_dict(v2).boundary.policy_norm


def test_a_damaged_run_config_is_a_one_line_error_naming_the_file(tmp_path):
    """A run's config.json that is not JSON, not an object, an export's, missing a section or holding a value of
    the wrong type: a ValueError naming the file (TypeError, AttributeError or a silently built default model,
    before)."""
    from learntok.config import load_json

    good = to_dict(get_preset("tiny"))
    path = tmp_path / "config.json"
    cases = [("{", "not valid JSON"), ([], "not a run's config .a JSON list"),
             ({"architectures": ["LearntokForCausalLM"], **good}, "an exported model's config"),
             ({k: v for k, v in good.items() if k != "model"}, "no model section"),
             ({**good, "model": {**good["model"], "d_model": "abc"}}, r"config\.model: a value of the wrong type"),
             ({**good, "model": 5}, "config.model: expected a section"),
             ({**good, "model": {**good["model"], "n_heads": 0}}, "n_heads must be >= 1")]
    for content, message in cases:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(ValueError, match=message) as e:
            load_json(str(path))
        assert str(path) in str(e.value)
    path.write_text(json.dumps(good))
    assert load_json(str(path)) == from_dict(good)


@pytest.mark.parametrize("flags, message", [
    (["--lr", "nan"], "lr must be finite"), (["--lr", "inf"], "lr must be finite"),
    (["--time-budget", "inf"], "must be finite and non-negative"),
    (["--flops-budget", "nan"], "must be finite and non-negative"),
    (["--max-steps", "-5"], "must be non-negative"), (["--n-heads", "0"], "n_heads must be >= 1")])
def test_numbers_out_of_range_are_refused_before_any_work(flags, message):
    """NaN passes every `x <= 0` check, inf made a run of 10^12 steps, and --n-heads 0 a ZeroDivisionError."""
    from learntok.train.schedule import check_config

    with pytest.raises(ValueError, match=message):
        check_config(parse_train_args(["--preset", "tiny", *flags]))


def test_val_data_that_is_the_training_data_is_refused(tmp_path):
    """--val-data naming --data (spelled another way) validated on text that all trains; a prepared corpus given
    as both still means its val split."""
    from learntok.train.schedule import check_config

    (tmp_path / "a.txt").write_text("text")
    with pytest.raises(ValueError, match="is --data: every validation document would be trained on"):
        check_config(parse_train_args(["--preset", "tiny", "--data", str(tmp_path / "a.txt"), "--val-data",
                                       str(tmp_path / "." / "a.txt")]))
    check_config(parse_train_args(["--preset", "tiny", "--data", str(tmp_path / "a.txt")]))
