"""Training end to end: resume is bit-exact, runs are deterministic, real text is learned, bad input is
reported in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from learntok.cli import main
from learntok.config import from_dict, load_json, to_dict
from learntok.presets import PRESETS, get_preset
from learntok.train import train

from .conftest import tiny_train_config


def _losses(run: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss/auto"], r.get("loss/policy")) for r in rows if "loss/auto" in r]


def test_resume_reproduces_uninterrupted_run_bitwise(tmp_path, text_corpus):
    full = tiny_train_config(tmp_path / "full", text_corpus, max_steps=6)
    train(full, log=lambda *_: None)
    part = tiny_train_config(tmp_path / "part", text_corpus, max_steps=6)
    import learntok.train.loop as tr

    calls = {"n": 0}
    real_next = tr.BatchIterator.next_with_flags

    def interrupt_after_three(self):  # Ctrl-C during step 4: the run saves a checkpoint at step 3
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real_next(self)

    tr.BatchIterator.next_with_flags = interrupt_after_three
    try:
        with pytest.raises(KeyboardInterrupt):
            train(part, log=lambda *_: None)
    finally:
        tr.BatchIterator.next_with_flags = real_next
    train(replace(part, resume=str(tmp_path / "part")), log=lambda *_: None)
    a = _losses(tmp_path / "full")
    b = [r for r in _losses(tmp_path / "part") if r[0] > 3]
    assert [r[0] for r in b] == [4, 5, 6]
    assert b == a[3:]  # bitwise equal losses after the resume point


def test_two_seeded_runs_are_identical(tmp_path, text_corpus):
    r1 = train(tiny_train_config(tmp_path / "a", text_corpus, max_steps=3), log=lambda *_: None)
    r2 = train(tiny_train_config(tmp_path / "b", text_corpus, max_steps=3), log=lambda *_: None)
    assert r1.val_bpb == r2.val_bpb
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")


def test_metrics_and_config_are_written(tmp_path, text_corpus):
    from learntok.viz.boundary_map import preview_hook

    res = train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=4, eval_every=2), log=lambda *_: None,
                on_eval=preview_hook)
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss/auto" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    assert all(r["bytes"] == r["step"] * 4 * 64 for r in train_rows)
    flops = [r["flops"] for r in train_rows]
    assert all(b > a > 0 for a, b in zip(flops, flops[1:]))
    for key in ("loss/policy", "loss/target", "loss/early", "boundary/p_mean", "boundary/neg_log_pi",
                "reinforce/adv_std", "boundary/rate", "train/bytes_per_s", "train/lr", "train/grad_norm"):
        assert key in train_rows[0]
    assert any("val/bpb" in r for r in rows)
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["run_info"]["torch"] == torch.__version__
    assert "git_sha" in cfg["run_info"]
    assert 0 < res.val_rate < 1 and res.sample


def test_training_on_builtin_data_lowers_validation_bpb(tmp_path):
    """A short real run on this Python's standard library sources."""
    cfg = tiny_train_config(tmp_path / "std", "stdlib", max_steps=40, batch_size=8, lr=5e-3)
    cfg = replace(cfg, data=replace(cfg.data, seq_len=128, val_bytes=128 * 16))
    before = train(replace(cfg, out=str(tmp_path / "zero"), max_steps=1, optim=replace(cfg.optim, lr=1e-9)),
                   log=lambda *_: None).val_bpb
    after = train(cfg, log=lambda *_: None).val_bpb
    assert after < before - 1.0, (before, after)


def test_config_round_trip_and_strictness():
    for name in [*PRESETS, "paper-aspect-8"]:
        cfg = get_preset(name)
        assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg
    assert get_preset("paper-aspect-8").boundary.target_rate == pytest.approx(1 / 8)
    bad = to_dict(get_preset("tiny"))
    bad["model"]["d_modle"] = 3
    with pytest.raises(ValueError, match="d_modle"):
        from_dict(bad)
    old = to_dict(get_preset("tiny"))
    old["config_version"] = 0
    with pytest.raises(ValueError, match="version"):
        from_dict(old)


