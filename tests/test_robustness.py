"""Character-level robustness (learntok.evaluation.robustness): generated CUTE-style examples are right and their
distractors one edit away; byte noise edits at the asked rate; the whole evaluation scores a model whose
predictions are known exactly (uniform over bytes: 8 bits per byte everywhere) and reaches eval.json."""

from __future__ import annotations

import random
import re

import pytest

from learntok.evaluation.bpb import BoundaryMode
from learntok.evaluation.robustness import CUTE_TASKS, add_noise, cute_examples, robustness, words

from .conftest import build_model, sample_docs
from .test_eval_bpb import patch_logits, uniform_logits

VOCAB = ["river", "banana", "token", "learned", "bytes", "stone", "apple", "model"]


def _one_edit(a: str, b: str) -> bool:
    """b is one swap of neighbours, one replacement or one deletion away from a."""
    if len(b) == len(a) - 1:
        return any(a[:i] + a[i + 1:] == b for i in range(len(a)))
    if len(b) != len(a):
        return False
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                              and a[diff[1]] == b[diff[0]])


def _solve(task: str, question: str) -> str:
    q = re.findall(r'"([^"]*)"', question)
    if task == "spell":
        return " ".join(q[0])
    if task == "unspell":
        return q[0].replace(" ", "")
    if task == "contains":
        return "yes" if q[1] in q[0] else "no"
    if task == "insert":
        return q[2].replace(q[1], q[1] + q[0])
    if task == "delete":
        return q[1].replace(q[0], "") or "(nothing)"
    if task == "substitute":
        return q[2].replace(q[0], q[1])
    return q[0][1] + q[0][0] + q[0][2:]


@pytest.mark.parametrize("task", CUTE_TASKS)
def test_cute_examples_are_right_and_distractors_one_edit_away(task):
    examples = cute_examples(task, VOCAB, n=20, seed=3)
    assert examples == cute_examples(task, VOCAB, n=20, seed=3)  # deterministic
    for ex in examples:
        text = ex.context.decode()
        blocks = text.split("\n\n")
        assert len(blocks) == 3 and text.endswith("\nAnswer:")
        for demo in blocks[:2]:
            q, a = demo.split("\nAnswer: ")
            assert a == _solve(task, q)
        gold = ex.choices[ex.gold].decode()[1:]
        assert gold == _solve(task, blocks[2].split("\nAnswer:")[0])
        others = [c.decode()[1:] for i, c in enumerate(ex.choices) if i != ex.gold]
        assert len(set(ex.choices)) == len(ex.choices)
        if task == "contains":
            assert sorted([gold, *others]) == ["no", "yes"]
        else:
            unspell = (lambda x: x.replace(" ", "")) if task == "spell" else (lambda x: x)
            assert len(ex.choices) == 4 and all(_one_edit(unspell(gold), unspell(o)) for o in others)
    assert len({ex.gold for ex in examples}) > 1  # the gold answer is not always in one place


def test_every_example_gets_its_distractors():
    """One-letter answers and answers of one repeated letter got fewer than three distractors (a failed swap
    fell through to deletion only), so some examples had one choice and were right by construction."""
    for task in ("delete", "swap", "substitute"):
        assert all(len(ex.choices) == 4 for ex in cute_examples(task, ["all", "see", "too", "odd"] * 3, 12))


def test_noise_edits_at_the_asked_rate():
    data = bytes(range(32, 127)) * 200
    assert add_noise(data, 0.0, random.Random(0)) == data
    noised = add_noise(data, 0.1, random.Random(0))
    changed = sum(a != b for a, b in zip(data, noised))  # a rough count: edits shift what follows them
    assert noised != data and changed > 0.05 * len(data)
    assert abs(len(noised) - len(data)) < 0.02 * len(data)  # insertions and deletions balance


def test_words_are_letters_only():
    ws = words([b"The river's 42 bytes, naive cafe tokenization!"], seed=0)
    assert set(ws) == {"the", "river", "bytes", "naive", "cafe"}  # 'tokenization' has 12 letters


def test_robustness_scores_a_known_model():
    model = patch_logits(build_model("learned").eval(), uniform_logits)
    docs = [d[:400] for d in sample_docs()]
    r = robustness(model, docs, 64, BoundaryMode(), n=6, rates=(0.05,), noise_bytes=2000)
    for task, t in r["cute"].items():
        assert t["n"] == 6 and t["bpb"] == pytest.approx(8.0), task
        assert t["chance"] == pytest.approx(0.5 if task == "contains" else 0.25)
    assert r["noise"]["clean_bpb"] == pytest.approx(8.0)
    assert r["noise"]["rates"]["0.05"]["delta"] == pytest.approx(0.0, abs=1e-6)


def test_eval_robustness_flag(tmp_path, text_corpus, capsys):
    from learntok.cli.evaluate import cmd_eval
    from learntok.evaluation.report import read_eval
    from learntok.train import train

    from .conftest import tiny_train_config

    train(tiny_train_config(tmp_path / "run", text_corpus, max_steps=1), log=lambda *_: None)
    assert cmd_eval([str(tmp_path / "run"), "--tasks", "none", "--limit", "3", "--robustness", "--no-progress"]) == 0
    rep = read_eval(tmp_path / "run" / "eval.json")
    assert set(rep["robustness"]["cute"]) == set(CUTE_TASKS) and rep["robustness"]["cute"]["spell"]["n"] == 3
    assert "character-level robustness" in capsys.readouterr().out
    # without held-out BPB it still runs (it was skipped, "robustness": null); text with no English word is a
    # one-line error, not a ZeroDivisionError
    (tmp_path / "run" / "eval.json").unlink()
    assert cmd_eval([str(tmp_path / "run"), "--tasks", "none", "--limit", "2", "--robustness", "--no-heldout",
                     "--no-progress"]) == 0
    rep = read_eval(tmp_path / "run" / "eval.json")
    assert rep["robustness"]["cute"]["spell"]["n"] == 2 and rep["robustness"]["data"] and not rep.get("heldout")
    (tmp_path / "cjk.txt").write_text("日本語のテキストを分割する。" * 200)
    from learntok.cli import main

    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "cjk.txt"), "--tasks", "none", "--limit",
                 "2", "--robustness", "--no-heldout", "--no-progress", "--out", str(tmp_path / "cjk.json")]) == 2
    assert "no ASCII word" in capsys.readouterr().err
