"""What a run tells people and trackers: a bar on a terminal, plain one-line step logs otherwise (the figures
of metrics.jsonl), and Weights & Biases (config, every metric, a boundary map per evaluation; offline)."""

from __future__ import annotations

import io
import json
import sys
import time
import types
from dataclasses import replace

import pytest

from learntok.train import train
from learntok.train.logs import format_line, resolve_style

from .conftest import tiny_train_config


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_style_follows_the_terminal():
    assert resolve_style("auto", _Tty()) == "bar"
    assert resolve_style("auto", io.StringIO()) == "lines"  # a SLURM / Kubernetes log file
    assert resolve_style("lines", _Tty()) == "lines" and resolve_style("bar", io.StringIO()) == "bar"


def test_plain_lines_carry_the_figures_of_metrics_jsonl(tmp_path, text_corpus, capsys):
    lines: list[str] = []
    cfg = tiny_train_config(tmp_path / "r", text_corpus, max_steps=6, log_every=2, progress=True,
                            progress_style="lines")
    train(cfg, log=lines.append)
    steps = [x for x in lines if x.startswith("step ")]
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss/auto" in r]
    assert steps == [format_line(r, 6) for r in rows]  # one line per logged window, the same numbers
    assert steps[0].startswith("step 2/6 | ") and f"loss {rows[0]['loss/auto']:.4f}" in steps[0]
    assert all("\r" not in x for x in steps) and "\r" not in capsys.readouterr().err  # no bar frames
    # --no-progress: no step lines at all
    quiet: list[str] = []
    train(replace(cfg, out=str(tmp_path / "q"), progress=False), log=quiet.append)
    assert not [x for x in quiet if x.startswith("step ")]


class _FakeRun:
    def __init__(self, **kw):
        self.init, self.logged, self.finished = kw, [], False

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[_FakeRun] = []
    mod = types.SimpleNamespace(init=lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1],
                                Image=lambda img: ("image", img.shape))
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return runs


def test_wandb_dir_is_respected(tmp_path, text_corpus, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=1, wandb=True), log=lambda *_: None)
    assert fake_wandb[0].init["dir"] == str(tmp_path / "wb")  # it used to be RUN_DIR whatever WANDB_DIR said


def test_wandb_gets_the_config_every_metric_and_maps(tmp_path, text_corpus, fake_wandb):
    pytest.importorskip("matplotlib")
    from learntok.config import to_dict
    from learntok.viz.boundary_map import preview_hook

    cfg = tiny_train_config(tmp_path / "r", text_corpus, max_steps=4, eval_every=2, wandb=True, wandb_project="p")
    train(cfg, log=lambda *_: None, on_eval=preview_hook)
    (run,) = fake_wandb
    assert run.init["config"] == to_dict(cfg) and run.init["project"] == "p" and run.finished
    assert run.init["dir"] == str(tmp_path / "r") and run.init["resume"] == "allow"
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    scalars = [(s, v) for s, v in run.logged if "boundaries/map" not in v]
    assert [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in rows] == scalars
    # one map per evaluation, the final one included (it used to be left out)
    assert [(s, v["boundaries/map"][0]) for s, v in run.logged if "boundaries/map" in v] == [(2, "image"), (4, "image")]
    # a resumed run continues the same W&B run
    train(replace(cfg, resume=str(tmp_path / "r"), max_steps=5), log=lambda *_: None)
    assert fake_wandb[1].init["id"] == run.init["id"] and fake_wandb[1].logged[0][0] == 5


def test_wandb_offline_mode_writes_a_local_run(tmp_path, text_corpus, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'learntok[wandb]')")
    pytest.importorskip("matplotlib")
    from learntok.viz.boundary_map import preview_hook

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=4, eval_every=2, wandb=True), log=lambda *_: None,
          on_eval=preview_hook)
    (local,) = (tmp_path / "r" / "wandb").glob("offline-run-*")
    (records,) = local.glob("run-*.wandb")
    deadline = time.monotonic() + 60  # wandb's service process may still be writing on a loaded machine
    while b"val/bpb" not in (data := records.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert b"loss/auto" in data and b"val/bpb" in data and b"policy_window" in data  # metrics and config
    assert list(local.glob("files/media/images/boundaries/map_*.png"))  # the boundary map of step 2
    assert (tmp_path / "r" / "wandb" / "run_id").read_text().strip() in local.name


def test_wandb_without_the_package_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    from learntok.cli import main

    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["train", "--out", str(tmp_path / "x"), "--wandb", "--data", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "--wandb needs the wandb package: pip install 'learntok[wandb]'" in err  # not the data error
