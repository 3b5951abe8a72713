"""Downstream task files: the four shipped sets are read, user files in the same formats are accepted, a
malformed line names its file and line, and the metrics follow from per-choice scores."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from learntok.data import DataError
from learntok.evaluation.bpb import BoundaryMode, score_pairs
from learntok.evaluation.tasks import TASKS, read_task, resolve_tasks, score_task

from .conftest import SHARED_DATA, build_model
from .test_eval_bpb import patch_logits, successor_logits

EVAL_DIR = SHARED_DATA / "eval"
needs_shared = pytest.mark.skipif(not EVAL_DIR.is_dir(), reason=f"shared evaluation data not found at {EVAL_DIR}")


def write_jsonl(path: Path, rows: list, opener=open) -> Path:
    with opener(path, "wt") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


@needs_shared
@pytest.mark.parametrize("name", list(TASKS))
def test_each_shipped_file_is_read(name):
    [(task, path)] = resolve_tasks(name, EVAL_DIR)
    examples = read_task(task, path, limit=7)
    assert len(examples) == 7 and path.name.startswith(TASKS[name].filename)
    for ex in examples:
        assert ex.context and all(c.startswith(b" ") for c in ex.choices) and 0 <= ex.gold < len(ex.choices)
        assert ex.where.startswith(str(path) + ":")
    if name == "lambada":
        assert all(len(ex.choices) == 1 and b" " not in ex.choices[0][1:] for ex in examples)
    elif name == "hellaswag":
        assert all(len(ex.choices) == 4 for ex in examples)


@needs_shared
def test_shipped_lambada_context_plus_continuation_is_the_text():
    import lzma

    [(_, path)] = resolve_tasks("lambada", EVAL_DIR)
    with lzma.open(path, "rt", encoding="utf-8") as f:
        raw = [json.loads(next(f)) for _ in range(5)]
    for ex, r in zip(read_task("lambada", path, limit=5), raw):
        assert (ex.context + ex.choices[0]).decode() == r["text"]


@pytest.mark.parametrize("line, problem", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "not an object"),
    ('{"choices": ["a", "b"], "gold": 0}', "no field 'query'"),
    ('{"query": "q", "choices": ["a"], "gold": 0}', "at least 2 strings"),
    ('{"query": "q", "choices": ["a", "b"], "gold": 2}', "'gold' must be an integer index"),
    ('{"query": "q", "choices": ["a", "b"], "gold": true}', "'gold' must be an integer index"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, problem):
    good = {"query": "Question: 1+1?\nAnswer:", "choices": ["2", "3"], "gold": 0}
    path = write_jsonl(tmp_path / "piqa.jsonl", [good, "", good, line, good])
    with pytest.raises(DataError, match=f"{path}:4: .*{problem}"):
        read_task("piqa", path)


def test_lambada_user_formats_and_compressed_files(tmp_path):
    rows = [{"text": "He opened the door and saw his old friend Harlin"},
            {"context": "She said", "continuation": " hello"}]
    path = write_jsonl(tmp_path / "lam.jsonl.gz", rows, opener=gzip.open)
    [(name, p)] = resolve_tasks(f"lambada={path}", None)
    ex = read_task(name, p)
    assert (ex[0].context, ex[0].choices) == (b"He opened the door and saw his old friend", (b" Harlin",))
    assert (ex[1].context, ex[1].choices) == (b"She said", (b" hello",))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "oneword"}])
    with pytest.raises(DataError, match=f"{bad}:1: .*no space"):
        read_task("lambada", bad)


def test_resolve_tasks_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'mmlu'"):
        resolve_tasks("piqa,mmlu", tmp_path)
    with pytest.raises(FileNotFoundError, match="no piqa_validation.jsonl"):
        resolve_tasks("piqa", tmp_path)
    assert resolve_tasks("none", tmp_path) == []
    write_jsonl(tmp_path / "piqa_validation.jsonl", [{"query": "q", "choices": ["a", "b"], "gold": 1}])
    assert resolve_tasks("piqa", tmp_path) == [("piqa", tmp_path / "piqa_validation.jsonl")]


def test_multiple_choice_metrics_follow_from_per_choice_scores(tmp_path):
    """Accuracy picks the lowest per-byte loss; the gold BPB and both standard errors match a hand computation."""
    model = build_model("learned")
    rows = [{"query": "def add(a, b):\n    return", "choices": ["a + b", "a - b", "None  # this is long"], "gold": 0},
            {"query": "import", "choices": [" torch", "numpy"], "gold": 1},
            {"query": "x =", "choices": ["1", "[1, 2]"], "gold": 1}]
    path = write_jsonl(tmp_path / "arc.jsonl", rows)
    examples = read_task("arc_easy", path)
    res = score_task(model, "arc_easy", examples, 64, BoundaryMode(), batch_size=3)
    gold_bpb, correct = [], []
    for i, ex in enumerate(examples):
        s = score_pairs(model, [(ex.context, c) for c in ex.choices], [i] * len(ex.choices), 64, BoundaryMode())
        bpb = [x.nll / math.log(2) / x.n_bytes for x in s]
        gold_bpb.append(bpb[ex.gold])
        correct.append(float(bpb.index(min(bpb)) == ex.gold))
    m = sum(gold_bpb) / 3
    assert res["n"] == 3 and res["bpb"] == pytest.approx(m, rel=1e-5)
    sd = math.sqrt(sum((g - m) ** 2 for g in gold_bpb) / 2)
    assert res["bpb_se"] == pytest.approx(sd / math.sqrt(3), rel=1e-4)
    assert res["acc"] == pytest.approx(sum(correct) / 3) and res["chance"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 2) / 3)


def test_successor_model_accuracy_and_lambada_exact_match(tmp_path):
    """A model preferring byte x+1 after x: the choice that follows that rule wins, and LAMBADA's exact match
    needs the continuation and then a word-ending byte."""
    model = patch_logits(build_model("learned"), successor_logits)
    mc = [{"query": "q", "choices": ['!"#$', "abcz", "zzzz"], "gold": g} for g in (0, 1, 2)]
    res = score_task(model, "piqa", read_task("piqa", write_jsonl(tmp_path / "p.jsonl", mc)), 64, BoundaryMode())
    assert res["acc"] == pytest.approx(1 / 3) and res["acc_se"] == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    lam = [{"context": "x)", "continuation": "*+,"},  # greedy after ',' is '-': spacelike, the word ends: exact
           {"context": "x`", "continuation": "abc"},  # greedy continues with 'd': the word is longer
           {"context": "x`", "continuation": "acd"}]  # not greedy at all
    examples = read_task("lambada", write_jsonl(tmp_path / "l.jsonl", lam))
    res = score_task(model, "lambada", examples, 64, BoundaryMode())
    assert res["acc"] == pytest.approx(1 / 3) and res["greedy_prefix"] == pytest.approx(2 / 3)
    # Strategies that are not exactly causal decode byte by byte instead; the answers agree.
    model.boundary.exactly_causal = False
    slow = score_task(model, "lambada", examples, 64, BoundaryMode())
    assert (slow["acc"], slow["greedy_prefix"]) == (res["acc"], res["greedy_prefix"])


def test_a_task_line_that_is_not_valid_unicode_names_its_line(tmp_path):
    path = tmp_path / "piqa.jsonl"
    path.write_text('{"query": "a", "choices": ["b", "c"], "gold": 0}\n{"query": "\\ud800", "choices": ["b", "c"], '
                    '"gold": 0}\n')
    with pytest.raises(DataError, match=r"piqa\.jsonl:2: text that is not valid Unicode"):
        read_task("piqa", path)


def test_a_task_named_twice_is_refused(tmp_path):
    """Both files were scored and the report kept the last one only."""
    with pytest.raises(ValueError, match="piqa named twice"):
        resolve_tasks(f"piqa={tmp_path / 'a.jsonl'},piqa={tmp_path / 'b.jsonl'}", None)
