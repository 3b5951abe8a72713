"""Training on a cluster: preemption by a real signal, metrics after a resume, non-finite steps, damaged and
missing checkpoints, and a checkpoint write that fails for want of space."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import learntok.train.loop as loop
from learntok.checkpoint import checkpoint_problem
from learntok.cli import main
from learntok.config_file import config_text
from learntok.errors import CheckpointError, TrainingError
from learntok.model.lm import ByteLM
from learntok.train import train

from .conftest import tiny_train_config

TIMING = ("time", "train/bytes_per_s")
"""Figures that depend on the clock, not on the computation."""


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _constant_lr(cfg):
    """LR independent of the run's length (so a longer run repeats a shorter one's first steps exactly)."""
    return replace(cfg, optim=replace(cfg.optim, min_lr_ratio=1.0), threads=1)


def _weights(run: Path, step: int | None = None) -> dict[str, torch.Tensor]:
    name = f"step_{step:06d}" if step is not None else (run / "latest").read_text().strip()
    return load_file(str(run / name / "model.safetensors"))


def _interrupt_after(monkeypatch, n: int, exc=KeyboardInterrupt) -> None:
    """Raise `exc` (or send signal `exc`) when batch n + 1 is drawn."""
    real = loop.BatchIterator.next_with_flags
    calls = {"n": 0}

    def next_with_flags(self):
        calls["n"] += 1
        if calls["n"] == n + 1:
            if isinstance(exc, int):
                os.kill(os.getpid(), exc)
            else:
                raise exc
        return real(self)

    monkeypatch.setattr(loop.BatchIterator, "next_with_flags", next_with_flags)


# -- preemption ----------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_sigterm_to_a_training_process_checkpoints_and_resumes_bit_exactly(tmp_path, text_corpus):
    cfg = _constant_lr(tiny_train_config(tmp_path / "run", text_corpus, max_steps=100_000, log_every=3))
    (tmp_path / "run.toml").write_text(config_text(cfg, "toml"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "learntok", "train", "--config", str(tmp_path / "run.toml")],
                                stdout=out, stderr=err, env=env)
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    stdout = (tmp_path / "out.txt").read_text()
    assert rc == 0, (tmp_path / "err.txt").read_text()
    assert "stopped by SIGTERM" in stdout and "--resume" in stdout
    assert "Traceback" not in (tmp_path / "err.txt").read_text()
    k = int((tmp_path / "run" / "latest").read_text().strip().split("_")[1])
    assert k >= 6
    # Resume to k + 4 and compare with an uninterrupted run of k + 4 steps: every metric line and the weights.
    assert main(["train", "--resume", str(tmp_path / "run"), "--max-steps", str(k + 4), "--no-progress"]) == 0
    train(replace(cfg, out=str(tmp_path / "ref"), max_steps=k + 4), log=lambda *_: None)
    assert _rows(tmp_path / "run") == _rows(tmp_path / "ref")
    a, b = _weights(tmp_path / "run"), _weights(tmp_path / "ref")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_sigusr1_stops_after_the_current_step(tmp_path, text_corpus, monkeypatch):
    _interrupt_after(monkeypatch, 3, signal.SIGUSR1)  # the signal arrives while step 4 is being drawn
    res = train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=10), log=lambda *_: None)
    assert res.stopped == "SIGUSR1" and res.steps == 4
    assert (tmp_path / "r" / "latest").read_text().strip() == "step_000004"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is removed afterwards


def test_sigterm_during_the_final_evaluation_lets_it_finish(tmp_path, text_corpus, monkeypatch):
    class Killed(Exception):
        pass

    def outside(*_):  # the handler in force whenever the run's own is not: the signal would have killed it
        raise Killed

    real, calls = loop.validate, []

    def validate(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # the final evaluation (the first is periodic, at step 2)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(loop, "validate", validate)
    previous = signal.signal(signal.SIGTERM, outside)
    try:
        notes = []
        res = train(tiny_train_config(tmp_path / "r", text_corpus, max_steps=4, eval_every=2),
                    log=notes.append)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(calls) == 2 and res.stopped == "" and res.steps == 4
    assert res.val_bpb == res.val_bpb  # finite: the evaluation finished
    assert any("SIGTERM arrived during the final" in n for n in notes)
    assert _rows(tmp_path / "r")[-1]["step"] == 4 and "val/bpb" in _rows(tmp_path / "r")[-1]
    assert (tmp_path / "r" / "latest").read_text().strip() == "step_000004"


# -- metrics after a resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize("restore_window", [True, False])
def test_first_metrics_line_after_a_resume_matches_the_uninterrupted_run(tmp_path, text_corpus, monkeypatch,
                                                                         restore_window):
    cfg = tiny_train_config(tmp_path / "part", text_corpus, max_steps=12, log_every=4)
    train(replace(cfg, out=str(tmp_path / "full")), log=lambda *_: None)
    _interrupt_after(monkeypatch, 6)  # Ctrl-C in step 7: a checkpoint at step 6, inside the window 5..8
    with pytest.raises(KeyboardInterrupt):
        train(cfg, log=lambda *_: None)
    monkeypatch.undo()
    if not restore_window:  # negative control: a fresh window at the resume
        monkeypatch.setattr(loop.StepMetrics, "load_state_dict", lambda self, sd: None)
    train(replace(cfg, resume=str(tmp_path / "part")), log=lambda *_: None)
    full, part = _rows(tmp_path / "full"), _rows(tmp_path / "part")
    assert [r["step"] for r in part] == [r["step"] for r in full] == [4, 8, 12, 12]
    assert (part == full) is restore_window


# -- non-finite steps ------------------------------------------------------------------------------------------


def _poison(monkeypatch, bad_calls: set[int]) -> None:
    """Make the training loss NaN on the given forward calls (1-based)."""
    real = ByteLM.forward
    calls = {"n": 0}

    def forward(self, *a, **kw):
        out = real(self, *a, **kw)
        if self.training and out.loss is not None and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] in bad_calls:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(ByteLM, "forward", forward)


def test_a_non_finite_step_is_skipped_and_changes_nothing(tmp_path, text_corpus, monkeypatch):
    base = _constant_lr(tiny_train_config(tmp_path / "x", text_corpus, max_steps=2))
    train(replace(base, out=str(tmp_path / "two")), log=lambda *_: None)
    lines = []
    _poison(monkeypatch, {3, 4})
    res = train(replace(base, out=str(tmp_path / "poisoned"), max_steps=4), log=lines.append)
    assert res.steps == 4
    a, b = _weights(tmp_path / "two"), _weights(tmp_path / "poisoned")
    assert all(torch.equal(a[n], b[n]) for n in a)  # two skipped updates: the weights of step 2
    rows = _rows(tmp_path / "poisoned")
    assert [r.get("train/skipped_steps") for r in rows if "train/lr" in r] == [None, None, 1, 1]
    assert sum("update skipped" in line for line in lines) == 2
    # negative control: a run that applies its steps 3 and 4 ends elsewhere
    train(replace(base, out=str(tmp_path / "four"), max_steps=4), log=lambda *_: None)
    c = _weights(tmp_path / "four")
    assert not all(torch.equal(a[n], c[n]) for n in a)


def test_a_skipped_step_does_not_become_the_lagged_baseline(tmp_path, text_corpus, monkeypatch):
    """--batch-stats lagged: a step skipped for a non-finite loss (its statistics NaN too) must not hand them to
    the next step, or every isolated bad step would poison the next one as well."""
    import dataclasses

    real = ByteLM.forward
    calls = {"n": 0}

    def forward(self, *a, **kw):
        out = real(self, *a, **kw)
        if self.training and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 3:  # step 2's first micro-batch
                out.loss = out.loss * float("nan")
                out.batch_stats = dataclasses.replace(out.batch_stats, g_sum=out.batch_stats.g_sum * float("nan"))
        return out

    monkeypatch.setattr(ByteLM, "forward", forward)
    cfg = tiny_train_config(tmp_path / "run", text_corpus, max_steps=4, micro_batch_size=2, batch_stats="lagged")
    lines = []
    assert train(cfg, log=lines.append).steps == 4
    assert sum("update skipped" in line for line in lines) == 1
    assert [r.get("train/skipped_steps") for r in _rows(tmp_path / "run") if "train/lr" in r] == [None, 1, None, None]


def test_consecutive_non_finite_steps_stop_the_run_with_one_line(tmp_path, text_corpus, monkeypatch, capsys):
    _poison(monkeypatch, set(range(3, 100)))
    cfg = tiny_train_config(tmp_path / "r", text_corpus, max_steps=20, max_bad_steps=3)
    with pytest.raises(TrainingError, match="3 steps in a row"):
        train(cfg, log=lambda *_: None)
    assert (tmp_path / "r" / "latest").read_text().strip() == "step_000005"  # saved: nothing is lost
    args = ["train", "--out", str(tmp_path / "cli"), "--data", str(cfg.data.source), "--seq-len", "64",
            "--d-model", "32", "--batch-size", "4", "--max-steps", "20", "--max-bad-steps", "2", "--no-progress",
            "--val-bytes", "256"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "learntok: error: 2 steps in a row had a non-finite loss" in err and "Traceback" not in err


# -- damaged and missing checkpoints ---------------------------------------------------------------------------


@pytest.fixture
def two_ckpts(tmp_path, text_corpus):
    """A 4-step run with checkpoints at steps 2 and 4."""
    cfg = _constant_lr(tiny_train_config(tmp_path / "run", text_corpus, max_steps=4, ckpt_every=2))
    train(cfg, log=lambda *_: None)
    return cfg, tmp_path / "run"


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_weights_fall_back_to_the_intact_checkpoint(tmp_path, two_ckpts, capsys):
    cfg, run = two_ckpts
    _truncate(run / "step_000004" / "model.safetensors")
    for argv in (["show", str(run), "--text", "abc def"], ["generate", str(run), "--prompt", "a", "--max-new-bytes",
                                                                                   "3"]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "learntok: warning: checkpoint" in err and "using step_000002" in err and "Traceback" not in err
    assert main(["show", str(run / "step_000004")]) == 2  # asked for by name: an error, not a silent swap
    err = capsys.readouterr().err
    assert err.startswith("learntok: error:") and "truncated" in err and len(err.strip().splitlines()) == 1
    # --resume continues from step 2 with a warning and ends where the uninterrupted run ended
    lines = []
    train(replace(cfg, resume=str(run), max_steps=4), log=lines.append)
    assert any("damaged" in x and "using step_000002" in x for x in lines)
    train(replace(cfg, out=str(tmp_path / "ref")), log=lambda *_: None)
    a, b = _weights(run), _weights(tmp_path / "ref")
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert _rows(run) == _rows(tmp_path / "ref")


def test_every_checkpoint_damaged_or_another_shape_is_one_error_line(tmp_path, two_ckpts, capsys):
    """Every checkpoint truncated: one error line (it was said twice, as a warning and as the error). A config
    whose model has another shape than the weights: a one-line error, not torch's size-mismatch traceback."""
    _, run = two_ckpts
    cfg = json.loads((run / "config.json").read_text())
    wider = {**cfg["model"], "d_model": 2 * cfg["model"]["d_model"]}
    (run / "config.json").write_text(json.dumps({**cfg, "model": wider}))
    assert main(["show", str(run), "--text", "abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("learntok: error: checkpoint") and "does not match its config's model" in err
    assert len(err.strip().splitlines()) == 1
    (run / "config.json").write_text(json.dumps(cfg))
    for step in (2, 4):
        _truncate(run / f"step_{step:06d}" / "model.safetensors")
    assert main(["show", str(run), "--text", "abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("learntok: error:") and len(err.strip().splitlines()) == 1, err


def test_damaged_train_state_does_not_stop_inference_but_is_not_resumed(tmp_path, two_ckpts, capsys):
    _, run = two_ckpts
    _truncate(run / "step_000004" / "train_state.pt")
    assert main(["export", str(run), str(tmp_path / "export")]) == 0  # inference reads the weights only
    assert "Traceback" not in capsys.readouterr().err
    assert checkpoint_problem(run / "step_000004", weights_only=True) is None
    assert "train_state.pt has" in checkpoint_problem(run / "step_000004")
    # same size, one byte changed: only the checksum sees it
    data = bytearray((run / "step_000002" / "train_state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (run / "step_000002" / "train_state.pt").write_bytes(bytes(data))
    assert "checksum" in checkpoint_problem(run / "step_000002")
    assert checkpoint_problem(run / "step_000002", checksums=False) is None


def test_metric_lines_that_are_not_objects_are_dropped_at_a_resume(tmp_path):
    """A hand-edited or damaged metrics.jsonl line that is JSON but not an object: dropped with the lines after the
    checkpoint (an AttributeError traceback before)."""
    from learntok.train.state import truncate_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n[1, 2]\n{"step": "x"}\n{"step": 2}\n{"step": 3}\n')
    assert truncate_metrics(tmp_path, 2) == 3
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


def test_resume_without_any_checkpoint_starts_again_with_a_warning(tmp_path, two_ckpts):
    cfg, run = two_ckpts
    for p in [*run.glob("step_*"), run / "latest"]:  # killed before its first checkpoint
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    lines = []
    train(replace(cfg, resume=str(run)), log=lines.append)
    assert any("no intact checkpoint yet; starting again from step 0" in x for x in lines)
    assert any("dropped" in x for x in lines)  # the killed attempt's metric lines
    train(replace(cfg, out=str(tmp_path / "ref")), log=lambda *_: None)
    assert _rows(run) == _rows(tmp_path / "ref")


# -- a checkpoint write that fails ------------------------------------------------------------------------------


def _assert_failed_write_left_no_trace(run: Path, err: str) -> None:
    assert "could not write checkpoint step_000004 in" in err and str(run) in err
    assert "it needs about" in err and "step_000002 is untouched" in err
    assert not list(run.glob(".step_*"))  # temporary files removed
    assert (run / "latest").read_text().strip() == "step_000002"
    assert checkpoint_problem(run / "step_000002") is None


def test_a_failed_checkpoint_write_is_one_line_and_keeps_the_previous_one(tmp_path, two_ckpts, monkeypatch, capsys):
    _, run = two_ckpts
    shutil.rmtree(run / "step_000004")
    (run / "latest").write_text("step_000002\n")
    import learntok.checkpoint as ck

    real_save = torch.save

    def full_disk(obj, f, *a, **kw):  # half the file lands, then the disk is full
        real_save(obj, f, *a, **kw)
        _truncate(Path(f))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", full_disk)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "No space left on device" in err
    _assert_failed_write_left_no_trace(run, err)
    # a stale temporary directory (a write killed outright) is removed when the run resumes
    (run / ".step_000004.abcd").mkdir()
    monkeypatch.undo()
    lines = []
    train(replace(two_ckpts[0], resume=str(run)), log=lines.append)
    assert any("removed 1 temporary file" in x for x in lines) and not list(run.glob(".step_*"))
    assert (run / "latest").read_text().strip() == "step_000004"


def test_checkpoint_write_on_a_full_filesystem(tmp_path, two_ckpts, capsys):
    """The same on a real size-limited tmpfs (needs the right to mount; skipped elsewhere)."""
    cfg, src = two_ckpts
    mnt = tmp_path / "small"
    mnt.mkdir()
    size = 4 * sum(f.stat().st_size for f in (src / "step_000002").iterdir()) + 200_000
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        run = mnt / "run"
        shutil.copytree(src, run, ignore=shutil.ignore_patterns("step_000004"))
        (run / "latest").write_text("step_000002\n")
        filler = mnt / "filler"
        free = shutil.disk_usage(mnt).free
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, free - 60_000))  # room for config.json and metric lines, not a checkpoint
        assert main(["train", "--resume", str(run), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "No space left on device" in err and "Traceback" not in err and err.count("\n") == 1
        _assert_failed_write_left_no_trace(run, err)
        filler.unlink()  # space freed: the same command now finishes
        assert main(["train", "--resume", str(run), "--no-progress"]) == 0
        assert (run / "latest").read_text().strip() == "step_000004"
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_save_checkpoint_error_type(tmp_path, monkeypatch):
    import learntok.checkpoint as ck

    monkeypatch.setattr(ck, "save_file", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("I/O error")))
    with pytest.raises(CheckpointError, match="no earlier checkpoint"):
        ck.save_checkpoint(tmp_path, 1, {"w": torch.zeros(3)}, {})
    assert list(tmp_path.iterdir()) == []


def _signalled_worker(rank: int, world: int, port: int, cfg, at: int) -> None:
    """A torchrun-like process; rank 1 alone receives SIGTERM while drawing batch at + 1."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if rank == 1:
        real, calls = loop.BatchIterator.next_with_flags, {"n": 0}

        def next_with_flags(self):
            calls["n"] += 1
            if calls["n"] == at + 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return real(self)

        loop.BatchIterator.next_with_flags = next_with_flags
    try:
        train(cfg, log=lambda *_: None)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.mark.integration
def test_sigterm_to_one_rank_stops_all_ranks_at_the_same_step(tmp_path, text_corpus):
    import torch.multiprocessing as mp

    from .test_distributed import _free_port

    cfg = _constant_lr(tiny_train_config(tmp_path / "part", text_corpus, max_steps=5, batch_size=4))
    mp.start_processes(_signalled_worker, args=(2, _free_port(), cfg, 2), nprocs=2, join=True, start_method="spawn")
    assert (tmp_path / "part" / "latest").read_text().strip() == "step_000003"  # both ranks stopped after step 3
    assert [r["step"] for r in _rows(tmp_path / "part")] == [1, 2, 3]  # rank 0 stopped too; no final evaluation


def test_checkpoints_past_step_one_million_are_kept_and_found(tmp_path):
    """Names carry at least 6 digits, so step_1000000 sorts before step_999800 as text: the newest checkpoint was
    pruned as soon as it was written, and a damaged `latest` fell back to an older one."""
    import learntok.checkpoint as ck

    for step in (999_600, 999_800, 1_000_000):
        ck.save_checkpoint(tmp_path, step, {"w": torch.full((3,), float(step))}, {})
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_1000000", "step_999800"]
    (tmp_path / "latest").unlink()
    assert ck.latest_checkpoint(tmp_path).name == "step_1000000"
