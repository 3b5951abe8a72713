"""Run config files: any preset written with --write-config reads back as the same config (TOML, YAML, JSON);
a file overrides the preset and flags override the file; flat and sectioned keys; bad files are one line."""

from __future__ import annotations

import json

import pytest

from learntok.cli import main
from learntok.cli.train import parse_train_args
from learntok.config import to_dict
from learntok.presets import PRESETS, get_preset


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".json"])
@pytest.mark.parametrize("preset", [*PRESETS, "paper-aspect-8"])
def test_written_config_reads_back_identically(tmp_path, preset, suffix):
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = tmp_path / f"run{suffix}"
    flags = ["--preset", preset, "--lr", "1e-4", "--boundaries", "uniform", "--out", "runs/x y", "--no-pack"]
    assert main(["train", *flags, "--write-config", str(path)]) == 0
    want = parse_train_args(flags)
    got = parse_train_args(["--config", str(path)])
    assert got == want and to_dict(got) == to_dict(want)
    assert got != get_preset(preset)  # negative control: the flags did change something


def test_file_overrides_preset_and_flags_override_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('preset = "small"\nlr = 2e-3\nmax_steps = 7\ndata = "DATA/enwiki"\n\n[model]\nd_model = 64\n')
    cfg = parse_train_args(["--config", str(path), "--d-model", "96"])
    small = get_preset("small")
    assert cfg.optim.lr == 2e-3 and cfg.max_steps == 7 and cfg.data.source == "DATA/enwiki"
    assert cfg.model.d_model == 96 and cfg.model.n_mid == small.model.n_mid and cfg.preset == "small"
    assert cfg.data.seq_len == small.data.seq_len
    # --preset on the command line wins over the file's preset
    path.write_text('preset = "small"\nlr = 2e-3\n')
    assert parse_train_args(["--config", str(path), "--preset", "paper-147m"]).model.n_mid == 12


def test_yaml_numbers_and_strategy_switch(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-3\nmax_bytes: 2e6\nboundaries: uniform\ntarget_rate: 0.25\n")  # YAML reads 1e-3 as text
    cfg = parse_train_args(["--config", str(path)])
    assert cfg.optim.lr == 1e-3 and cfg.max_bytes == 2e6 and cfg.boundary.boundaries == "uniform"
    assert cfg.boundary.target_rate == 0.25
    # a strategy option that the file's strategy does not have
    path.write_text("boundaries: uniform\ngamma: 0.9\n")
    with pytest.raises(ValueError, match="run.yaml: gamma: unknown setting"):
        parse_train_args(["--config", str(path)])


def test_a_config_file_of_an_older_version_is_upgraded(tmp_path):
    d = to_dict(get_preset("tiny"))
    d["config_version"] = 2
    d["boundary"].pop("policy_norm")
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert parse_train_args(["--config", str(tmp_path / "old.json")]).boundary.policy_norm is True


@pytest.mark.parametrize(("name", "text", "message"), [
    ("a.toml", "lrr = 1\n", "a.toml: lrr: unknown setting"),
    ("b.toml", "[optim]\nlr = 'fast'\n", "b.toml: optim.lr: expected a number, got 'fast'"),
    ("c.toml", "max_steps = 2.5\n", "c.toml: max_steps: expected a whole number"),
    ("d.toml", "progress = 1\n", "d.toml: progress: expected true or false"),
    ("e.toml", "progress_style = 'fancy'\n", "e.toml: progress_style: 'fancy' is not one of"),
    ("f.toml", "lr = \n", "f.toml: not valid TOML"),
    ("g.ini", "lr = 1\n", "unknown config file type '.ini'"),
    ("h.toml", "lr = -1.0\n", "lr must be finite and > 0"),
    ("i.json", "[1, 2]", "expected a mapping of settings"),
    ("j.toml", "ngram_sizes = 3\n", "j.toml: model.ngram_sizes: expected a list, got 3"),
    ("k.toml", "rate_range = [0.1]\n", "k.toml: boundary.rate_range: expected a list of 2"),
    ("l.json", '{"model": {"d_model": "wide"}}', "l.json: model.d_model: expected a number"),
])
def test_bad_config_files_are_one_line(tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    assert main(["train", "--config", str(tmp_path / name), "--data", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err  # before the data is read


def test_missing_config_file_and_flag_without_value(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["train", "--config"]) == 2
    assert "--config needs a file name" in capsys.readouterr().err
    assert main(["train", "--write-config", str(tmp_path / "x.cfg")]) == 2
    assert "unknown config file type" in capsys.readouterr().err


def test_a_run_config_as_a_config_file_starts_a_new_run(tmp_path):
    """`--config RUN/config.json` copies a run's settings: its resume and overwrite keys (how that command
    started) are not taken, which used to continue or wipe the run the file came from."""
    d = {**to_dict(get_preset("tiny")), "resume": str(tmp_path / "old"), "overwrite": True}
    (tmp_path / "run.json").write_text(json.dumps(d))
    cfg = parse_train_args(["--config", str(tmp_path / "run.json"), "--out", str(tmp_path / "new")])
    assert cfg.resume in ("", None) and cfg.overwrite is False and cfg.out == str(tmp_path / "new")


def test_yaml_keys_that_are_not_names_are_one_line(tmp_path, capsys):
    pytest.importorskip("yaml", reason="reading YAML needs PyYAML (pip install 'learntok[yaml]')")
    (tmp_path / "n.yaml").write_text("1: 2\n")
    assert main(["train", "--config", str(tmp_path / "n.yaml")]) == 2
    assert "n.yaml: 1: a setting's name must be a string" in capsys.readouterr().err
