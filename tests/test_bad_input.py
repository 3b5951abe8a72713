"""Rows of docs/operations.md's bad-input table not covered beside their feature: each is one line
`learntok: error: ...` with exit status 2 (a closed pipe: silence and 0), checked before any data is read."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from learntok.cli import COMMANDS, main


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["train", "--help"], ["generate", "--help"]])
def test_output_into_a_closed_pipe_is_quiet(argv):
    """`learntok --help | head`: the reader is gone before learntok writes; no BrokenPipeError traceback."""
    cmd = f"{sys.executable} -m learntok {' '.join(argv)} | true; exit ${{PIPESTATUS[0]}}"
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stderr == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--lr", "-1e-3"], "lr must be finite and > 0"),
    (["train-entropy-model", "--data", "stdlib", "--out", "E", "--lr", "nan"], "--lr finite and > 0"),
    (["train", "--boundaries", "bogus"], "unknown boundary strategy 'bogus'"),
    (["train", "--log-every", "0"], "log_every and max_bad_steps must be >= 1"),
    (["train", "--max-bad-steps", "0"], "log_every and max_bad_steps must be >= 1"),
    (["train", "--progress-style", "fancy"], "--progress-style"),
    (["generate", "RUN", "--prompt", "a", "--max-new-bytes", "-5"], "--max-new-bytes"),
    (["push", "RUN", "not-an-id"], "'not-an-id' is not a Hub repository id"),
    (["eval-data", "download"], "eval-data"),
    (["train", "--rate-range", "0.3", "0.1"], "0 < LOW < HIGH < 1"),
    (["train", "--rate-range", "0.25", "0.4"], "must lie in rate_range"),
    (["train", "--rate-strata", "2"], "need rate_range"),
    (["train", "--rate-range", "0.1", "0.3", "--rate-strata", "3"], "--rate-strata 3 must cut batch_size=8"),
    (["train", "--rate-range", "0.1", "0.3", "--batch-stats", "lagged"], "--batch-stats lagged cannot serve"),
    (["nosuchcommand"], "unknown command 'nosuchcommand'"),
])
def test_bad_flags_are_one_line_before_the_data_is_read(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)  # where the README's first command has left runs/tiny: no note about it comes first
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "metrics.jsonl").write_text("{}\n")
    missing = str(tmp_path / "no-such-data")
    argv = [a.replace("RUN", str(tmp_path)) for a in argv]
    if argv[0] == "train":
        argv += ["--data", missing]  # a data error would show if the flags were checked after loading it
    assert main(argv) == 2
    err = capsys.readouterr().err
    first = err.strip().splitlines()[0]
    assert first.startswith("learntok: error:") and message in first and "Traceback" not in err
    assert "no-such-data" not in err
    assert not (tmp_path / "runs" / "tiny-2").exists()
    if argv[0] != "nosuchcommand":  # (an unknown command also prints the usage)
        assert err.count("\n") == 1


def test_learntok_debug_shows_the_traceback(tmp_path):
    """LEARNTOK_DEBUG=1 re-raises the error the one line would report: Python's traceback and exit status 1."""
    argv = [sys.executable, "-m", "learntok", "generate", str(tmp_path), "--prompt", "a", "--max-new-bytes", "-5"]
    env = {k: v for k, v in os.environ.items() if k != "LEARNTOK_DEBUG"}
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("learntok: error:") and "--max-new-bytes" in plain.stderr
    debug = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, "LEARNTOK_DEBUG": "1"})
    assert debug.returncode == 1 and debug.stderr.startswith("Traceback (most recent call last):")
    assert "learntok: error:" not in debug.stderr and "--max-new-bytes" in debug.stderr.strip().splitlines()[-1]


def test_a_missing_extra_is_one_line_naming_it(tmp_path, text_corpus, monkeypatch, capsys):
    """`show --png`, `plot` and `report` need matplotlib (the `viz` extra): without it, one line naming the extra
    and exit 2, not an ImportError traceback."""
    from learntok.train import train

    from .conftest import tiny_train_config

    run = tmp_path / "run"
    train(tiny_train_config(run, text_corpus, max_steps=1), log=lambda *_: None)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ModuleNotFoundError
    for argv in (["show", str(run), "--text", "hi", "--png", str(tmp_path / "m.png")], ["plot", str(run)],
                 ["report", str(run)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "pip install 'learntok[viz]'" in err[0] and "matplotlib" in err[0], (argv, err)


def test_a_system_error_reads_as_the_path_and_what_is_wrong(tmp_path, capsys):
    """An OSError from the system is `PATH: what went wrong (hint)`, not Python's `[Errno 17] File exists: ...`."""
    (tmp_path / "a-file").write_text("x")
    for out, message in ((tmp_path / "a-file", "File exists (a file is where a directory must be)"),
                         (tmp_path / "a-file" / "run", "Not a directory (part of the path is a file)")):
        assert main(["train", "--out", str(out), "--max-steps", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"learntok: error: {out}: {message}"], err


def test_report_needs_a_run_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no such run directory" in capsys.readouterr().err


@pytest.mark.parametrize("wrapped", [False, True])
def test_out_of_memory_in_a_step_is_one_line_naming_the_micro_batch(wrapped, tmp_path, text_corpus, monkeypatch,
                                                                    capsys):
    """A micro-batch too large for the GPU (the paper-147m preset once ran 128 x 4096 bytes per pass) is one line
    that names --micro-batch-size, exit 2, not a CUDA traceback; also when torch.compile wraps the error (an
    out-of-memory inside a compiled stage's first call). Simulated on CPU at the first step."""
    import learntok.train.loop as loop

    def oom(*a, **k):
        error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if not wrapped:
            raise error
        raise RuntimeError("backend='inductor' raised: BackendCompilerFailed") from error

    monkeypatch.setattr(loop, "train_step", oom)
    argv = ["train", "--data", str(text_corpus), "--out", str(tmp_path / "run"), "--max-steps", "2",
            "--seq-len", "64", "--batch-size", "4", "--micro-batch-size", "2", "--d-model", "32", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "out of memory on cpu in training step 1 with 2 sequences of 64 bytes" in err
    assert "--micro-batch-size" in err


def test_paper_presets_accumulate_micro_batches_of_eight():
    """The paper's 128 x 4096-byte batch as one forward pass does not fit a GPU: the presets run 8 sequences per
    pass (16 accumulated in one process), and a process with fewer sequences runs them all at once."""
    from learntok.presets import get_preset
    from learntok.train.loop import batch_split
    from learntok.train.parallel import Dist

    cfg = get_preset("paper-147m")
    assert batch_split(cfg, Dist()) == (128, 8, 16)
    assert batch_split(cfg, Dist(world=8)) == (16, 8, 2)
    assert batch_split(cfg, Dist(world=32)) == (4, 4, 1)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_usage_names_every_positional_argument(command, capsys):
    """`learntok COMMAND --help`'s usage line says what each positional argument is (RUN, OUT, [MODEL], ...), not
    the type tyro would print ("STR"), which leaves a newcomer guessing what `learntok prepare STR STR` takes."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    usage = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("usage:"))
    positional = re.sub(r"\[-[^]]*\]|--\S+ \S+", "", usage)  # the options and their values out
    assert "STR" not in positional.split(), usage
