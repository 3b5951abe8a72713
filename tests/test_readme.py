"""The README's Python example runs as written (shortened to a few steps)."""

from __future__ import annotations

import re
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
