"""The lm-evaluation-harness adapter, offline: its methods on Instance objects, and a 4-example local task run
through lm_eval.simple_evaluate."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed (optional extra: pip install 'learntok[eval]')")

from lm_eval.api.instance import Instance  # noqa: E402

from learntok.boundaries.learned import LearnedConfig  # noqa: E402
from learntok.config import DataConfig, TrainConfig  # noqa: E402
from learntok.evaluation.bpb import BoundaryMode, score_pairs  # noqa: E402
from learntok.evaluation.harness import LearntokLM, text_key  # noqa: E402

from .conftest import build_model, tiny_model  # noqa: E402
from .test_eval_bpb import patch_logits, successor_logits, uniform_logits  # noqa: E402

CFG = TrainConfig(model=tiny_model(), boundary=LearnedConfig(policy_window=3), data=DataConfig(seq_len=64))


def req(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_loglikelihood_matches_the_scorer_and_reports_greedy():
    model = build_model("learned")
    lm = LearntokLM(model=model, cfg=CFG, batch_size=2)
    pairs = [("The cat sat on the", " mat"), ("", "hello"), ("x = ", "1")]
    got = lm.loglikelihood([req("loglikelihood", c, y) for c, y in pairs], disable_tqdm=True)
    enc = [(c.encode(), y.encode()) for c, y in pairs]
    ref = score_pairs(model, enc, [text_key(c) for c, _ in enc], 64, BoundaryMode())
    assert [g[0] for g in got] == pytest.approx([-s.nll for s in ref], rel=1e-5)
    assert [g[1] for g in got] == [s.greedy for s in ref]
    oracle = LearntokLM(model=patch_logits(build_model("learned"), successor_logits), cfg=CFG)
    assert [g[1] for g in oracle.loglikelihood([req("loglikelihood", "ab", "cd"), req("loglikelihood", "ab", "ce")],
                                               disable_tqdm=True)] == [True, False]


def test_rolling_scores_every_byte_once():
    """Under exactly uniform predictions a string of n bytes has log-likelihood -n ln 256, however many windows."""
    lm = LearntokLM(model=patch_logits(build_model("learned"), uniform_logits), cfg=CFG)
    texts = ["short", "a longer text that needs several windows of the 64-byte model " * 4]
    got = lm.loglikelihood_rolling([req("loglikelihood_rolling", t) for t in texts], disable_tqdm=True)
    assert got == pytest.approx([-len(t.encode()) * math.log(256) for t in texts], rel=1e-6)


def test_generate_until_is_greedy_and_stops():
    lm = LearntokLM(model=patch_logits(build_model("learned"), successor_logits), cfg=CFG)
    out = lm.generate_until([req("generate_until", "ab", {"until": ["f"], "max_gen_toks": 10}),
                             req("generate_until", "01", {"until": "\n", "max_gen_toks": 4})], disable_tqdm=True)
    assert out == ["cde", "2345"]


def test_unknown_argument_is_an_error():
    with pytest.raises(ValueError, match="unknown argument"):
        LearntokLM(model=build_model("learned"), cfg=CFG, temperature=1.0)


def test_local_multiple_choice_task_runs_offline(tmp_path, monkeypatch):
    """A YAML task over a local jsonl with 4 examples, evaluated by lm_eval itself with the registered model."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = [{"query": "Question: 1+1?\nAnswer:", "choices": ["2", "3"], "gold": 0},
            {"query": "Question: 2+2?\nAnswer:", "choices": ["5", "4"], "gold": 1},
            {"query": "Question: sky colour?\nAnswer:", "choices": ["blue", "green"], "gold": 0},
            {"query": "Question: 3*3?\nAnswer:", "choices": ["6", "9"], "gold": 1}]
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tiny.yaml").write_text(
        "task: learntok_tiny\ndataset_path: json\n"
        f"dataset_kwargs:\n  cache_dir: {tmp_path / 'hf'}\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{gold}}'\n"
        "metric_list:\n  - metric: acc\n")
    lm = LearntokLM(model=build_model("learned"), cfg=CFG)
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)  # skip indexing the built-in tasks
    res = lm_eval.simple_evaluate(model=lm, tasks=["learntok_tiny"], task_manager=tasks, log_samples=False,
                                  verbosity="ERROR")
    acc = res["results"]["learntok_tiny"]["acc,none"]
    # Reference: the same decision from the adapter's own log-likelihoods.
    ll = lm.loglikelihood([req("loglikelihood", r["query"], " " + c) for r in rows for c in r["choices"]],
                          disable_tqdm=True)
    ref = sum(int(max(range(2), key=lambda j: ll[2 * i + j][0]) == r["gold"]) for i, r in enumerate(rows)) / 4
    assert acc == pytest.approx(ref)


def test_registered_under_learntok():
    from lm_eval.api.registry import get_model

    assert get_model("learntok") is LearntokLM


def test_installed_entry_point_names_the_adapter():
    """lm-eval releases that discover model plugins find `--model learntok` through this entry point."""
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="lm_eval.models") if e.name == "learntok"]
    assert ep.load() is LearntokLM


@pytest.mark.integration
def test_lm_eval_command_line_runs_model_learntok(tmp_path):
    """`python -m learntok.evaluation.harness --model learntok ...` is lm_eval's own CLI with the model registered
    (and lm_eval's default device cuda:0 falls back to the CPU)."""
    import os
    import subprocess
    import sys

    from learntok.train import train

    from .conftest import tiny_train_config

    for split in ("train", "valid"):
        (tmp_path / "c" / split).mkdir(parents=True)
        (tmp_path / "c" / split / "a.txt").write_text("def f(x):\n    return x + 1\n" * 200)
    train(tiny_train_config(tmp_path / "run", tmp_path / "c", max_steps=1), log=lambda *_: None)
    rows = [{"query": "Question: 1+1?\nAnswer:", "choices": ["2", "3"], "gold": 0},
            {"query": "Question: 2+2?\nAnswer:", "choices": ["5", "4"], "gold": 1}]
    (tmp_path / "tiny.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny.yaml").write_text(
        f"task: learntok_cli\ndataset_path: json\ndataset_kwargs:\n  cache_dir: {tmp_path / 'hf'}\n"
        f"  data_files:\n    test: {tmp_path / 'tiny.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: '{{query}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{gold}}'\n"
        "metric_list:\n  - metric: acc\n")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "learntok.evaluation.harness", "--model", "learntok", "--model_args",
                          f"pretrained={tmp_path / 'run'}", "--tasks", "learntok_cli", "--include_path",
                          str(tmp_path / "tasks")], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "learntok_cli" in res.stdout and "acc" in res.stdout
