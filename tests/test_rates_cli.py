"""One model for any rate, end to end: `learntok calibrate`, `eval --rate / --rate-sweep`, `--rate` on generate,
segment and show, `plot --rate-sweep`, export keeping the calibration, training removing a stale one, and the
one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from learntok.boundaries import boundary_config
from learntok.cli import main
from learntok.train import train

from .conftest import tiny_train_config
from .test_eval_cli import corpus  # noqa: F401  (the module fixture: train/valid/test text files)


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    out = {}
    bcfgs = {"variable": boundary_config("learned", policy_window=1, value_baseline=True, rate_range=(0.1, 0.4)),
             "uniform": boundary_config("uniform")}
    for name, bcfg in bcfgs.items():
        cfg = tiny_train_config(tmp_path_factory.mktemp("rate-runs") / name, corpus, max_steps=3, boundary=bcfg)
        train(cfg, log=lambda s: None)
        out[name] = Path(cfg.out)
    return out


@pytest.fixture
def variable(runs, tmp_path) -> Path:
    """A fresh copy of the variable-rate run (tests write calibration tables into it)."""
    return Path(shutil.copytree(runs["variable"], tmp_path / "variable"))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_then_ask_any_rate_in_eval(variable, capsys):
    code, out, err = _run(capsys, "calibrate", str(variable), "--rates", "0.1", "0.2", "0.35", "--max-bytes", "8192")
    assert code == 0, err
    table = json.loads((variable / "rate_calibration.json").read_text())
    assert table["rates"] == [0.1, 0.2, 0.35] and len(table["offsets"]) == 3
    assert all(abs(r - g) < 0.005 for r, g in zip(table["rates"], table["realised"]))
    assert "asked 0.1000" in err and "largest |realised - asked|" in out
    code, _, err = _run(capsys, "eval", str(variable), "--rate", "0.1", "--tasks", "none", "--no-progress",
                        "--max-bytes", "8192")
    assert code == 0, err
    rep = json.loads((variable / "eval-rate0.1.json").read_text())
    assert rep["asked_rate"] == 0.1 and rep["calibrated"] is True
    assert abs(rep["boundary_stats"]["rate"] - 0.1) < 0.01  # the same text it was fitted on
    assert not (variable / "eval.json").exists()


def test_rate_sweep_reports_asked_and_realised_rates_and_plots(variable, capsys, tmp_path):
    assert _run(capsys, "calibrate", str(variable), "--max-bytes", "8192")[0] == 0
    code, out, err = _run(capsys, "eval", str(variable), "--rate-sweep", "--sweep-rates", "0.12", "0.3",
                          "--sweep-bytes", "8192", "--tasks", "none", "--no-heldout", "--no-progress")
    assert code == 0, err
    sweep = json.loads((variable / "eval.json").read_text())["rate_sweep"]
    assert [p["asked"] for p in sweep["points"]] == [0.12, 0.3] and sweep["calibrated"]
    assert all(abs(p["realised"] - p["asked"]) < 0.01 for p in sweep["points"])
    assert "| 0.1200 |" in out and "rate sweep" in out
    code, out, _ = _run(capsys, "plot", "--rate-sweep", str(variable), "--out", str(tmp_path / "figs"))
    assert code == 0 and (tmp_path / "figs" / "rate_sweep.png").stat().st_size > 1000


def test_rate_on_segment_show_and_generate(variable, capsys):
    text = "def main(argv):\n    return parse(argv) if argv else None\n" * 3
    counts = []
    for rate in ("0.1", "0.4"):
        code, out, err = _run(capsys, "segment", str(variable), "--text", text, "--rate", rate, "--format", "jsonl")
        assert code == 0, err
        counts.append(len(out.splitlines()))
    assert counts[0] < counts[1]
    code, out, err = _run(capsys, "show", str(variable), "--text", "hello world", "--rate", "0.3", "--color", "never")
    assert code == 0 and "rate" in out, err
    code, out, err = _run(capsys, "generate", str(variable), "--prompt", "def ", "--rate", "0.15",
                          "--max-new-bytes", "8")
    assert code == 0 and out.startswith("def "), err


def test_export_carries_the_calibration_and_training_removes_a_stale_one(variable, capsys, tmp_path):
    from learntok.pretrained import from_pretrained

    assert _run(capsys, "calibrate", str(variable), "--rates", "0.15", "0.3", "--max-bytes", "4096")[0] == 0
    assert _run(capsys, "export", str(variable), str(tmp_path / "model"))[0] == 0
    model = from_pretrained(tmp_path / "model")
    assert model.boundary.calibration.rates == (0.15, 0.3)
    card = (tmp_path / "model" / "README.md").read_text()
    assert "trained for any rate in | 0.1 to 0.4" in card and "rate calibration | 2 asked rates" in card
    code, _, err = _run(capsys, "train", "--resume", str(variable), "--max-steps", "4", "--no-progress")
    assert code == 0, err
    assert not (variable / "rate_calibration.json").exists()
    assert from_pretrained(variable).boundary.calibration is None


def test_rate_errors_are_one_line(runs, capsys):
    uniform = str(runs["uniform"])
    for argv in (["eval", uniform, "--rate", "0.3", "--tasks", "none"], ["calibrate", uniform],
                 ["segment", uniform, "--text", "abc", "--rate", "0.3"],
                 ["eval", str(runs["variable"]), "--rate", "1.5", "--tasks", "none"],
                 ["calibrate", str(runs["variable"]), "--rates", "0"]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and err.startswith("learntok: error:") and len(err.strip().splitlines()) == 1, (argv, err)
        assert "rate" in err


def test_a_bundled_model_gets_a_calibrated_copy(tmp_path, capsys, corpus):  # noqa: F811
    """The bundled model's directory is part of the installation: calibrate needs --out, and writes the model with
    its table there, which --rate then uses."""
    code, _, err = _run(capsys, "calibrate", "enwiki-small", "--data", str(corpus / "valid"))
    assert code == 2 and "--out" in err
    out = tmp_path / "mine"
    code, _, err = _run(capsys, "calibrate", "enwiki-small", "--data", str(corpus / "valid"), "--rates", "0.1", "0.3",
                        "--max-bytes", "4096", "--out", str(out))
    assert code == 0, err
    from learntok.pretrained import from_pretrained

    assert from_pretrained(out).boundary.calibration.rates == (0.1, 0.3)
    assert _run(capsys, "segment", str(out), "--rate", "0.1", "--text", "a calibrated copy")[0] == 0


def test_a_calibrated_tokenizer_saves_its_table_and_mismatches_are_said(variable, capsys, tmp_path):
    import warnings

    from learntok.errors import LearntokWarning
    from learntok.tokenizer import LearnedTokenizer

    assert _run(capsys, "calibrate", str(variable), "--rates", "0.15", "0.3", "--max-bytes", "4096")[0] == 0
    table = json.loads((variable / "rate_calibration.json").read_text())
    assert table["mode"] == "sample" and table["checkpoint"].startswith("step_")
    tok = LearnedTokenizer.from_pretrained(variable, rate=0.15)
    out = tok.save_pretrained(tmp_path / "tok")
    again = LearnedTokenizer.from_pretrained(out)
    assert again.rate == 0.15 and again.model.boundary.calibration.rates == (0.15, 0.3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        LearnedTokenizer.from_pretrained(variable, greedy=True)  # fitted for sampled boundaries
    assert any(issubclass(w.category, LearntokWarning) and "fitted for sample" in str(w.message) for w in seen)
    (variable / "rate_calibration.json").write_text("{}")
    code, _, err = _run(capsys, "segment", str(variable), "--text", "x")
    assert code == 2 and "not a calibration table" in err and len(err.strip().splitlines()) == 1


def test_a_sparse_optimizer_state_is_not_resumed_densely():
    import torch

    from learntok.train.parallel import load_optimizer_state

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="sparse gradients"):
        load_optimizer_state(torch.nn.Linear(1, 1), opt, {"joint": [{}, {}]}, sharded=False)
