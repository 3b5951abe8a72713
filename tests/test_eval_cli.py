"""`learntok eval` and `learntok compare` end to end on 2-step runs: eval.json round trip, the printed table,
boundary modes, error messages, and the compare tables with the best per column marked."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest
import torch

from learntok.boundaries import boundary_config
from learntok.cli.evaluate import cmd_compare, cmd_eval
from learntok.evaluation.compare import compare
from learntok.evaluation.report import EVAL_VERSION, read_eval, write_eval
from learntok.train import train

from .conftest import SHARED_DATA, tiny_train_config


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """train/valid/test text files (real text: PyTorch's own source)."""
    d = tmp_path_factory.mktemp("evalcorpus")
    lines = Path(torch.__file__).read_text(encoding="utf-8").splitlines()
    for split, (a, b) in {"train": (0, 1200), "valid": (1200, 1400), "test": (1400, 1600)}.items():
        (d / split).mkdir()
        for i in range(a, b, 100):
            (d / split / f"{i}.txt").write_text("\n".join(lines[i:i + 100]) + "\n")
    return d


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in ("learned", "whitespace"):
        cfg = tiny_train_config(tmp_path_factory.mktemp("runs") / name, corpus, max_steps=2,
                                boundary=boundary_config(name))
        train(cfg, log=lambda s: None)
        out[name] = Path(cfg.out)
    return out


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """The shipped task files if present, else tiny stand-ins in the same formats."""
    if (SHARED_DATA / "eval").is_dir():
        return SHARED_DATA / "eval"
    d = tmp_path_factory.mktemp("tasks")
    mc = json.dumps({"query": "Question: 2+2?\nAnswer:", "choices": ["4", "5", "22"], "gold": 0})
    for name in ("piqa_validation", "hellaswag_validation", "arc_easy_test"):
        (d / f"{name}.jsonl").write_text((mc + "\n") * 4)
    (d / "lambada_openai_test.jsonl").write_text(json.dumps({"context": "a b c", "continuation": " d"}) + "\n")
    return d


def test_eval_writes_report_and_prints_table(runs, task_dir, capsys):
    run = runs["learned"]
    assert cmd_eval([str(run), "--limit", "3", "--task-dir", str(task_dir), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    rep = read_eval(run / "eval.json")
    assert rep["eval_version"] == EVAL_VERSION and rep["limit"] == 3 and rep["boundaries"] == "learned"
    assert set(rep["tasks"]) == {"piqa", "hellaswag", "arc_easy", "lambada"}
    assert all(r["n"] <= 3 for r in rep["tasks"].values())
    h = rep["heldout"]
    assert h["sequences"] == 3 and h["split"] == "val" and 0 < h["bpb"] < 9 and h["bpb_se"] > 0
    s = rep["boundary_stats"]
    assert 0 < s["rate"] < 1 and s["neg_log_pi"] > 0 and "whitespace" in s["agreement"]
    assert rep["flops"]["per_byte"] > 0 and rep["checkpoint"].endswith("step_000002")
    for text in ("one boundary sample per text, seed 1234", "PIQA", "held-out BPB", "vs whitespace",
                 "inference FLOPs per byte", str(run / "eval.json")):
        assert text in printed


def test_eval_of_some_tasks_adds_to_eval_json_and_an_interrupted_eval_keeps_what_finished(runs, task_dir, tmp_path,
                                                                                          monkeypatch):
    """`eval RUN --tasks hellaswag` used to replace eval.json (the other tasks vanished from it and from compare),
    and Ctrl-C threw away tasks that had finished."""
    import learntok.evaluation.report as report

    run, out = runs["learned"], tmp_path / "e.json"
    base = [str(run), "--limit", "2", "--task-dir", str(task_dir), "--no-progress", "--out", str(out)]
    assert cmd_eval([*base, "--tasks", "piqa", "--no-heldout"]) == 0
    assert cmd_eval([*base, "--tasks", "hellaswag"]) == 0
    rep = read_eval(out)
    assert set(rep["tasks"]) == {"piqa", "hellaswag"} and rep["heldout"]["bpb"] > 0
    # another limit is another evaluation: it replaces the file
    assert cmd_eval([str(run), "--limit", "1", "--task-dir", str(task_dir), "--no-progress", "--out", str(out),
                     "--tasks", "arc_easy", "--no-heldout"]) == 0
    assert set(read_eval(out)["tasks"]) == {"arc_easy"}
    out.unlink()
    real = report.score_task

    def interrupted(model, name, *a, **kw):
        if name == "hellaswag":
            raise KeyboardInterrupt
        return real(model, name, *a, **kw)

    monkeypatch.setattr(report, "score_task", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cmd_eval([*base, "--tasks", "piqa,hellaswag"])
    assert set(read_eval(out)["tasks"]) == {"piqa"}


def test_eval_round_trip_and_version_check(runs, tmp_path):
    rep = {"eval_version": EVAL_VERSION, "tasks": {}, "x": [1.5, None], "nan": float("nan")}
    path = write_eval(tmp_path / "e.json", rep)
    back = read_eval(path)
    assert back == {**rep, "nan": None}  # non-finite numbers are written as null (standard JSON)
    (tmp_path / "old.json").write_text(json.dumps({"eval_version": 0}))
    with pytest.raises(ValueError, match="version 0 is not supported"):
        read_eval(tmp_path / "old.json")
    with pytest.raises(FileNotFoundError, match="run `learntok eval` first"):
        read_eval(tmp_path / "missing.json")


def test_eval_modes_splits_and_data(runs, corpus, tmp_path, capsys):
    run = runs["learned"]
    base = [str(run), "--tasks", "none", "--max-bytes", str(64 * 3), "--no-progress"]
    assert cmd_eval(base + ["--boundaries-mode", "greedy", "--out", str(tmp_path / "g.json")]) == 0
    assert "greedy boundaries (p > 0.5)" in read_eval(tmp_path / "g.json")["mode"]["description"]
    assert cmd_eval(base + ["--boundaries-mode", "average", "--samples", "2", "--out", str(tmp_path / "a.json")]) == 0
    a = read_eval(tmp_path / "a.json")
    assert a["mode"]["samples"] == 2 and a["heldout"]["bpb"] <= a["heldout"]["bpb_mean_over_samples"]
    assert cmd_eval(base + ["--split", "test", "--out", str(tmp_path / "t.json")]) == 0
    assert read_eval(tmp_path / "t.json")["heldout"]["data"].endswith("(test)")
    assert cmd_eval(base + ["--data", str(corpus / "train"), "--out", str(tmp_path / "d.json")]) == 0
    assert read_eval(tmp_path / "d.json")["heldout"]["data"] == str(corpus / "train")
    # A checkpoint directory works too, and whitespace boundaries print as prescribed.
    ckpt = next(runs["whitespace"].glob("step_*"))
    assert cmd_eval([str(ckpt), "--tasks", "none", "--limit", "2", "--no-progress",
                     "--out", str(tmp_path / "w.json")]) == 0
    w = read_eval(tmp_path / "w.json")
    assert w["boundary_stats"]["agreement"]["whitespace"]["f1"] == 1.0 and "prescribed" in w["mode"]["description"]
    assert w["stability"]["shift"]["flip_rate"] == 0  # a rule on the bytes does not move with the text start
    assert "boundary stability" in capsys.readouterr().out


def test_eval_errors(runs, tmp_path):
    run = str(runs["learned"])
    with pytest.raises(FileNotFoundError, match="not a learntok run"):
        cmd_eval([str(tmp_path), "--no-progress"])
    with pytest.raises(ValueError, match="unknown task 'squad'"):
        cmd_eval([run, "--tasks", "squad", "--no-progress"])
    with pytest.raises(ValueError, match="invalid choice 'best'"):
        cmd_eval([run, "--boundaries-mode", "best"])
    with pytest.raises(ValueError, match="--samples must be"):
        cmd_eval([run, "--boundaries-mode", "average", "--samples", "1", "--tasks", "none"])
    with pytest.raises(FileNotFoundError, match="--bpe-tokenizer .*no such file"):
        cmd_eval([run, "--tasks", "none", "--bpe-tokenizer", str(tmp_path / "nope.json"), "--limit", "1",
                  "--no-progress"])


def _variant(run: Path, dest: Path, **changes) -> Path:
    """A copy of an evaluated run with some numbers changed."""
    dest.mkdir()
    (dest / "config.json").write_text((run / "config.json").read_text())
    rep = copy.deepcopy(read_eval(run / "eval.json"))
    for path, value in changes.items():
        node = rep
        *keys, last = path.split("__")
        for k in keys:
            node = node[k]
        node[last] = value
    write_eval(dest / "eval.json", rep)
    return dest


def test_compare_writes_tables_and_marks_the_best(runs, task_dir, tmp_path, capsys):
    if not (runs["learned"] / "eval.json").exists():
        cmd_eval([str(runs["learned"]), "--limit", "3", "--task-dir", str(task_dir), "--no-progress"])
    # A's PIQA accuracy is set: a tiny model's own accuracy on 3 examples can be 0, which would tie with B's.
    a = _variant(runs["learned"], tmp_path / "runA", tasks__piqa__acc=0.9)
    b = _variant(a, tmp_path / "runB", tasks__piqa__bpb=0.5, tasks__piqa__acc=0.0, heldout__bpb=99.0)
    c = _variant(a, tmp_path / "runC", tasks__piqa__bpb=0.5, tasks__piqa__acc=0.0, heldout__bpb=99.0)
    assert cmd_compare([str(a), str(b), str(c), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert md == capsys.readouterr().out.split("written:")[0].rstrip("\n") + "\n"
    row_a = next(ln for ln in md.splitlines() if ln.startswith(f"| {a.name} |"))
    row_b = next(ln for ln in md.splitlines() if ln.startswith("| runB |"))
    cells_a, cells_b = row_a.split("|")[3:-1], row_b.split("|")[3:-1]
    assert "**0.500" in cells_b[0] and "**" not in cells_a[0]  # PIQA BPB: lower is better; ties (B, C) both bold
    assert "**" in cells_a[4] and "**" not in cells_b[4]  # held-out BPB
    assert "**" in cells_a[5] and "**" not in cells_b[5]  # PIQA accuracy: higher is better
    assert "learned (w=8)" in row_a and "Table 3" in md and md.count("| runB |") == 2  # one row in each table
    with open(tmp_path / "cmp" / "table1.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == [a.name, "runB", "runC"] and float(rows[1]["piqa_bpb"]) == 0.5
    assert "piqa_bpb" in rows[1]["best_in"].split(";") and "heldout_bpb" in rows[0]["best_in"].split(";")
    with open(tmp_path / "cmp" / "table3.csv") as f:
        t3 = list(csv.DictReader(f))
    assert float(t3[0]["rate"]) == pytest.approx(read_eval(a / "eval.json")["boundary_stats"]["rate"])
    assert "--limit" in md  # partial evaluations are flagged
    with pytest.raises(FileNotFoundError, match="run `learntok eval` first"):
        compare([tmp_path / "cmp"], tmp_path / "x")


def test_compare_notes_runs_not_measured_alike(runs, task_dir, tmp_path, capsys):
    """Other bytes of the same held-out text, another number of task examples, another asked rate: each is a note
    beside the table (they were set side by side silently)."""
    if not (runs["learned"] / "eval.json").exists():
        cmd_eval([str(runs["learned"]), "--limit", "3", "--task-dir", str(task_dir), "--no-progress"])
    a = _variant(runs["learned"], tmp_path / "runA")
    b = _variant(a, tmp_path / "runB", heldout__bytes=999, heldout__first_sequence=7, tasks__piqa__n=50,
                 asked_rate=0.3)
    assert cmd_compare([str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "different bytes of the text" in md and "runB: 999 bytes from sequence 7" in md
    assert "piqa was scored on different numbers of examples" in md and "different boundary rates" in md
    assert cmd_compare([str(a), str(_variant(a, tmp_path / "runC")), "--out", str(tmp_path / "same")]) == 0
    assert "different" not in (tmp_path / "same" / "comparison.md").read_text()  # alike: no note


def test_skip_bytes_scores_later_text_exactly_as_a_full_pass_scores_it(runs, capsys):
    """--skip-bytes leaves out the first sequences without changing how the rest are scored (the boundary noise
    is keyed on a sequence's index in the split): the bits of sequences 2-3 scored after skipping two equal
    those of sequences 0-3 minus those of 0-1. Per-document bits add up to the whole."""
    from learntok.checkpoint import load_run
    from learntok.data import ByteSequences, load_split
    from learntok.evaluation.bpb import BoundaryMode, heldout_bpb

    cfg, model = load_run(runs["learned"])
    L = cfg.data.seq_len
    seqs = ByteSequences(load_split(cfg.data, "val")[1], L)

    def bits(**kw):
        r = heldout_bpb(model, seqs, BoundaryMode(), per_document=True, **kw)
        docs = r["per_document"]
        assert sum(docs["bytes"]) == r["bytes"] and docs["documents"] == sorted(docs["documents"])
        assert sum(docs["bits"]) == pytest.approx(r["bpb"] * r["bytes"], rel=1e-6)  # float32 sums
        return r["bpb"] * r["bytes"], r

    whole, _ = bits(max_bytes=4 * L)
    head, _ = bits(max_bytes=2 * L)
    tail, r = bits(max_bytes=2 * L, skip_bytes=2 * L - 5)  # rounded up to whole sequences: two
    assert r["first_sequence"] == 2 and r["sequences"] == 2
    assert tail == pytest.approx(whole - head, rel=1e-6)
    with pytest.raises(ValueError, match="leaves no sequence"):
        heldout_bpb(model, seqs, BoundaryMode(), skip_bytes=len(seqs) * L)
    with pytest.raises(ValueError, match="one boundary draw"):
        heldout_bpb(model, seqs, BoundaryMode("average", 2), per_document=True)
    from learntok.cli import main

    for args, msg in ((["--skip-bytes", str(10**9)], "leaves no sequence"),
                      (["--per-document", "--boundaries-mode", "average"], "needs one boundary draw")):
        assert main(["eval", str(runs["learned"]), "--tasks", "none", "--no-progress", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err


def test_compare_paired_bootstraps_the_difference_over_documents(runs, tmp_path, capsys):
    """`eval --per-document` on the same text, then `compare --paired A B`: the difference of the two held-out
    BPBs, an interval around it, paired.json; runs scored on different bytes or without per-document scores
    are refused with a message."""
    from learntok.cli import main

    base = ["--tasks", "none", "--no-progress", "--per-document", "--split", "test", "--by-class"]  # two documents
    paths = {}
    for name, run in runs.items():
        paths[name] = tmp_path / f"{name}.json"
        assert cmd_eval([str(run), *base, "--out", str(paths[name])]) == 0
    out = capsys.readouterr().out
    assert out.count("by byte class: word start ") == out.count("on a token's first byte | the rest: word start") == 2
    assert cmd_compare([str(paths["learned"]), str(paths["whitespace"]), "--paired", "--out", str(tmp_path)]) == 0
    line, *per_class = capsys.readouterr().out.splitlines()
    assert [c.split()[0] for c in per_class[:4]] == ["word", "word", "space", "punctuation"]
    assert all(" of them (A / B)" in c for c in per_class[:4])  # where each run's tokens begin
    p = json.loads((tmp_path / "paired.json").read_text())
    a, b = (read_eval(paths[n])["heldout"] for n in ("learned", "whitespace"))
    assert p["mean"] == pytest.approx(a["bpb"] - b["bpb"], abs=1e-6) and p["lo"] <= p["mean"] <= p["hi"]
    # two documents: too few to resample, so the units are the held-out sequences
    assert len(a["per_document"]["documents"]) == 2 and (p["unit"], p["units"]) == ("sequences", a["sequences"])
    assert f"paired bootstrap over {a['sequences']} sequences" in line
    assert [c["class"] for c in p["by_class"]] == ["word start", "word inside", "space", "punctuation"]
    assert sum(c["contribution"] for c in p["by_class"]) == pytest.approx(p["mean"], abs=1e-6)  # where A − B lies
    # Different bytes, no per-document scores, or not two runs: exit 2 with one line.
    assert cmd_eval([str(runs["whitespace"]), *base, "--skip-bytes", "64", "--out", str(tmp_path / "s.json")]) == 0
    assert cmd_eval([str(runs["whitespace"]), "--tasks", "none", "--max-bytes", "384", "--no-progress",
                     "--split", "test", "--out", str(tmp_path / "n.json")]) == 0
    capsys.readouterr()
    for args, msg in (([paths["learned"], tmp_path / "s.json"], "scored different held-out bytes"),
                      ([paths["learned"], tmp_path / "n.json"], "no per-document scores"),
                      ([paths["learned"]], "exactly two runs")):
        assert main(["compare", *map(str, args), "--paired", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
    diverged = json.loads(paths["whitespace"].read_text())  # a diverged run's held-out BPB is written as null
    diverged["heldout"]["bpb"] = None
    (tmp_path / "d.json").write_text(json.dumps(diverged))
    assert main(["compare", str(paths["learned"]), str(tmp_path / "d.json"), "--paired", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not finite" in err and "Traceback" not in err
