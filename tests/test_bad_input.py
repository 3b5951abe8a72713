"""Rows of docs/operations.md's bad-input table not covered beside their feature: each is one line
`learntok: error: ...` with exit status 2 (a closed pipe: silence and 0), checked before any data is read."""

from __future__ import annotations

import subprocess
import sys

import pytest

from learntok.cli import main


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["train", "--help"], ["generate", "--help"]])
def test_output_into_a_closed_pipe_is_quiet(argv):
    """`learntok --help | head`: the reader is gone before learntok writes; no BrokenPipeError traceback."""
    cmd = f"{sys.executable} -m learntok {' '.join(argv)} | true; exit ${{PIPESTATUS[0]}}"
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stderr == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--lr", "-1e-3"], "lr must be > 0"),
    (["train", "--boundaries", "bogus"], "unknown boundary strategy 'bogus'"),
    (["train", "--log-every", "0"], "log_every and max_bad_steps must be >= 1"),
    (["train", "--max-bad-steps", "0"], "log_every and max_bad_steps must be >= 1"),
    (["train", "--progress-style", "fancy"], "--progress-style"),
    (["generate", "RUN", "--prompt", "a", "--max-new-bytes", "-5"], "--max-new-bytes"),
    (["push", "RUN", "not-an-id"], "'not-an-id' is not a Hub repository id"),
    (["eval-data", "download"], "eval-data"),
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


def test_report_needs_a_run_directory(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no such run directory" in capsys.readouterr().err
