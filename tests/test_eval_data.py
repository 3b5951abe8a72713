"""`learntok eval-data`: the conversion of each task's source rows (small local fixtures; no network), the
files and checksums fetch writes, verify, and the project's own task data reproduced exactly."""

from __future__ import annotations

import json
import lzma

import pytest

from learntok.cli import main
from learntok.evaluation import fetch
from learntok.evaluation.tasks import read_task, resolve_tasks

from .conftest import SHARED_DATA

ROWS = {
    "piqa": [{"goal": "Keep bread fresh", "sol1": "Seal it in a bag.", "sol2": "Leave it in the sun.", "label": 0}],
    "hellaswag": [{"activity_label": "Home", "ctx_a": "A man opens a door. [header] How to knock",
                   "ctx_b": "he", "endings": ["[title] Knock twice. [step] Wait.", "walks  away.", "sits.", "runs."],
                   "label": "1"}],
    "arc_easy": [{"question": "What melts ice?", "choices": {"text": ["heat", "cold", "salt water"],
                                                            "label": ["A", "B", "C"]}, "answerKey": "A"},
                 {"question": "2+2?", "choices": {"text": ["3", "4"], "label": ["1", "2"]}, "answerKey": "2"}],
    "lambada": [{"text": "She opened the door and saw her brother "}],
}
WANT = {
    "piqa": [{"query": "Goal: Keep bread fresh\nAnswer:", "choices": ["Seal it in a bag.", "Leave it in the sun."],
              "gold": 0}],
    "hellaswag": [{"query": "Home: A man opens a door. How to knock He",
                   "choices": [" Knock twice. Wait.", "walks away.", "sits.", "runs."], "gold": 1}],
    "arc_easy": [{"query": "Question: What melts ice?\nAnswer:", "choices": ["heat", "cold", "salt water"], "gold": 0},
                 {"query": "Question: 2+2?\nAnswer:", "choices": ["3", "4"], "gold": 1}],
    "lambada": [{"context": "She opened the door and saw her", "continuation": " brother"}],
}


@pytest.mark.parametrize("task", sorted(ROWS))
def test_conversion_of_each_task(task):
    assert [fetch.convert_row(task, r) for r in ROWS[task]] == WANT[task]


def test_a_malformed_row_is_one_clear_error():
    with pytest.raises(ValueError, match="piqa row 3: not a piqa row"):
        fetch.convert_row("piqa", {"goal": "x"}, "piqa row 3")
    with pytest.raises(ValueError, match="answerKey 'D'"):
        fetch.convert_row("arc_easy", {**ROWS["arc_easy"][0], "answerKey": "D"})
    with pytest.raises(ValueError, match="not an index"):
        fetch.convert_row("hellaswag", {**ROWS["hellaswag"][0], "label": "7"})


def test_fetch_writes_task_files_that_eval_reads_and_verify_checks(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "load_rows", lambda task: iter(ROWS[task]))
    assert main(["eval-data", "fetch", "--dir", str(tmp_path)]) == 0
    assert f"--task-dir {tmp_path}" in capsys.readouterr().out
    sums = json.loads((tmp_path / fetch.CHECKSUMS).read_text())
    assert sorted(sums) == sorted(ROWS) and all(e["reference"] is False for e in sums.values())  # not the real data
    for name, path in resolve_tasks("piqa,hellaswag,arc_easy,lambada", tmp_path):
        assert len(read_task(name, path)) == len(ROWS[name])
    assert main(["eval-data", "verify", "--dir", str(tmp_path)]) == 0
    with open(tmp_path / "piqa_validation.jsonl", "a") as f:  # negative control: a changed file is caught
        f.write("\n")
    assert main(["eval-data", "verify", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "piqa" in err and "checksum" in err and err.count("\n") == 1
    for damaged in ('{"piqa": "x"}', "[]"):  # a TypeError, and "no checksums.json", before
        (tmp_path / fetch.CHECKSUMS).write_text(damaged)
        assert main(["eval-data", "verify", "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "damaged" in err and "Traceback" not in err


def test_fetch_failures_are_one_line(tmp_path, monkeypatch, capsys):
    def offline(task):
        raise ConnectionError("Failed to resolve 'huggingface.co'")

    monkeypatch.setattr(fetch, "load_rows", offline)
    assert main(["eval-data", "fetch", "--dir", str(tmp_path), "--tasks", "piqa"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # a progress line, then the error
    assert err[-1].startswith("learntok: error: piqa: could not load baber/piqa (Failed to resolve")
    assert "Traceback" not in "\n".join(err) and len(err) == 2
    assert main(["eval-data", "fetch", "--dir", str(tmp_path), "--tasks", "winogrande"]) == 2
    assert "unknown task 'winogrande'" in capsys.readouterr().err
    assert main(["eval-data", "verify", "--dir", str(tmp_path / "none")]) == 2
    assert "run learntok eval-data fetch" in capsys.readouterr().err


def test_eval_without_task_data_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LEARNTOK_EVAL_DIR", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="learntok eval-data fetch"):
        resolve_tasks("piqa", None)


def _raw(task: str, d: dict) -> dict:
    """The project's task files keep each source row's raw fields beside the OLMES ones: back to the Hub's shape."""
    if task == "piqa":
        return {k: d[k] for k in ("goal", "sol1", "sol2", "label")}
    if task == "hellaswag":
        return {k: d[k] for k in ("activity_label", "ctx_a", "ctx_b", "endings")} | {"label": str(d["label"])}
    if task == "arc_easy":
        n = len(d["choices"])
        labels = [str(i + 1) for i in range(n)] if d["answerKey"].isdigit() else [chr(65 + i) for i in range(n)]
        return {"question": d["question"], "choices": {"text": d["choices"], "label": labels},
                "answerKey": d["answerKey"]}
    return {"text": d["text"]}


@pytest.mark.skipif(not (SHARED_DATA / "eval").is_dir(), reason="the project's task data is not beside the repo")
@pytest.mark.parametrize("task", sorted(fetch.SOURCES))
def test_conversion_reproduces_the_task_data_of_the_results(task, tmp_path):
    from learntok.evaluation.tasks import TASKS

    path = SHARED_DATA / "eval" / (TASKS[task].filename + ".xz")
    rows = [json.loads(line) for line in lzma.open(path, "rt", encoding="utf-8")]
    raw = [_raw(task, d) for d in rows]
    for i, (r, d) in enumerate(zip(raw, rows)):
        got = fetch.convert_row(task, r)
        assert got == {k: d[k] for k in got}, i
    assert fetch.write_task(task, raw, tmp_path)["sha256"] == fetch.REFERENCE_SHA256[task]
