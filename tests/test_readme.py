"""The README's Python example runs as written (shortened to a few steps)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "max_steps=200" in code
    monkeypatch.chdir(tmp_path)  # runs/api is created here
    exec(compile(code.replace("max_steps=200", "max_steps=3, eval_every=0, progress=False"), "README", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert "|" in "\n".join(out) and (tmp_path / "runs" / "api" / "config.json").exists()
    assert eval(out[-1]) and all(isinstance(s, str) for s in eval(out[-1]))  # the segments


NETWORK = ("learntok eval-data fetch", "learntok push ")
"""README commands that need the network (the Hub): not run here."""
SHORTER = {
    # README command (as written) -> the flags that make it a few seconds on a tiny corpus
    "learntok train --boundaries uniform --max-bytes 2e6": ["--max-steps", "2", "--out", "runs/u"],
    "learntok train --preset small --data DATA/enwiki --out runs/wiki --schedule time --time-budget 1200":
        ["--time-budget", "3", "--val-bytes", "4096"],
    "learntok train --resume runs/wiki --time-budget 2400": ["--time-budget", "5"],
    "learntok train --config run.toml --lr 1e-3": ["--max-steps", "2", "--out", "runs/c"],
    "learntok train --rate-range 0.1 0.33 --out runs/any": ["--max-steps", "2"],
    "learntok train --ngram-sizes 3 4 5 6 7 8 --flops-budget 1.7e13 --flops-convention total":
        ["--max-steps", "2", "--out", "runs/ngrams", "--val-bytes", "4096"],
    "learntok calibrate runs/any": ["--max-bytes", "8192"],
    "learntok train --inner-layers 1 --out runs/two-level": ["--max-steps", "2"],
    "learntok eval runs/wiki": ["--limit", "2", "--max-bytes", "4096", "--per-document"],  # for compare --paired
    "learntok generate runs/wiki --prompt \"The river\"": ["--max-new-bytes", "8"],
}
AS_RUN = {
    # README command whose budget sits before its `--` -> the command run instead (one cell, a few steps)
    "learntok sweep runs/grid --flops-budget 1.7e13 --axis d-model=64,96 --axis n-mid=2,3 -- --boundaries uniform":
        "learntok sweep runs/grid --flops-budget 1e10 --axis d-model=64 --axis n-mid=2 -- --boundaries uniform "
        "--val-bytes 4096",
}


def _argv(cmd: str) -> list[str]:
    """A README command's arguments as the tests run it: AS_RUN's form, then SHORTER's flags."""
    return [*shlex.split(AS_RUN.get(cmd, cmd))[1:], *SHORTER.get(cmd, [])]


def _commands() -> list[str]:
    """The `learntok ...` lines of the README's "Using it" block, without their comments."""
    block = README.read_text().split("## Using it", 1)[1].split("`python -m learntok", 1)[0]
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip().startswith("learntok ")]


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
    """Every command the README shows runs (exit 0) on a tiny English corpus, in the README's order, shortened by
    the flags in SHORTER; the two that need the network are skipped. A README command this test does not know
    fails it, so the README and the test move together."""

    from learntok.cli import main

    from .conftest import SHARED_DATA, write_text_corpus

    pytest.importorskip("matplotlib")
    corpus = write_text_corpus(tmp_path / "DATA" / "enwiki")
    (corpus / "test").mkdir()
    (corpus / "test" / "0.txt").write_text((corpus / "valid" / "0.txt").read_text())
    if (SHARED_DATA / "eval").is_dir():
        monkeypatch.setenv("LEARNTOK_EVAL_DIR", str(SHARED_DATA / "eval"))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--write-config", "run.toml", "--max-steps", "2"]) == 0  # README: --write-config FILE
    commands = _commands()
    assert len(commands) >= 15 and all(c in commands for c in [*SHORTER, *AS_RUN]), \
        "README commands changed: update SHORTER and AS_RUN"
    ran = []
    for cmd in commands:
        if cmd.startswith(NETWORK):
            continue
        if cmd.startswith("learntok compare") and not Path("runs/wiki-uniform").exists():
            # its second run, as the README's name implies: uniform boundaries (evaluated as runs/wiki is)
            base = ["train", "--preset", "small", "--data", "DATA/enwiki", "--out", "runs/wiki-uniform",
                    "--boundaries", "uniform", "--max-steps", "2", "--val-bytes", "4096"]
            assert main(base) == 0 and main(["eval", "runs/wiki-uniform", "--limit", "2", "--max-bytes", "4096",
                                             "--per-document"]) == 0
        argv = _argv(cmd)
        if argv[-1] == "--help" or "--help" in argv:
            with pytest.raises(SystemExit) as e:
                main(argv)
            assert e.value.code == 0, cmd
        else:
            assert main(argv) == 0, (cmd, capsys.readouterr().err[-2000:])
        ran.append(cmd)
    assert len(ran) == len(commands) - 2
    assert (tmp_path / "map.png").stat().st_size > 1000 and (tmp_path / "models" / "wiki" / "config.json").exists()