def _cli_error(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def test_bad_input_gives_one_line_errors(tmp_path, capsys):
    base = ["train", "--out", str(tmp_path / "x"), "--no-progress", "--max-steps", "1"]
    err = _cli_error(capsys, [*base, "--data", str(tmp_path / "missing.txt")])
    assert "missing.txt" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "empty" in _cli_error(capsys, [*base, "--data", str(empty)])
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    assert "blob.txt" in _cli_error(capsys, [*base, "--data", str(binary)])
    assert "seq_len" in _cli_error(capsys, [*base, "--seq-len", "16", "--byte-window", "64"])
    assert "boundary strategy" in _cli_error(capsys, [*base, "--boundaries", "nope"])
    assert "no config.json" in _cli_error(capsys, ["train", "--resume", str(tmp_path / "nothing")])
    run = tmp_path / "run"
    run.mkdir()
    cfg = to_dict(get_preset("tiny"))
    cfg["bogus_key"] = 1
    (run / "config.json").write_text(json.dumps(cfg))
    assert "bogus_key" in _cli_error(capsys, ["train", "--resume", str(run)])


def test_resume_on_other_data_is_recorded_and_said(tmp_path, text_corpus):
    """`--resume RUN --data OTHER` used to rewrite config.json's data source silently, so the run's provenance named
    only the new data. Every start of training is now a session in run_info (step, data, git SHA), and a change of
    data on resume is a warning."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(text_corpus, other)
    cfg = tiny_train_config(tmp_path / "r", text_corpus, max_steps=2, ckpt_every=2)
    train(cfg, log=lambda *_: None)
    logged: list[str] = []
    train(replace(cfg, resume=str(tmp_path / "r"), max_steps=3, data=replace(cfg.data, source=str(other))),
          log=logged.append)
    sessions = json.loads((tmp_path / "r" / "config.json").read_text())["run_info"]["sessions"]
    assert [(x["step"], x["data"]) for x in sessions] == [(0, str(text_corpus)), (2, str(other))]
    assert all(len(x["git_sha"]) == 40 for x in sessions)
    assert any("warning" in m and str(other) in m and "until step 2" in m for m in logged)


def test_resume_with_a_flag_that_changes_the_weights_is_one_line(tmp_path, capsys):
    """`--resume RUN --d-model 256` used to end in a 77-line size-mismatch traceback at the checkpoint; now it is
    refused before anything loads, naming the flag. Flags that keep the shapes (--lr, --max-steps) still resume."""
    run = tmp_path / "run"
    (run).mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(get_preset("tiny"))))
    err = _cli_error(capsys, ["train", "--resume", str(run), "--d-model", "256"])
    assert "--d-model 256 (the run has 128)" in err and "start a new run" in err
    assert "--policy-window 2" in _cli_error(capsys, ["train", "--resume", str(run), "--policy-window", "2"])
    from learntok.cli.train import parse_train_args

    assert parse_train_args(["--resume", str(run), "--lr", "1e-3", "--max-steps", "9"]).max_steps == 9


def test_on_log_sees_every_metrics_line_and_can_stop_the_run(tmp_path, text_corpus):
    """The Python API's step / evaluation hook: every line metrics.jsonl gets, as a dict; True stops the run after
    that step with a checkpoint (early stopping), and the run resumes from it."""
    seen: list[dict] = []

    def early_stop(rec: dict) -> bool:
        seen.append(rec)
        return "val/bpb" in rec and rec["step"] >= 2

    cfg = tiny_train_config(tmp_path / "r", text_corpus, max_steps=6, eval_every=2)
    res = train(cfg, log=lambda *_: None, on_log=early_stop)
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert seen == lines and [r["step"] for r in seen if "val/bpb" in r] == [2]
    assert res.stopped == "on_log" and res.steps == 2 and (tmp_path / "r" / "step_000002").is_dir()
    assert train(replace(cfg, resume=str(tmp_path / "r")), log=lambda *_: None).steps == 6


def test_a_busy_machine_gets_a_note_about_threads(tmp_path, text_corpus, monkeypatch):
    """On a busy 2-core machine PyTorch's default threads made training 2-35x slower than --threads 1; a run that
    starts with fewer idle cores than threads says so (once), an idle machine or --threads says nothing."""
    import learntok.train.schedule as schedule

    monkeypatch.setattr(schedule.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # --threads 1 must not leak into other tests
    for load, threads, expect in ((3.0, 0, True), (1.1, 0, True), (0.2, 0, False), (3.0, 1, False)):
        monkeypatch.setattr(schedule.os, "getloadavg", lambda load=load: (load, load, load))
        logged: list[str] = []
        train(tiny_train_config(tmp_path / f"r{load}{threads}", text_corpus, max_steps=1, threads=threads),
              log=logged.append)
        notes = [m for m in logged if "machine is busy" in m]
        assert len(notes) == expect and (not notes or "--threads 1" in notes[0])


def test_version(capsys):
    from learntok import __version__

    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"learntok {__version__}"


def test_unknown_flag_is_rejected(capsys):
    err = _cli_error(capsys, ["train", "--no-such-flag", "3"])
    assert "--no-such-flag" in err and len(err.strip().splitlines()) == 1
    err = _cli_error(capsys, ["train", "--max-steps", "three"])
    assert "--max-steps" in err and len(err.strip().splitlines()) == 1


def test_cli_trains_and_prints_summary(tmp_path, text_corpus, capsys):
    code = main(["train", "--preset", "tiny", "--out", str(tmp_path / "cli"), "--data", str(text_corpus),
                 "--max-steps", "2", "--seq-len", "64", "--batch-size", "2", "--d-model", "32", "--no-progress",
                 "--val-bytes", "256", "--boundaries", "uniform"])
    out = capsys.readouterr().out
    assert code == 0
    assert "validation bits per byte" in out and "boundary rate" in out and "held-out sample" in out
    cfg = load_json_without_info(tmp_path / "cli" / "config.json")
    assert cfg.boundary.boundaries == "uniform" and cfg.model.d_model == 32 and cfg.preset == "tiny"
    # resume extends the run
    assert main(["train", "--resume", str(tmp_path / "cli"), "--max-steps", "3", "--no-progress"]) == 0
    assert _losses(tmp_path / "cli")[-1][0] == 3


def load_json_without_info(path: Path):
    d = json.loads(path.read_text())
    d.pop("run_info")
    return from_dict(d)


assert load_json  # public helper exists


def test_load_run_restores_the_trained_model(tmp_path, text_corpus):
    from learntok.checkpoint import load_run

    train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=2), log=lambda *_: None)
    cfg, model = load_run(tmp_path / "r")
    assert cfg.max_steps == 2 and not model.training
    with pytest.raises(FileNotFoundError, match="not a learntok run"):
        load_run(tmp_path)


def test_existing_run_is_never_silently_overwritten(tmp_path, text_corpus, capsys):
    cfg = tiny_train_config(tmp_path / "r", text_corpus, max_steps=1)
    train(cfg, log=lambda *_: None)
    with pytest.raises(ValueError, match="already holds a run") as e:
        train(cfg, log=lambda *_: None)
    assert "resume=" in str(e.value) and "overwrite=True" in str(e.value)  # the Python settings, for a Python user
    train(replace(cfg, overwrite=True), log=lambda *_: None)
    assert len(_losses(tmp_path / "r")) == 1
    # the command line picks a fresh directory instead
    args = ["train", "--out", str(tmp_path / "r"), "--data", str(text_corpus), "--max-steps", "1", "--seq-len", "64",
            "--batch-size", "2", "--d-model", "32", "--no-progress", "--val-bytes", "128"]
    assert main(args) == 0
    assert "writing to" in capsys.readouterr().err
    assert (tmp_path / "r-2" / "metrics.jsonl").exists()


def test_a_length_in_bytes_replaces_the_presets_length():
    from learntok.cli.train import parse_train_args
    from learntok.presets import tiny
    from learntok.train import total_steps

    cfg = parse_train_args(["--preset", "tiny", "--max-bytes", "2e6"])
    assert cfg.max_steps == 0 and total_steps(cfg) == 489  # ceil(2e6 / (8 * 512))
    assert total_steps(parse_train_args(["--max-bytes", "2e6", "--max-steps", "7"])) == 7
    # the same rule in Python: presets set lengths in bytes, a step count wins when given
    assert total_steps(tiny()) == 1000
    assert total_steps(replace(tiny(), max_bytes=2e6)) == 489
    assert total_steps(replace(tiny(), max_steps=200)) == 200
