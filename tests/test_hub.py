"""Sharing models: every command reads a run, a checkpoint, an exported directory or a Hub id alike (weights
only); export writes a model card; push_to_hub uploads the exported folder and from_pretrained("user/name")
reads it back from the Hub's cache with HF_HUB_OFFLINE=1 (no network in tests)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import learntok
from learntok.cli import main
from learntok.errors import LearntokError
from learntok.train import train

from .conftest import tiny_train_config

hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub not installed (pip install 'learntok[hub]')")

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-step run on a small corpus of PyTorch's source (train/ and valid/)."""
    tmp = tmp_path_factory.mktemp("hub")
    corpus, lines = tmp / "corpus", Path(torch.__file__).read_text(encoding="utf-8").splitlines()
    for split, part in (("train", lines[:1600]), ("valid", lines[1600:1800])):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "0.txt").write_text("\n".join(part) + "\n")
    train(tiny_train_config(tmp / "run", corpus, max_steps=3, eval_every=0), log=lambda *_: None)
    return tmp / "run", corpus


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """HfApi's upload calls recorded, each uploaded folder put into a Hub cache in tmp_path (the layout
    snapshot_download reads: models--USER--NAME/refs/main + snapshots/COMMIT/), read offline."""
    cache, calls = tmp_path / "hub-cache", []

    def create_repo(self, repo_id, **kw):
        calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, *, folder_path, repo_id, **kw):
        calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))
        assert "rate_calibration.json" in kw["delete_patterns"]  # a replaced model's stale files go
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        shutil.copytree(folder_path, repo / "snapshots" / COMMIT)
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(COMMIT)
        return f"https://huggingface.co/{repo_id}/commit/{COMMIT}"

    def create_branch(self, repo_id, *, branch, **kw):
        calls.append(("create_branch", repo_id, branch, kw))

    monkeypatch.setattr(hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(hub.HfApi, "create_branch", create_branch)
    monkeypatch.setattr(hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return calls


def _logits(model) -> torch.Tensor:
    ids = torch.tensor([[256, *b"def f(x):\n    return x"]])
    return model(ids, noise=torch.full(ids.shape, 0.5)).logits


def test_push_then_load_by_hub_id_offline(run, fake_hub, capsys):
    run_dir, _ = run
    assert main(["push", str(run_dir), "someone/tiny", "--private"]) == 0
    assert "pushed to someone/tiny" in capsys.readouterr().out
    (_, repo, kw), (_, repo2, files) = fake_hub
    assert repo == repo2 == "someone/tiny" and kw["private"] is True
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    card = Path(hub.constants.HF_HUB_CACHE) / "models--someone--tiny" / "snapshots" / COMMIT / "README.md"
    assert 'learntok.from_pretrained("someone/tiny")' in card.read_text()
    ref = learntok.from_pretrained(run_dir)
    torch.testing.assert_close(_logits(learntok.from_pretrained("someone/tiny")), _logits(ref), rtol=0, atol=0)
    # a revision spelled user/name@commit reads the same snapshot
    torch.testing.assert_close(_logits(learntok.from_pretrained(f"someone/tiny@{COMMIT}")), _logits(ref), rtol=0,
                               atol=0)
    # negative control: an id that is not in the cache is an error that says so, in one line on the command line
    with pytest.raises(LearntokError, match="not in the local Hub cache"):
        learntok.from_pretrained("someone/other")
    assert main(["generate", "someone/other", "--prompt", "a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("learntok: error: someone/other:") and err.count("\n") == 1


def test_push_from_python_with_a_model_object(run, fake_hub):
    from learntok.hub import push_to_hub

    model = learntok.from_pretrained(run[0])
    url = push_to_hub(model, "someone/obj")
    assert url.endswith(COMMIT) and "model.safetensors" in fake_hub[-1][2]
    torch.testing.assert_close(_logits(learntok.from_pretrained("someone/obj")), _logits(model), rtol=0, atol=0)


def test_push_to_a_new_branch_creates_it_first(run, fake_hub, monkeypatch):
    from learntok.hub import push_to_hub

    seen = {}
    real = hub.HfApi.upload_folder
    monkeypatch.setattr(hub.HfApi, "upload_folder", lambda self, **kw: seen.update(kw) or real(self, **kw))
    push_to_hub(run[0], "someone/branchy", revision="exp-1")
    assert [c[0] for c in fake_hub] == ["create_repo", "create_branch", "upload_folder"]
    assert fake_hub[1][1:3] == ("someone/branchy", "exp-1") and fake_hub[1][3]["exist_ok"] is True
    assert seen["revision"] == "exp-1"


def test_every_command_reads_every_kind_of_source(run, fake_hub, tmp_path, capsys):
    run_dir, _ = run
    export = tmp_path / "export"
    assert main(["export", str(run_dir), str(export)]) == 0
    assert main(["push", str(export), "someone/exported"]) == 0
    ckpt = run_dir / (run_dir / "latest").read_text().strip()
    capsys.readouterr()
    outputs = []
    for source in (run_dir, ckpt, export, "someone/exported"):
        assert main(["segment", str(source), "--text", "import os\n", "--format", "jsonl"]) == 0
        assert main(["show", str(source), "--text", "import os", "--color", "never"]) == 0
        outputs.append(capsys.readouterr().out)
    assert all(o == outputs[0] for o in outputs)  # the same weights, whatever the source


def test_eval_of_an_exported_model_matches_its_run(run, tmp_path, capsys):
    run_dir, corpus = run
    export = tmp_path / "export"
    learntok.pretrained.export_run(run_dir, export)
    common = ["--tasks", "none", "--data", str(corpus / "valid"), "--limit", "2", "--no-progress"]
    assert main(["eval", str(run_dir), *common, "--out", str(tmp_path / "a.json")]) == 0
    assert main(["eval", str(export), *common, "--out", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["heldout"]["bpb"] == b["heldout"]["bpb"] and a["heldout"]["bytes"] > 0
    # an exported model has no run to take held-out text from: one line, before any work
    capsys.readouterr()
    assert main(["eval", str(export), "--tasks", "none"]) == 2
    assert "give --data PATH" in capsys.readouterr().err


def test_inference_does_not_read_the_optimizer_state(run, tmp_path, monkeypatch):
    run_dir, _ = run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for state in copy.glob("step_*/train_state.pt"):
        state.write_bytes(b"")  # unreadable: inference must not need it
    import learntok.checkpoint as ck

    monkeypatch.setattr(ck.torch, "load", lambda *a, **k: pytest.fail("inference loaded train_state.pt"))
    torch.testing.assert_close(_logits(learntok.from_pretrained(copy)), _logits(learntok.from_pretrained(run_dir)))


def test_model_card_reports_the_run(run, tmp_path):
    run_dir, corpus = run
    out = learntok.pretrained.export_run(run_dir, tmp_path / "export")
    card = (out / "README.md").read_text()
    last = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "val/bpb" in x][-1]
    assert card.startswith("---\nlibrary_name: learntok\n")
    assert f"{last['val/bpb']:.4f}" in card and str(corpus) in card and "| width, heads | 32, 2 |" in card
    assert "`learned`" in card and "segments over" in card
    # a model saved without its run says so instead of inventing figures
    bare = learntok.save_pretrained(learntok.from_pretrained(out), tmp_path / "bare", seq_len=64)
    text = (bare / "README.md").read_text()
    assert "Not recorded" in text and "Validation bits per byte" not in text


def test_a_path_that_is_neither_a_directory_nor_a_hub_id(tmp_path, capsys):
    assert main(["show", str(tmp_path / "missing" / "dir" / "x")]) == 2
    assert "no such directory (nor a Hugging Face Hub id" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["generate", str(tmp_path / "file"), "--prompt", "a"]) == 2
    assert "not a directory" in capsys.readouterr().err
    # a typo under an existing directory (runs/tyop) is a local path, not a Hub id: no network, and what is there
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    assert main(["generate", str(tmp_path / "runs" / "tyop"), "--prompt", "a"]) == 2
    err = capsys.readouterr().err
    assert "no such directory" in err and "has: tiny" in err and "Hub" in err and "Error" not in err


def test_a_push_deletes_only_learntoks_optional_files():
    """A push removes the strategy files its model lacks (another model's tokenizer or calibration table would
    be loaded with it), and nothing else of the repository."""
    from fnmatch import fnmatch

    from learntok.hub import strategy_file_patterns

    patterns = strategy_file_patterns()
    stale = ["bpe_tokenizer.json", "bpe_meta.json", "entropy_model/model.safetensors", "entropy_threshold.json",
             "rate_calibration.json", "learntok_tokenizer.json"]
    assert all(any(fnmatch(f, p) for p in patterns) for f in stale)
    assert not any(fnmatch(f, p) for p in patterns for f in ("config.json", "model.safetensors", "README.md",
                                                             "notes/eval.md", ".gitattributes"))
