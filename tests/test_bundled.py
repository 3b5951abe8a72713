"""The model shipped inside the package: loaded by name with no network and no run directory, by the Python API
and by the commands that default to it; a local directory of the same name wins; the wheel carries it."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import learntok
from learntok.cli import main
from learntok.pretrained import bundled

ROOT = Path(__file__).resolve().parents[1]


def test_loaded_by_name_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = bundled("enwiki-small")
    assert path == bundled("learntok/enwiki-small") and (path / "model.safetensors").stat().st_size < 8 << 20
    model = learntok.from_pretrained("enwiki-small")
    tok = learntok.LearnedTokenizer.from_pretrained("learntok/enwiki-small")
    text = "The river flows through the valley."
    enc = tok.encode(text)
    assert tok.decode(enc) == text and 3 < len(enc) < len(text.encode())  # it segments: fewer tokens than bytes
    assert model.bcfg.boundaries == "learned"
    record = [json.loads(x) for x in (ROOT / "experiments" / "bundled" / "records.jsonl").read_text().splitlines()]
    assert any(r["arm"] == "enwiki-small" for r in record)  # how it was made is on record


def test_commands_default_to_it(capsys):
    assert main(["segment", "--text", "Tokenization, learned.", "--format", "jsonl"]) == 0
    spans = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "".join(s["text"] for s in spans) == "Tokenization, learned." and len(spans) > 2
    assert main(["generate", "--prompt", "The ", "--max-new-bytes", "8", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("The ")
    # a prompt whose bytes are not UTF-8 (argv decoded with surrogateescape) is continued as those bytes
    assert main(["generate", "--prompt", "caf\udce9", "--max-new-bytes", "4", "--stop", "\udce9x"]) == 0
    assert capsys.readouterr().out.startswith("caf\ufffd")
    assert main(["show", "--text", "Hello, learned world"]) == 0
    assert "Hello," in capsys.readouterr().out


def test_a_local_directory_of_the_same_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "learntok").mkdir()  # a directory named like the prefix is not taken for a mistyped path
    assert learntok.from_pretrained("learntok/enwiki-small").bcfg.boundaries == "learned"
    (tmp_path / "enwiki-small").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json|not a learntok"):
        learntok.from_pretrained("enwiki-small")


@pytest.mark.integration
def test_the_wheel_carries_the_model(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("learntok-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"learntok/models/enwiki-small/model.safetensors", "learntok/models/enwiki-small/config.json",
            "learntok/models/enwiki-small/tokenizer.json"} <= set(names)