NEEDS = re.compile(r"needs \[(\w+)\]")


@pytest.mark.integration
def test_readme_commands_on_a_base_install(tmp_path):
    """On `pip install -e .` alone (no extras; .ci/run builds that environment and names its bin directory in
    LEARNTOK_BASE_BIN), every README command either runs or, where its comment says "needs [EXTRA]", stops with
    exit 2 and one line naming `learntok[EXTRA]`."""
    import os
    import subprocess

    from .conftest import SHARED_DATA, write_text_corpus

    base = os.environ.get("LEARNTOK_BASE_BIN")
    if not base:
        pytest.skip("LEARNTOK_BASE_BIN is not set (.ci/run sets it to a base install's bin directory)")
    exe = Path(base) / "learntok"
    assert exe.exists(), f"{exe}: no learntok in the base install"
    corpus = write_text_corpus(tmp_path / "DATA" / "enwiki")
    (corpus / "test").mkdir()
    (corpus / "test" / "0.txt").write_text((corpus / "valid" / "0.txt").read_text())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if (SHARED_DATA / "eval").is_dir():
        env["LEARNTOK_EVAL_DIR"] = str(SHARED_DATA / "eval")

    def learntok(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert learntok(["train", "--write-config", "run.toml", "--max-steps", "2"]).returncode == 0
    block = README.read_text().split("## Using it", 1)[1].split("`python -m learntok", 1)[0]
    lines = [line.strip() for line in block.splitlines() if line.strip().startswith("learntok ")]
    refused = []
    for line in lines:
        cmd, _, comment = line.partition("#")
        cmd = cmd.strip()
        if cmd.startswith(NETWORK):
            continue
        if cmd.startswith("learntok compare") and not (tmp_path / "runs/wiki-uniform").exists():
            assert learntok(["train", "--preset", "small", "--data", "DATA/enwiki", "--out", "runs/wiki-uniform",
                             "--boundaries", "uniform", "--max-steps", "2", "--val-bytes", "4096"]).returncode == 0
            assert learntok(["eval", "runs/wiki-uniform", "--limit", "2", "--max-bytes", "4096",
                             "--per-document"]).returncode == 0
        res = learntok(_argv(cmd))
        extra = NEEDS.search(comment)
        if extra and extra.group(1) not in ("hf", "hub"):  # base-installed: hf/hub commands are the network ones
            assert res.returncode == 2, (cmd, res.stdout[-500:], res.stderr[-1500:])
            assert res.stderr.count("\n") == 1 and f"learntok[{extra.group(1)}]" in res.stderr, (cmd, res.stderr)
            refused.append(cmd)
        else:
            assert res.returncode == 0, (cmd, res.stderr[-1500:])
    assert len(refused) == 3  # show --png, plot, report: the README says [viz]
