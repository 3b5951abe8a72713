"""The comparison experiments' machinery (experiments/arms.py, experiments/leaderboard): FLOPs matching of the arms,
paired statistics, the tables, and one resumable two-arm run end to end."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import subprocess
import sys
import types
from pathlib import Path
from unittest.mock import ANY

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import arms  # noqa: E402

from learntok import records  # noqa: E402
from learntok.evaluation.stats import t_quantile  # noqa: E402


def test_flops_matched_baselines_cost_what_the_u_net_costs_per_byte():
    """flat and bpe-lm are sized so that a byte costs about what it costs the U-Net (within 10 %): the leaderboard
    gives each arm the bytes of the same FLOPs, so a badly sized baseline would see far more or fewer bytes."""
    uniform = arms.flops_per_byte("uniform", 0.2)
    for name in ("flat", "bpe-lm", "learned", "hnet", "dynamic"):
        assert arms.flops_per_byte(name, 0.2) == pytest.approx(uniform, rel=0.10), name
    assert arms.flops_per_byte("learned", 0.3) > arms.flops_per_byte("learned", 0.2)  # tokens cost per token


def _rows(arm: str, bpbs: list[float], budget: float = 1e12) -> list[dict]:
    return [{"arm": arm, "seed": s, "match": "flops", "flops_budget": budget, "budget_bytes": 1e6, "bytes": 1e6,
             "flops": budget, "train_seconds": 10.0, "curve": [],
             **{split: {"bpb": b, "f1": 0.5, "rate": 0.2} for split in ("val", "test")}} for s, b in enumerate(bpbs)]


def test_paired_differences_use_seeds_as_pairs_and_say_tie_when_the_interval_covers_zero():
    base = _rows("uniform", [2.00, 2.10, 2.20])
    better = _rows("learned", [1.98, 2.08, 2.17])  # 0.02, 0.02, 0.03 better: consistent, so significant
    noisy = _rows("noisy", [1.90, 2.15, 2.20])  # +0.10, -0.05, 0.00: mean +0.017, interval covers 0
    rows = base + better + noisy
    assert arms.paired(rows, "learned", "uniform").endswith("learned better (3 seeds)")
    assert arms.paired(rows, "uniform", "learned").endswith("learned better (3 seeds)")  # names the winner
    assert arms.paired(rows, "learned", "uniform").startswith("+0.0233 [")
    assert "tie" in arms.paired(rows, "noisy", "uniform")
    assert arms.paired(rows, "uniform", "learned").startswith("-0.0233")
    assert arms.paired(base + _rows("one", [1.9]), "one", "uniform") == "+0.1000 (1 seed)"
    # half width = t(2) * sd / sqrt(3) with t(2) = 4.303
    lo = float(arms.paired(rows, "learned", "uniform").split("[")[1].split(",")[0])
    assert lo == pytest.approx(0.0233 - 4.303 * 0.005774 / 3 ** 0.5, abs=2e-4)


def test_tables_group_by_budget_and_read_old_results():
    results = {"data": "x", "arms": _rows("uniform", [2.0, 2.1]) + _rows("learned", [1.9, 2.0])
               + _rows("uniform", [1.8, 1.9], budget=4e12)}
    results["arms"].append({**_rows("learned", [1.5])[0], "match": "time", "time_budget": 600.0})
    legacy = {k: v for k, v in _rows("uniform", [2.2])[0].items() if k not in ("match", "flops_budget")}
    results["arms"].append({**legacy, "seed": 7})
    results["flops_budget"] = 1e12  # what results.json held before budgets were per row
    text = arms.table(results, bases=("uniform",), against="learned")
    assert text.count("Matched FLOPs: 1e+12") == 1 and "Matched FLOPs: 4e+12" in text
    assert "Matched time: 600 s" in text
    assert "| uniform | 3 | 2.1000 ± 0.0577 |" in text  # the legacy row joins its budget
    assert "| learned | +0.1000 (1 seed) |" not in text and "| learned | " in text


@pytest.mark.slow
def test_leaderboard_runs_resumes_and_reports(tmp_path, text_corpus, monkeypatch):
    """Two arms train (a few steps of --preset small) and are evaluated on validation and test; a second call
    trains nothing; an arm interrupted after a checkpoint resumes from it; report writes the table and plot."""
    spec = importlib.util.spec_from_file_location("leaderboard_run", Path(arms.__file__).parent / "leaderboard/run.py")
    leaderboard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(leaderboard)

    (text_corpus / "test").mkdir()
    (text_corpus / "test" / "0.txt").write_text((text_corpus / "valid" / "0.txt").read_text()[::-1])
    monkeypatch.setattr(arms, "EVAL_BYTES", 2048)
    out = tmp_path / "lb"
    record = tmp_path / "kept" / "lb.jsonl"  # the records file apart from the run directories (--results)
    kw = dict(study="lb", rate=0.2, budget_bytes=3 * 4096, reference=arms.spacebyte, results_path=record)
    res = arms.run_arms(out, text_corpus, ["uniform", "learned"], [0], **kw)
    assert [(r["arm"], r["seed"]) for r in res["arms"]] == [("uniform", 0), ("learned", 0)]
    assert not (out / "records.jsonl").exists()
    for r in res["arms"]:  # full records: the command, the run's config and provenance, the measurements
        assert r["study"] == "lb" and r["source"] == "measured" and r["command"].startswith("learntok train")
        assert r["provenance"]["git_sha"] and "git_dirty" in r["provenance"] and r["config"]["seed"] == 0
        assert r["flops"] == pytest.approx(r["flops_budget"], rel=0.5) and r["test"]["bpb"] > 0
        assert r["val"]["bpb"] != r["test"]["bpb"]
    stamp = record.stat().st_mtime_ns
    assert arms.run_arms(out, text_corpus, ["uniform", "learned"], [0], **kw) == res
    assert record.stat().st_mtime_ns == stamp  # nothing retrained
    with pytest.raises(ValueError, match="not .*other"):  # results on other data are never mixed in
        arms.run_arms(out, tmp_path / "other", ["uniform"], [0], **kw)

    # an interrupted arm: a checkpoint but no result; run_arms continues it instead of starting over
    # (a dotted name, as a budget like 2.4e+07 gives: the log is NAME.log, not a with_suffix mangling of it)
    assert (out / "uniform-12288-seed0.log").exists()
    part = out / "part-2.4e+07"
    done = arms.train_arm(part, text_corpus, "uniform", rate=0.2, seed=1, max_bytes=2 * 4096, ckpt_every=1)
    log = (out / "part-2.4e+07.log").read_text()
    again = arms.train_arm(part, text_corpus, "uniform", rate=0.2, seed=1, max_bytes=2 * 4096)
    assert "resum" in (out / "part-2.4e+07.log").read_text()[len(log):].lower()
    assert again["bytes"] == done["bytes"]

    monkeypatch.setattr(sys, "argv", ["run.py", "report", "--out", str(out), "--results", str(record)])
    leaderboard.main()
    md = (out / "results.md").read_text()
    assert "| learned | 1 |" in md and "Ranking by test BPB" in md
    assert (out / "leaderboard.png").stat().st_size > 10_000
    assert records.load(record) == res["arms"]


def test_headline_reports_a_declared_seed_set_only_when_it_is_complete(capsys, monkeypatch, tmp_path):
    """The pair's seeds 10-13 come from the transcribed file, later ones from the record; a seed set declared in
    advance is summarised only once all its seeds have run (no peeking at a growing interval)."""
    spec = importlib.util.spec_from_file_location("leaderboard_run", Path(arms.__file__).parent / "leaderboard/run.py")
    leaderboard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(leaderboard)

    def row(arm, seed, test, val, budget=2.4e7):
        return {"arm": arm, "seed": seed, "match": "flops", "budget_bytes": budget, "test": {"bpb": test},
                "val": {"bpb": val}}

    transcribed = [{**row("learned-w1-vb", 10, 2.0, None), "val_difference": -0.1}, row("uniform", 10, 2.1, None)]
    results = {"arms": [*transcribed, row("learned-w1-vb", 14, 2.0, 2.2), row("uniform", 14, 2.05, 2.2),
                        row("learned-w1-vb", 15, 2.0, 2.2),  # its pair is not finished: no difference yet
                        row("uniform", 16, 2.0, 2.0, budget=6e6), row("learned-w1-vb", 16, 1.0, 1.0, budget=6e6)]}
    pairs = leaderboard.headline_pairs(results)
    assert list(pairs) == [10, 14]
    assert pairs[10] == (pytest.approx(-0.1), -0.1) and pairs[14] == (pytest.approx(-0.05), pytest.approx(0.0))

    # the committed records (seeds 10-13 transcribed) give the documented five-seed result (docs/results.md)
    record = Path(arms.__file__).parent / "leaderboard" / "records.jsonl"
    monkeypatch.setattr(sys, "argv", ["run.py", "headline", "--results", str(record)])
    leaderboard.main()
    out = capsys.readouterr().out
    assert "(seeds 10-14): test -0.0221 [-0.0552, +0.0111] tie, t = 1.85" in out

    # a complete extension (seeds 14-18 made up here) adds the 9-seed set, its two-look (97.5 %) interval and the
    # replication by the new seeds 15-18 alone, each from its own seeds' differences
    committed = arms.load_results(record)["arms"]
    kept = [r for r in committed if r["source"] == "transcribed"]
    made_up = {14: -0.011, 15: -0.032, 16: +0.013, 17: -0.047, 18: -0.023}
    fresh = [records.make("lb", a, seed, command="x", prov={"git_sha": "0" * 40}, match="flops", budget_bytes=2.4e7,
                          test={"bpb": 2.0 + d * (a != "uniform")}, val={"bpb": 2.0})
             for seed, d in made_up.items() for a in ("learned-w1-vb", "uniform")]
    path = tmp_path / "records.jsonl"
    records.write(path, kept + fresh)
    monkeypatch.setattr(sys, "argv", ["run.py", "headline", "--results", str(path)])
    leaderboard.main()
    lines = capsys.readouterr().out.splitlines()
    test = {(r["arm"], r["seed"]): r["test"]["bpb"] for r in kept}
    nine = [test["learned-w1-vb", s] - test["uniform", s] for s in range(10, 14)] + list(made_up.values())

    def expected(d, level):
        m, se = statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))
        t = t_quantile(level, len(d) - 1)
        return f"test {m:+.4f} [{m - t * se:+.4f}, {m + t * se:+.4f}]"

    extension = next(i for i, line in enumerate(lines) if "(seeds 10-18)" in line)
    assert expected(nine, 0.95) in lines[extension]
    assert "97.5 %" in lines[extension + 1] and expected(nine, 0.975) in lines[extension + 1]
    assert "(15-18, a replication)" in lines[extension + 2] and expected(nine[5:], 0.95) in lines[extension + 2]


def _allocation():
    spec = importlib.util.spec_from_file_location("allocation_run", Path(arms.__file__).parent / "allocation/run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_allocation_budget_flags_best_cell_and_report(tmp_path, monkeypatch, capsys):
    """experiments/allocation: the budget is the total FLOPs (6N plus attention) of uniform's bytes; a method's
    flags carry its rate unless the allocation or a sweep axis sets it; the best cell is the lowest mean validation
    BPB over seeds; the report pairs by seed and bootstraps documents, and refuses to pair different text."""
    alloc = _allocation()
    six_n = alloc.BUDGET_BYTES * arms.flops_per_byte("uniform", 0.2)
    assert six_n < alloc.budget() < 1.1 * six_n and alloc.budget(4) == pytest.approx(4 * alloc.budget())
    assert alloc._flags("learned")[-2:] == ["--target-rate", "0.2"]
    assert "--target-rate" not in alloc._flags("learned", rate=False) + alloc._flags("flat")
    assert alloc._flags("uniform", {"target-rate": "0.25"}).count("--target-rate") == 1

    def cell(axes, seed, bpb):
        return records.make("sweep", "cell", seed, command="x", axes=axes, val_bpb=bpb)

    assert len(alloc._axes("learned", 1)) == 2 and alloc._axes("flat", 2) == []
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else [])
    d = tmp_path / "sweep1-uniform"
    d.mkdir()
    records.write(d / "sweep.jsonl", [cell({"n-mid": "2"}, 0, 2.0), cell({"n-mid": "2"}, 1, 2.4)])
    with pytest.raises(SystemExit, match="stage 1 has 1 of 2 cells"):  # its best so far could still change
        alloc.allocation(tmp_path, "uniform")
    capsys.readouterr()
    alloc.cmd_best(types.SimpleNamespace(out=tmp_path))  # names the unfinished sweep and lists the other methods
    out = capsys.readouterr().out
    assert "uniform: stage 1 has 1 of 2 cells" in out and "\nflat: " in out and "learned: " in out
    records.write(d / "sweep.jsonl", [*records.load(d / "sweep.jsonl"), cell({"n-mid": "3"}, 0, 2.1),
                                      cell({"n-mid": "3"}, 1, 2.2)])
    assert alloc.allocation(tmp_path, "uniform") == {"n-mid": "3"}  # mean 2.15 beats 2.2
    assert alloc.allocation(tmp_path, "flat") == {}

    def final(arm, seed, bpb, bits):
        test = {"bpb": bpb, "bytes": 300, "per_document": {"documents": [0, 1, 2], "bits": bits,
                                                            "bytes": [100, 100, 100]}}
        return records.make("allocation", arm, seed, command="x",
                            budget={"scale": 1.0, "match": "flops-total", "flops_budget": 1.7e13},
                            test=test, val={"bpb": bpb}, train_seconds=1.0, flops_total=1e9)

    path = tmp_path / "records.jsonl"
    records.write(path, [final("flat", s, 2.0 + s / 10, [200 + 10 * s] * 3) for s in range(3)]
                  + [final("uniform", s, 1.9 + s / 10, [190 + 10 * s, 190 + 10 * s, 190 + 10 * s]) for s in range(3)])
    table = alloc.report(path)
    row = next(line for line in table.splitlines() if line.startswith("| uniform |"))
    assert "-0.1000 [-0.1000, -0.1000]" in row and "tie" not in row  # every seed and document 0.1 better
    records.write(path, [*records.load(path), *[final("learned", s, 1.85 + s / 10, [185 + 10 * s] * 3)
                                                for s in range(3)]])
    row = next(line for line in alloc.report(path).splitlines() if line.startswith("| uniform |"))
    assert row.endswith("| -0.0500 [-0.0500, -0.0500] | -0.0500 [-0.0500, -0.0500] |")  # learned − uniform
    records.write(path, [*records.load(path)[:3], *[final("uniform", s, 1.9, [1.0, 2.0, 3.0]) for s in range(3)]])
    bad = records.load(path)
    bad[-1]["test"]["per_document"]["documents"] = [0, 1, 5]
    records.write(path, bad)
    assert "(different text)" in alloc.report(path)


def test_allocation_final_clock_matches_the_flat_arm_with_the_same_embeddings(tmp_path, monkeypatch):
    """`final --clock` trains an n-gram arm for flat-ngrams' median seconds (not plain flat's) and records which
    arm set the clock, trains that reference again for them too, `--arms` trains only the arms named, and a
    finished run is skipped."""
    alloc = _allocation()
    for arm, secs in (("flat", 50.0), ("flat-ngrams", 100.0)):
        run = alloc._run_dir(tmp_path, arm, 1.0, False, 0)
        run.mkdir()
        (run / "final.json").write_text(json.dumps({"train_seconds": secs, "flags": []}))
    calls = []

    def train_arm(run, data, method, **kw):
        calls.append((run.name, kw))
        return {"bytes": 1.0, "train_seconds": kw.get("time_budget", 1.0), "command": "x", "provenance": {}}

    monkeypatch.setattr(alloc.arms, "train_arm", train_arm)
    args = ["final", "--data", str(tmp_path), "--out", str(tmp_path), "--seeds", "0", "--clock", "--ngrams",
            "--arms", "learned-ngrams", "learned", "flat-ngrams"]
    monkeypatch.setattr(sys, "argv", ["run.py", *args])
    alloc.main()
    done = json.loads((alloc._run_dir(tmp_path, "learned-ngrams", 1.0, True, 0) / "final.json").read_text())
    assert done["budget"] == {"scale": 1.0, "match": "time", "time_budget": 100.0, "reference": "flat-ngrams"}
    assert sorted(calls) == [("final-flat-ngrams-x1-clock-seed0", {"rate": 0.2, "seed": 0, "flags": ANY,
                                                                    "time_budget": 100.0}),
                             ("final-learned-ngrams-x1-clock-seed0", {"rate": 0.2, "seed": 0, "flags": ANY,
                                                                       "time_budget": 100.0}),
                             ("final-learned-x1-clock-seed0", {"rate": 0.2, "seed": 0, "flags": ANY,
                                                               "time_budget": 50.0})]
    alloc.main()  # all finished: nothing trains again
    assert len(calls) == 3
    monkeypatch.setattr(sys, "argv", ["run.py", *args[:-3], "learned-ngrams", "bpe-lm-ngrams", "--series", "b2"])
    alloc.main()  # a new series trains learned-ngrams again, beside the arm it is now paired with
    assert [c[0] for c in calls[3:]] == ["final-learned-ngrams-x1-clock-b2-seed0",
                                         "final-bpe-lm-ngrams-x1-clock-b2-seed0"]
    done = json.loads((alloc._run_dir(tmp_path, "bpe-lm-ngrams", 1.0, True, 0, "b2") / "final.json").read_text())
    assert done["budget"]["series"] == "b2" and done["budget"]["time_budget"] == 100.0
    for bad in (["--series", "b2"], ["--clock", "--series", "b/2"]):  # needs --clock; a name fit for a directory
        monkeypatch.setattr(sys, "argv", ["run.py", "final", "--data", str(tmp_path), "--out", str(tmp_path), *bad])
        with pytest.raises(SystemExit, match="--series"):
            alloc.main()
    base = ["run.py", "final", "--data", str(tmp_path), "--out", str(tmp_path), "--seeds", "0", "--arms", "flat"]
    monkeypatch.setattr(sys, "argv", [*base, "--convention", "6n", "--budget-bytes", "2e4"])
    alloc.main()  # the accounting lever's control: the budget matched in the paper's 6N, in a directory of its own
    assert calls[-1][0] == "final-flat-x1-6n-seed0" and calls[-1][1]["flops_convention"] == "6n"
    assert calls[-1][1]["flops_budget"] == pytest.approx(alloc.budget(1.0, 2e4, "6n"))
    assert alloc.budget(1.0, 2e4, "6n") < alloc.budget(1.0, 2e4)  # attention is free in 6N
    done = json.loads((tmp_path / "final-flat-x1-6n-seed0" / "final.json").read_text())
    assert done["budget"]["match"] == "flops-6n"
    monkeypatch.setattr(sys, "argv", [*base, "--convention", "6n", "--clock"])
    with pytest.raises(SystemExit, match="--convention 6n: --clock matches seconds"):
        alloc.main()


def test_allocation_run_names_give_back_arm_and_seed_whatever_the_series(tmp_path):
    """A final run's directory name gives back its arm and seed (what `evaluate` records and `retire` judges) for
    every scale, convention, allocation and clock series, a series named like the scale tag included (series x's
    first records were named `learned-ngrams-x1-walloc-clock`), and a retired copy's `-N`."""
    alloc = _allocation()
    views = ((1.0, False, "", "total", "flops"), (0.5, False, "", "total", "flops"),
             (4.0, False, "", "6n", "flops"), (4.0, False, "", "total", "wider"), (1.0, True, "x", "total", "clock"),
             (1.0, True, "x1", "total", "flops"), (1.0, True, "w", "total", "clock"))
    for arm in ("learned-ngrams", "bpe-lm-ngrams", "learned-ngrams-chunks", "flat"):
        for view in views:
            name = alloc._run_dir(tmp_path, arm, view[0], view[1], 3, *view[2:]).name
            assert alloc._parse_run(name) == alloc._parse_run(f"{name}-2") == (arm, 3), name
    with pytest.raises(SystemExit, match="not a final run's directory name"):
        alloc._parse_run("final-learned-seed0")


def test_allocation_chunk_arm_trains_learned_ngrams_allocation_with_the_chunk_table(tmp_path, monkeypatch):
    """learned-ngrams-chunks (the chunk embedding's lever) trains learned-ngrams' allocation and flags plus the
    chunk table, so the two pair by seed; `retire` judges it by those flags: left alone while learned's allocation
    stands, moved aside when it changes."""
    alloc = _allocation()
    window = {"byte-window": "4"}
    monkeypatch.setattr(alloc, "allocation", lambda out, m, clock=False, strict=True, ngrams=False: dict(window))
    calls = {}

    def train_arm(run, data, method, **kw):
        calls[run.name] = (method, kw["flags"])
        return {"bytes": 1.0, "train_seconds": 1.0, "command": "x", "provenance": {}}

    monkeypatch.setattr(alloc.arms, "train_arm", train_arm)
    monkeypatch.setattr(sys, "argv", ["run.py", "final", "--data", str(tmp_path), "--out", str(tmp_path), "--ngrams",
                                      "--seeds", "0", "--budget-bytes", "2e4",
                                      "--arms", "learned-ngrams", "learned-ngrams-chunks"])
    alloc.main()
    method, flags = calls["final-learned-ngrams-chunks-x1-seed0"]
    assert method == "learned" and flags == [*calls["final-learned-ngrams-x1-seed0"][1], "--chunk-table", "16384"]
    assert "--byte-window" in flags and "--ngram-sizes" in flags
    assert alloc._stale(tmp_path) == []
    window["byte-window"] = "8"
    assert sorted(run.name for run, _, _ in alloc._stale(tmp_path)) == [
        "final-learned-ngrams-chunks-x1-seed0", "final-learned-ngrams-x1-seed0"]


def test_allocation_width_check_trains_a_step_wider_then_validations_choice_and_reports_that(tmp_path, monkeypatch):
    """The width check of a budget the sweeps did not reach: `--allocation wider` trains each arm one step up stage
    1's width axis in a -wider directory (retire judges it by the widened flags); `--allocation chosen` trains later
    seeds at whichever shape validation preferred on the seeds both trained, and refuses without them; the tables,
    README line and figure read the chosen shape, the levers table the check's differences."""
    alloc = _allocation()
    assert alloc._widened({"d-model": "64", "n-heads": "2", "n-mid": "2"}) == {"d-model": "96", "n-heads": "2",
                                                                               "n-mid": "2"}
    assert alloc._widened({"d-model": "128", "n-heads": "2"}) == {"d-model": "192", "n-heads": "3"}
    with pytest.raises(SystemExit, match="d-model 192 has no wider step"):
        alloc._widened({"d-model": "192", "n-heads": "3"})
    assert alloc._widened({"n-mid": "2"}) == {"n-mid": "2", "d-model": "192", "n-heads": "3"}  # the preset's 128
    monkeypatch.setattr(alloc, "allocation", lambda out, m, clock=False, strict=True, ngrams=False:
                        {"d-model": "96" if m == "uniform" else "64", "n-heads": "2", "n-mid": "2"})
    calls = {}

    def train_arm(run, data, method, **kw):
        calls[run.name] = kw["flags"]
        return {"bytes": 1.0, "train_seconds": 1.0, "command": "x", "provenance": {}}

    monkeypatch.setattr(alloc.arms, "train_arm", train_arm)
    results = tmp_path / "records.jsonl"
    base = ["run.py", "final", "--data", str(tmp_path), "--out", str(tmp_path), "--ngrams", "--scale", "4",
            "--budget-bytes", "2e4", "--results", str(results), "--arms", "flat-ngrams", "uniform-ngrams"]
    monkeypatch.setattr(sys, "argv", [*base, "--seeds", "0", "--allocation", "wider"])
    alloc.main()
    flat = calls["final-flat-ngrams-x4-wider-seed0"]
    assert flat[flat.index("--d-model") + 1] == "96" and flat.count("--d-model") == 1
    uniform = calls["final-uniform-ngrams-x4-wider-seed0"]
    assert uniform[uniform.index("--d-model") + 1] == "128"
    done = json.loads((tmp_path / "final-flat-ngrams-x4-wider-seed0" / "final.json").read_text())
    assert done["budget"]["allocation"] == "wider" and alloc._stale(tmp_path) == []  # judged by the wider flags
    assert alloc._parse_run("final-flat-ngrams-x4-wider-seed0") == ("flat-ngrams", 0)
    monkeypatch.setattr(sys, "argv", [*base, "--seeds", "1", "--allocation", "chosen"])
    with pytest.raises(SystemExit, match="uniform-ngrams needs a run at its allocation and one a width step wider"):
        alloc.main()  # nothing evaluated yet: no choice
    monkeypatch.setattr(sys, "argv", [*base, "--seeds", "1", "--allocation", "wider", "--clock"])
    with pytest.raises(SystemExit, match="--allocation wider: the width check of a FLOPs budget"):
        alloc.main()
    key = {"scale": 4.0, "match": "flops-total", "flops_budget": alloc.budget(4.0, 2e4)}

    def final(arm, seed, bpb, val, wider=False, scale=4.0):
        test = {"bpb": bpb, "bytes": 2, "per_document": {"documents": [0, 1], "bits": [bpb] * 2, "bytes": [1, 1]}}
        budget = {**key, "scale": scale, **({"allocation": "wider"} if wider else {})}
        return records.make("allocation", arm, seed, command="x", method=arm.removesuffix("-ngrams"), flags=[],
                            test=test, val={"bpb": val}, train_seconds=1.0, flops_total=1e9 * scale, budget=budget)

    records.write(results, [final("flat-ngrams", 0, 2.0, 2.0), final("flat-ngrams", 0, 1.9, 1.95, wider=True),
                            final("uniform-ngrams", 0, 2.1, 2.1), final("uniform-ngrams", 0, 2.3, 2.2, wider=True),
                            final("learned-ngrams", 0, 1.8, 1.8), final("learned-ngrams", 1, 1.85, 1.85)])
    monkeypatch.setattr(sys, "argv", [*base, "--seeds", "1", "--allocation", "chosen"])
    alloc.main()  # flat wider (1.95 < 2.0 on validation), uniform at its allocation (2.1 < 2.2)
    assert "final-flat-ngrams-x4-wider-seed1" in calls and "final-uniform-ngrams-x4-seed1" in calls
    records.write(results, [*records.load(results), final("flat-ngrams", 1, 1.95, 2.0, wider=True),
                            final("uniform-ngrams", 1, 2.2, 2.2),
                            *[final(a, s, b, b, scale=1.0) for a, s, b in (
                                ("learned-ngrams", 0, 1.9), ("learned-ngrams", 1, 1.9), ("flat-ngrams", 0, 2.0),
                                ("flat-ngrams", 1, 2.0), ("uniform-ngrams", 0, 2.0), ("uniform-ngrams", 1, 2.0))]])
    table = alloc.report(results).split("Budget x4")[1]
    assert "one width step wider than its allocation, which validation preferred on the seeds both shapes " \
           "trained: flat-ngrams;" in table
    assert "| flat-ngrams | 2 | 1.9250 ± 0.0250 |" in table and "| uniform-ngrams | 2 | 2.1500 ± 0.0500 |" in table
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[4:6]
            for line in alloc.levers_table(results, tmp_path / "none.jsonl").splitlines()[2:]}
    check = "x4 budget, total FLOPs"
    assert rows["allocation: one width step wider", "flat-ngrams", check] == [" 1 ", " -0.1000 (1 seed) "]
    assert rows["allocation: one width step wider", "uniform-ngrams", check] == [" 1 ", " +0.2000 (1 seed) "]
    assert rows["allocation: one width step wider", "learned-ngrams − flat-ngrams", check] == [
        " 1 ", " +0.1000 (1 seed) "]
    n, text = rows["budget: 4× instead of 1×", "flat-ngrams", "total FLOPs, " + alloc.WIDTH_CHOSEN]
    assert n.strip() == "2" and text.startswith(" -0.0750 [")  # its chosen (wider) runs against x1's
    intro, cells = _readme_table(alloc.study_table(results))
    assert cells["flat"]["4× total FLOPs"] == "-0.100 ± 0.000 (2)"  # against flat's wider runs
    assert intro.endswith(" 4×: at the x1 allocation or one width step wider where validation preferred it (flat).")
    assert alloc.budget_points(records.load(results))["flops"]["flat-ngrams"][-1][1:] == (
        pytest.approx(1.925), pytest.approx(0.025), 2)


def test_allocation_classes_scores_current_x1_byte_runs_once_and_the_table_splits_the_gap(tmp_path, monkeypatch,
                                                                                           capsys):
    """`classes` breaks down each current x1 matched-total-FLOPs run of the byte arms (not other budgets, clock
    series, retired runs, the BPE transformer, or a run already scored), refuses a score that is not its record's,
    names a run without a checkpoint; the table gives each class's share, learned's BPB there, and learned − each
    arm there and as a part of the gap, the parts adding up to the gap."""
    alloc = _allocation()

    def classes(scale):  # learned better on word starts by 0.1 bits per byte there
        return {"classes": ["word start", "word inside", "space", "punctuation"],
                "bits": [(2.0 - 0.1 * (scale < 2)) * 10, 20.0 * scale, 5.0, 5.0], "bytes": [10, 20, 5, 5]}

    def final(arm, seed, scale=1.0, **budget):
        c = classes(1.0 if arm.startswith("learned") else 2.0)
        run = f"final-{arm}-x1-seed{seed}"
        return records.make("allocation", arm, seed, command="x", run=run, run_dir=str(tmp_path / run),
                            test={"bpb": sum(c["bits"]) / 40 + seed / 100, "bytes": 40},
                            budget={"scale": scale, "match": "flops-total", "flops_budget": 1e2, **budget})

    results, out = tmp_path / "records.jsonl", tmp_path / "classes.jsonl"
    rows = [final(a, s) for a in ("learned-ngrams", "flat-ngrams") for s in (0, 1, 2)]
    rows += [final("bpe-lm-ngrams", 0), final("learned-ngrams", 5, scale=0.5),
             final("learned-ngrams", 6, match="time", series="x"), {**final("flat-ngrams", 7), "retired": {"now": []}}]
    rows[-2]["budget"]["match"] = "time"
    records.write(results, rows)
    for r in rows:
        if r["run"] != "final-flat-ngrams-x1-seed2":  # its checkpoint is gone
            (tmp_path / r["run"]).mkdir(exist_ok=True)
            (tmp_path / r["run"] / "latest").write_text("step_1")
    scored = []

    def scores(run, test_bytes):
        scored.append(run.name)
        r = next(r for r in rows if r["run"] == run.name)
        return {"bpb": r["test"]["bpb"], "bytes": 40,
                "by_class": classes(1.0 if r["arm"].startswith("learned") else 2.0)}

    monkeypatch.setattr(alloc, "_class_scores", scores)
    args = ["run.py", "classes", "--out", str(tmp_path), "--results", str(results), "--class-results", str(out)]
    monkeypatch.setattr(sys, "argv", args)
    alloc.main()
    assert sorted(scored) == sorted(f"final-{a}-x1-seed{s}" for a in ("learned-ngrams", "flat-ngrams")
                                    for s in (0, 1, 2) if (a, s) != ("flat-ngrams", 2))
    assert "final-flat-ngrams-x1-seed2: no checkpoint here" in capsys.readouterr().out
    alloc.main()  # everything scored: nothing again
    assert len(scored) == 5
    head, _, *table = alloc.classes_table(out, results).splitlines()  # one budget: only x1 has learned and flat
    assert head == "Budget x1, matched total FLOPs (each method at its x1 allocation):"
    assert table[0].startswith("| byte class | share of the bytes | learned-ngrams BPB there | learned − flat: BPB")
    word_start = table[2].split(" | ")
    assert word_start[:3] == ["| word start", "25.0%", "1.9000 ± 0.0000"]
    assert word_start[3].startswith("-0.1000 [-0.1000, -0.1000]") and word_start[4].startswith("-0.0250 [")
    assert table[3].split(" | ")[4].startswith("-0.5000 [")  # word inside: 20 bytes x -1 bit over 40
    assert table[-1].split(" | ")[3].startswith("-0.5250 [") and table[-1].endswith("| (2 seeds) |")  # the gap
    records.write(results, [{**r, "retired": {"now": []}} if r["arm"] == "flat-ngrams" else r for r in rows])
    assert "flat" not in alloc.classes_table(out, results)  # retired runs' breakdowns leave the table
    bad = rows[0]["test"]["bpb"] + 0.01
    monkeypatch.setattr(alloc, "_class_scores", lambda run, n: {"bpb": bad, "bytes": 40, "by_class": classes(1.0)})
    records.write(results, [{**rows[0], "test": {"bpb": 1.0, "bytes": 40}}])
    with pytest.raises(SystemExit, match="not the same model or text"):
        alloc.main()


def test_allocation_classes_table_says_where_each_arms_tokens_begin(tmp_path):
    """A budget whose breakdowns carry the runs' boundaries gets a second table: per class, the share of its bytes
    that begin one of the arm's tokens and the bits per byte there and on the rest, averaged over seeds, for each
    U-Net arm (flat, every byte a token, left out); a budget with learned alone gets that table only."""
    alloc = _allocation()

    def rec(arm, seed, first_bytes):
        by_class = {"classes": ["word start", "word inside", "space", "punctuation"],
                    "bits": [20.0, 20.0, 5.0, 5.0], "bytes": [10, 20, 5, 5],
                    "token_first": {"bits": [2.0 * first_bytes[0], 0.5 * first_bytes[1], 0.0, 0.0],
                                    "bytes": [*first_bytes, 0, 0]}}
        run = f"final-{arm}-x1-c-seed{seed}"
        budget = {"scale": 1.0, "match": "time", "time_budget": 639.4, "series": "y", "allocation": "clock"}
        return (records.make("allocation", arm, seed, command="x", run=run, test={"bpb": 1.25, "bytes": 40},
                             budget=budget),
                records.make("allocation-classes", arm, seed, command="x", run=run, budget=budget,
                             test={"bpb": 1.25, "bytes": 40, "by_class": by_class}))

    pairs = [rec("learned-ngrams", 0, [8, 0]), rec("learned-ngrams", 1, [10, 4]), rec("flat-ngrams", 0, [10, 20])]
    results, out = tmp_path / "records.jsonl", tmp_path / "classes.jsonl"
    records.write(results, [p[0] for p in pairs[:2]])
    records.write(out, [p[1] for p in pairs[:2]])
    head, _, *table = alloc.classes_table(out, results).splitlines()
    assert head == "Budget x1, matched wall-clock, clock series y (each method at its wall-clock allocation):"
    assert table[0] == ("| byte class | learned: a token's first byte (2 seeds) | learned: BPB on first bytes / the "
                        "rest |")
    assert table[2] == "| word start | 90.0% | 2.000 / 2.000 |"  # seed 1: no word start inside a token
    assert table[3] == "| word inside | 10.0% | 0.500 / 1.062 |"  # seed 1's 4 first bytes; the rest 20/20, 18/16
    assert table[5] == "| punctuation | 0.0% | — / 1.000 |" and table[6].startswith("| **all** | ")
    records.write(results, [p[0] for p in pairs])
    records.write(out, [p[1] for p in pairs])
    text = alloc.classes_table(out, results)
    assert "flat" in text and "flat: a token's first byte" not in text  # learned − flat, but no flat token table


def test_allocation_retire_moves_stale_runs_aside_and_keeps_their_records_out_of_the_tables(tmp_path, monkeypatch):
    """A later sweep stage that changes an allocation (BPE's vocabulary) makes the arm's finished runs stale:
    `retire` moves exactly those runs aside (with their logs), marks their records retired (the run directory
    where it now is), the tables and the README line leave them out but list them, and it is idempotent."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "allocation",
                        lambda out, m, clock=False, strict=True, ngrams=False:
                        {"bpe-vocab-size": "2048"} if m == "bpe-lm" else {})
    results = tmp_path / "records.jsonl"
    rows = []

    def test(bpb):
        return {"bpb": bpb, "bytes": 2, "per_document": {"documents": [0, 1], "bits": [bpb, bpb], "bytes": [1, 1]}}

    for arm, method, flags in (("bpe-lm", "bpe-lm", alloc._flags("bpe-lm")[2:]),  # the driver's 4,096
                               ("flat", "flat", alloc._flags("flat")[2:])):
        for seed in (0, 1):
            run = alloc._run_dir(tmp_path, arm, 1.0, False, seed)
            run.mkdir()
            (run / "final.json").write_text(json.dumps({"method": method, "ngrams": False, "flags": flags}))
            run.with_name(run.name + ".log").write_text("log")
            rows.append(records.make("allocation", arm, seed, command="x", method=method, flags=flags,
                                     run_dir=str(run.resolve()), test=test(2.0 + seed / 10),
                                     val={"bpb": 2.0}, train_seconds=1.0,
                                     budget={"scale": 1.0, "match": "flops-total", "flops_budget": 1.7e13}))
    rows += [{**r, "arm": "learned", "method": "learned", "run_dir": "elsewhere", "test": test(1.9 + r["seed"] / 10)}
             for r in rows[:2]]
    records.write(results, rows)

    def unfinished(arm, seed, flags):  # a run interrupted at a checkpoint: its config, no final.json
        run = alloc._run_dir(tmp_path, arm, 1.0, False, seed)
        run.mkdir()
        (run / "config.json").write_text(json.dumps(arms.saved_config(["--preset", "small", *flags])))
        (run / "latest").write_text("step_000001")
        return run

    old = unfinished("bpe-lm", 2, alloc._flags("bpe-lm")[2:])
    ongoing = unfinished("flat", 2, alloc._flags("flat")[2:])
    monkeypatch.setattr(sys, "argv", ["run.py", "final", "--data", str(tmp_path), "--out", str(tmp_path),
                                      "--methods", "bpe-lm", "--seeds", "2"])
    with pytest.raises(SystemExit, match="unfinished run of another allocation"):  # it would resume at 4,096
        alloc.main()
    monkeypatch.setattr(sys, "argv", ["run.py", "retire", "--out", str(tmp_path), "--results", str(results),
                                      "--sweep-results", str(tmp_path / "sweep.jsonl")])
    alloc.main()
    assert not old.exists() and (tmp_path / "retired" / old.name / "latest").exists() and ongoing.exists()
    stale = alloc._run_dir(tmp_path, "bpe-lm", 1.0, False, 0)
    assert not stale.exists() and (tmp_path / "retired" / stale.name / "final.json").exists()
    assert (tmp_path / "retired" / (stale.name + ".log")).exists()
    assert alloc._run_dir(tmp_path, "flat", 1.0, False, 0).exists()  # its allocation did not change
    after = records.load(results)
    assert [r["arm"] for r in after if r.get("retired")] == ["bpe-lm", "bpe-lm"] and len(after) == 6
    assert all("/retired/" in r["run_dir"] and "--bpe-vocab-size" in r["retired"]["now"]
               for r in after if r.get("retired"))
    table = alloc.report(results)
    assert "| flat | 2 |" in table and "| bpe-lm | 2 |" not in table
    assert ("| bpe-lm | x1 total FLOPs | 2 | 2.0500 ± 0.0500 | --bpe-vocab-size 4096 | --bpe-vocab-size 2048 | "
            "-0.1000 [-0.1000, -0.1000] |") in table  # learned's current runs against the retired ones
    alloc.main()  # nothing stale is left: nothing moves, the records stay as they are
    assert records.load(results) == after


def _readme_table(item: str) -> tuple[str, dict[str, dict[str, str]]]:
    """The README study item's paragraph and its table as {row: {column: cell}}."""
    intro, table = item.split("\n\n")
    head, _, *rows = table.splitlines()
    columns = [c.strip() for c in head.split("|")[2:-1]]
    cells = {}
    for row in rows:
        name, *values = (c.strip() for c in row.split("|")[1:-1])
        cells[name] = dict(zip(columns, values))
    return intro, cells


def test_allocation_study_table_pairs_seeds_per_convention_and_budget(tmp_path):
    """The README's study table: learned − each method, paired over seeds, one column per convention and budget
    (x1's conventions, then the pairs without n-grams, then the other budgets), a row per method that pairs; of a
    pair's clock series the one at wall-clock allocations; retired runs left out; nothing before two seeds pair."""
    alloc = _allocation()

    def final(arm, seed, bpb, match="flops-total", **budget):
        method = arm.removesuffix("-ngrams")
        return records.make("allocation", arm, seed, command="x", method=method, test={"bpb": bpb},
                            val={"bpb": bpb},
                            flags=["--policy-window", "1", "--value-baseline", "--d-model", "64", "--n-mid", "2"]
                            if method == "learned" else ["--boundaries", "flat", "--d-model", "96"],
                            budget={"scale": 1.0, "match": match,
                                    ("time_budget" if match == "time" else "flops_budget"): 1e2, **budget})

    path = tmp_path / "records.jsonl"
    records.write(path, [final("learned-ngrams", 0, 2.0), final("flat-ngrams", 0, 2.1)])
    assert alloc.study_table(path) is None  # one seed: no interval
    records.write(path, [*records.load(path), final("learned-ngrams", 1, 2.05), final("flat-ngrams", 1, 2.2),
                         final("learned-ngrams", 0, 2.3, "time"), final("flat-ngrams", 0, 2.2, "time")])
    intro, cells = _readme_table(alloc.study_table(path))
    assert cells == {"flat": {"total FLOPs": "-0.125 ± 0.318 (2) *tie*"}}  # the clock budget has one seed only
    assert "Wall-clock" not in intro and "×:" not in intro
    records.write(path, [*records.load(path), final("learned-ngrams", 1, 2.2, "time"),
                         final("flat-ngrams", 1, 2.1, "time", series="b")])
    assert "wall-clock" not in alloc.study_table(path)  # a series pairs only among its own runs
    b = [final("flat-ngrams", 0, 2.2, "time", series="b"), final("learned-ngrams", 0, 2.0, "time", series="b"),
         final("learned-ngrams", 1, 2.1, "time", series="b"), final("flat-ngrams", 1, 2.1, "time")]
    records.write(path, [*records.load(path), *b])
    intro, cells = _readme_table(alloc.study_table(path))
    assert cells["flat"]["wall-clock"].startswith("+0.100 ± ")  # series a, the first, while neither is walloc
    assert "each at its wall-clock width" not in intro
    records.write(path, [*records.load(path), *[{**r, "budget": {**r["budget"], "allocation": "clock"},
                                                 "flops_total": (0.5 + i % 2 / 10) * alloc.budget()}
                                                for i, r in enumerate(records.load(path))
                                                if r["budget"].get("series") == "b"]])
    intro, cells = _readme_table(alloc.study_table(path))
    assert cells["flat"]["wall-clock"].startswith("-0.100 ± ")  # series b trained at wall-clock allocations
    assert ("Wall-clock: the flat model's seconds, each at its wall-clock width × depth (0.50–0.60× the FLOPs "
            "budget on this CPU).") in intro
    c = [final(arm, seed, bpb, "time", series="c") for arm, seed, bpb in (
        ("learned-ngrams", 0, 2.0), ("learned-ngrams", 1, 2.0), ("flat-ngrams", 0, 2.5), ("flat-ngrams", 1, 2.5))]
    with_c = tmp_path / "with_c.jsonl"
    records.write(with_c, [*records.load(path), *c])  # a later series, not at wall-clock allocations: not shown
    assert _readme_table(alloc.study_table(with_c))[1]["flat"]["wall-clock"].startswith("-0.100 ± ")
    d = [final(arm, seed, bpb, "time", series="d", allocation="clock") for arm, seed, bpb in (
        ("learned-ngrams", 0, 2.0), ("learned-ngrams", 1, 2.1), ("uniform-ngrams", 0, 2.2), ("uniform-ngrams", 1, 2.2))]
    records.write(with_c, [*records.load(path), *d])  # another wall-clock series, pairing learned with patches only
    intro, cells = _readme_table(alloc.study_table(with_c))
    assert cells["flat"]["wall-clock"].startswith("-0.100 ± ")
    assert cells["fixed patches"]["wall-clock"].startswith("-0.150 ± ")
    assert "; its rows come from 2 series, each row's pair back to back in one sitting" in intro
    bpe = ["--arch", "token", "--bpe-vocab-size", "4096", "--d-model", "64", "--n-mid", "4", "--bpe-vocab-size", "2048"]
    records.write(path, [*records.load(path), final("learned", 0, 2.4), final("flat", 0, 2.3),
                         final("learned", 1, 2.45), final("flat", 1, 2.3),
                         *[{**final("bpe-lm-ngrams", s, b), "flags": bpe} for s, b in ((0, 2.3), (1, 2.36))]])
    _, cells = _readme_table(alloc.study_table(path))
    assert list(cells) == ["flat", "BPE transformer (vocabulary 2,048)"]  # the allocation's flag, given last
    assert list(cells["flat"]) == ["total FLOPs", "wall-clock", "total FLOPs, *no n-grams*"]
    assert cells["flat"]["total FLOPs, *no n-grams*"].startswith("+0.125 ± ")
    assert cells["BPE transformer (vocabulary 2,048)"]["total FLOPs"].startswith("-0.305 ± ")
    assert cells["BPE transformer (vocabulary 2,048)"]["wall-clock"] == ""
    x4 = [final(arm, s, b, flops_budget=4e2, scale=4.0)
          for arm, s, b in (("learned-ngrams", 0, 1.8), ("learned-ngrams", 1, 1.9), ("flat-ngrams", 0, 1.9),
                            ("flat-ngrams", 1, 2.0))]
    half = [{**r, "budget": {**r["budget"], "scale": 0.5}, "test": {"bpb": r["test"]["bpb"] + 0.3}} for r in x4[:2]]
    half += [{**r, "budget": {**r["budget"], "scale": 0.5}} for r in x4[2:]]
    wider = [{**final("flat-ngrams", s, b, flops_budget=4e2, scale=4.0, allocation="wider"), "val": {"bpb": 1.0}}
             for s, b in ((0, 1.95), (1, 2.0))]  # validation prefers it: flat's x1-allocation runs left out
    records.write(path, [*records.load(path), *x4, *half, *wider])
    intro, cells = _readme_table(alloc.study_table(path))
    assert list(cells["flat"]) == ["total FLOPs", "wall-clock", "total FLOPs, *no n-grams*", "0.5× total FLOPs",
                                   "4× total FLOPs"]
    assert cells["flat"]["0.5× total FLOPs"].startswith("+0.200 ± ")
    assert cells["flat"]["4× total FLOPs"].startswith("-0.125 ± ")
    assert intro.endswith(" 0.5× and 4×: at the x1 allocation or one width step wider where validation preferred "
                          "it (flat).")
    others = [final(arm, s, b) for arm, s, b in (("entropy-ngrams", 0, 2.1), ("entropy-ngrams", 1, 2.2),
                                                 ("hnet-ngrams", 0, 2.1))]
    records.write(path, [*records.load(path), *others])
    assert "at fixed patches' allocation" not in intro
    intro, cells = _readme_table(alloc.study_table(path))
    assert list(cells)[-1] == "entropy patches"  # hnet pairs one seed only: no row
    assert " 6N leaves it out. Entropy patches: at fixed patches' allocation. Wall-clock: " in intro
    tight = tmp_path / "tight.jsonl"  # a half-width under 0.0005 gets a fourth decimal, not "± 0.000"
    records.write(tight, [final(arm, s, b) for s, d in enumerate((0.0155, 0.0152, 0.0155))
                          for arm, b in (("learned-ngrams", 2.0 - d), ("flat-ngrams", 2.0))])
    assert _readme_table(alloc.study_table(tight))[1]["flat"]["total FLOPs"] == "-0.0154 ± 0.0004 (3)"
    assert cells["entropy patches"]["total FLOPs"] == "-0.125 ± 0.318 (2) *tie*"
    retired = [{**r, "retired": {"now": ["--byte-window", "4"]}} if r["method"] == "learned" else r
               for r in records.load(path)]
    records.write(path, retired)
    assert alloc.study_table(path) is None  # every learned run retired: no pair left


def test_allocation_levers_pair_each_lever_over_seeds(tmp_path):
    """The levers table: each lever's change on an arm's test BPB and on learned's gap, paired over the seeds
    both sides have (n-grams: with − without; allocation: own − the preset screen's; accounting: total − 6N;
    clock: wall-clock − total FLOPs), a t-interval from two seeds and one seed's difference marked as such."""
    alloc = _allocation()

    def final(arm, seed, bpb, match="flops-total", series="", scale=1.0):
        test = {"bpb": bpb, "bytes": 2, "per_document": {"documents": [0, 1], "bits": [bpb] * 2, "bytes": [1, 1]}}
        return records.make("allocation", arm, seed, command="x", method=arm.removesuffix("-ngrams"), flags=[],
                            test=test, val={"bpb": bpb}, train_seconds=1.0,
                            budget={"scale": scale, "match": match, "flops_budget": 1e2,
                                    **({"series": series} if series else {})})

    path, preset = tmp_path / "records.jsonl", tmp_path / "preset.jsonl"
    records.write(path, [final("learned-ngrams", 0, 1.8), final("learned-ngrams", 1, 1.9),
                         final("flat-ngrams", 0, 1.9), final("flat-ngrams", 1, 2.1),
                         final("learned", 0, 2.3), final("flat", 0, 2.2),
                         final("learned-ngrams", 0, 1.85, "flops-6n"), final("flat-ngrams", 0, 1.85, "flops-6n"),
                         final("learned-ngrams", 0, 1.7, "time", "c"), final("learned-ngrams", 1, 1.8, "time", "c"),
                         final("learned-ngrams-chunks", 0, 1.75), final("learned-ngrams-chunks", 1, 1.86),
                         *[final(arm, s, b, scale=4.0) for arm, s, b in (
                             ("learned-ngrams", 0, 1.6), ("learned-ngrams", 1, 1.7),
                             ("flat-ngrams", 0, 1.8), ("flat-ngrams", 1, 2.0))]])
    records.write(preset, [final("learned-ngrams", 0, 2.0), final("flat-ngrams", 0, 2.2)])
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[4:6]
            for line in alloc.levers_table(path, preset).splitlines()[2:]}
    assert rows["n-gram embeddings", "learned", "its own allocation"] == [" 1 ", " -0.5000 (1 seed) "]
    assert rows["n-gram embeddings", "learned − flat", "its own allocation"] == [" 1 ", " -0.2000 (1 seed) "]
    assert rows["allocation: own instead of the preset's", "learned-ngrams − flat-ngrams", "total FLOPs"][1] == \
        " +0.1000 (1 seed) "  # -0.1 now against -0.2 in the preset's shape
    assert rows["accounting: total FLOPs instead of 6N", "learned-ngrams − flat-ngrams", "own allocation"][1] == \
        " -0.1000 (1 seed) "
    n, text = rows["wall-clock instead of total FLOPs", "learned-ngrams", "clock series c"]
    assert n.strip() == "2" and text.startswith(" -0.1000 [-0.1000, -0.1000]")  # both seeds moved by -0.1
    assert ("n-gram embeddings", "learned", "the preset's shape") not in rows  # the preset has no plain arm
    n, text = rows["chunk embedding", "learned-ngrams", "its own allocation"]  # -0.05 and -0.04
    assert n.strip() == "2" and text.startswith(" -0.0450 [")
    chunks = next(line for line in alloc.report(path).splitlines() if line.startswith("| learned-ngrams-chunks | 2 |"))
    assert chunks.split("|")[7].startswith(" -0.1950 [")  # − flat-ngrams (-0.15, -0.24), not plain flat (1 seed)
    n, text = rows["budget: 4× instead of 1×", "learned-ngrams − flat-ngrams", "total FLOPs, x1 allocation"]
    assert n.strip() == "2" and text.startswith(" -0.1000 [-0.1000, -0.1000]")  # gap -0.2, -0.3 at 4x; -0.1, -0.2
    assert alloc.levers_table(tmp_path / "none.jsonl", tmp_path / "none.jsonl") == "(no paired runs yet)\n"


def test_allocation_restore_rebuilds_out_from_the_records_and_collect_never_drops_a_cell(tmp_path, monkeypatch):
    """On a new machine (run directories gone) `restore` rebuilds each sweep's cells and each current final run's
    final.json from the committed records: the allocation is chosen again, `final` skips the restored runs,
    `evaluate` does not try to load them, retired runs stay gone; `collect` from a partial OUT keeps the cells
    the records file has."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else [])

    def cell(n_mid, bpb):
        return records.make("sweep", "cell", 0, command="x", axes={"n-mid": n_mid}, val_bpb=bpb, method="uniform",
                            stage=1)

    sweep_results, results, out = tmp_path / "sweep.jsonl", tmp_path / "records.jsonl", tmp_path / "out"
    records.write(sweep_results, [cell("2", 2.2), cell("3", 2.1)])
    flags = alloc._flags("uniform", {"n-mid": "3"})[2:]
    run = {"budget": {"scale": 1.0, "match": "flops-total", "flops_budget": 1e13}, "flags": flags,
           "method": "uniform", "ngrams": False, "train_seconds": 5.0, "test": {"bpb": 2.0}, "val": {"bpb": 2.0}}
    records.write(results, [records.make("allocation", "uniform", 0, command="x", run="final-uniform-x1-seed0",
                                         run_dir="/gone/final-uniform-x1-seed0", **run),
                            records.make("allocation", "uniform", 1, command="x", run="final-uniform-x1-seed1",
                                         run_dir="/gone/retired/final-uniform-x1-seed1", retired={"now": []}, **run)])

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        alloc.main()

    main("restore", "--out", out, "--results", results, "--sweep-results", sweep_results)
    assert [r["axes"] for r in records.load(out / "sweep1-uniform" / "sweep.jsonl")] == [{"n-mid": "2"},
                                                                                         {"n-mid": "3"}]
    assert alloc.allocation(out, "uniform") == {"n-mid": "3"}
    done = json.loads((out / "final-uniform-x1-seed0" / "final.json").read_text())
    assert done["restored"] and done["flags"] == flags and done["train_seconds"] == 5.0 and "test" not in done
    assert not (out / "final-uniform-x1-seed1").exists()  # retired: `final` trains it again
    assert json.loads((out / "retired" / "final-uniform-x1-seed1" / "final.json").read_text())["restored"]
    calls = []
    monkeypatch.setattr(alloc.arms, "train_arm", lambda run, *a, **kw: calls.append(run.name) or
                        {"bytes": 1.0, "train_seconds": 1.0, "command": "x", "provenance": {}})
    main("final", "--data", tmp_path, "--out", out, "--methods", "uniform", "--seeds", "0", "1")
    assert calls == ["final-uniform-x1-seed1"]
    (out / "final-uniform-x1-seed1" / "final.json").unlink()  # only the restored run is left to evaluate
    main("evaluate", "--out", out, "--results", results)  # scored already: it is not loaded (no checkpoint)
    assert len(records.load(results)) == 2
    main("restore", "--out", out, "--results", results, "--sweep-results", sweep_results)  # touches nothing
    assert json.loads((out / "final-uniform-x1-seed0" / "final.json").read_text()) == done
    records.write(out / "sweep1-uniform" / "sweep.jsonl", [records.load(out / "sweep1-uniform" / "sweep.jsonl")[1],
                                                            {**records.load(sweep_results)[0], "seed": 1}])
    main("collect", "--out", out, "--results", sweep_results)  # one cell from OUT is new; the other is kept
    assert sorted((r["axes"]["n-mid"], r["seed"]) for r in records.load(sweep_results)) == [("2", 0), ("2", 1),
                                                                                            ("3", 0)]


def test_allocation_interrupted_clock_runs_train_again_from_step_0(tmp_path, monkeypatch, capsys):
    """A clock sweep's interrupted cell and an interrupted clock run are deleted before they train again (their
    budget is seconds: resumed in another sitting they would meet two machine speeds); finished cells stay, and an
    interrupted run at matched FLOPs still resumes from its checkpoint."""
    alloc = _allocation()

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        alloc.main()

    for seed in (0, 1):
        run = alloc._run_dir(tmp_path, "flat-ngrams", 1.0, False, seed)
        run.mkdir()
        (run / "final.json").write_text(json.dumps({"train_seconds": 100.0, "flags": []}))
    sweep = tmp_path / "sweep1c-learned"
    finished, interrupted = (sweep / f"d-model_{d}__n-heads_2__n-mid_2__seed0" for d in (96, 64))
    for run in (finished, interrupted):
        run.mkdir(parents=True)
        (run / "latest").write_text("step_000500")
    records.write(sweep / "sweep.jsonl", [records.make("sweep", "d-model_96__n-heads_2__n-mid_2", 0, command="x",
                                                       axes={"d-model": "96", "n-heads": "2", "n-mid": "2"})])
    monkeypatch.setattr(alloc, "subprocess", types.SimpleNamespace(run=lambda cmd, **kw: None))
    main("sweep", "--clock", "--data", tmp_path, "--out", tmp_path, "--methods", "learned")
    assert finished.exists() and not interrupted.exists()
    assert f"{interrupted.name}: an interrupted clock run trains again from step 0" in capsys.readouterr().out
    existed = {}

    def train_arm(run, data, method, **kw):
        existed[run.name] = run.exists()
        return {"bytes": 1.0, "train_seconds": 1.0, "command": "x", "provenance": {}}

    monkeypatch.setattr(alloc.arms, "train_arm", train_arm)
    for clock in (True, False):
        run = alloc._run_dir(tmp_path, "learned-ngrams", 1.0, clock, 0)
        run.mkdir()
        (run / "latest").write_text("step_000500")
    main("final", "--data", tmp_path, "--out", tmp_path, "--seeds", "0", "--ngrams", "--arms", "learned-ngrams")
    main("final", "--data", tmp_path, "--out", tmp_path, "--seeds", "0", "--ngrams", "--clock", "--arms",
         "learned-ngrams")
    assert existed == {"final-learned-ngrams-x1-seed0": True, "final-learned-ngrams-x1-clock-seed0": False}


def test_allocation_clock_sweep_trains_n_gram_cells_for_the_clock_finals_seconds_and_keeps_its_own_optimum(
        tmp_path, monkeypatch, capsys):
    """`sweep --clock` refuses before flat-ngrams' FLOPs runs exist, then runs stage 1 with the n-gram tables,
    every cell for their median seconds, in sweep1c-METHOD; its best cell is the allocation at matched seconds
    (the FLOPs one unchanged); collect tags its cells `clock`, restore puts them back, the table names them."""
    alloc = _allocation()

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        alloc.main()

    commands = []
    monkeypatch.setattr(alloc, "subprocess", types.SimpleNamespace(run=lambda cmd, **kw: commands.append(cmd)))
    with pytest.raises(SystemExit, match="flat-ngrams arm's FLOPs runs at scale 1 must finish first"):
        main("sweep", "--clock", "--data", tmp_path, "--out", tmp_path, "--methods", "learned")
    for seed, secs in enumerate((90.0, 100.0, 400.0)):
        run = alloc._run_dir(tmp_path, "flat-ngrams", 1.0, False, seed)
        run.mkdir()
        (run / "final.json").write_text(json.dumps({"train_seconds": secs, "flags": []}))
    records.write(tmp_path / "sweep2-bpe-lm" / "sweep.jsonl", [records.make(
        "sweep", "cell", 0, command="x", axes={"bpe-vocab-size": v}, val_bpb=2 + i, bytes=1e6, flops_total=1e12,
        train_seconds=1.0) for i, v in enumerate(
        ("2048", "1024", "4096"))])
    main("sweep", "--clock", "--data", tmp_path, "--out", tmp_path, "--methods", "learned", "flat", "bpe-lm")
    learned, flat, bpe_lm = commands
    assert bpe_lm[-len(alloc.NGRAMS) - 2:-len(alloc.NGRAMS)] == ["--bpe-vocab-size", "2048"]  # stage 2's choice
    assert learned[4] == str(tmp_path / "sweep1c-learned") and learned[5:7] == ["--time-budget", "100"]
    assert "--flops-budget" not in learned and " ".join(alloc.NGRAMS) in " ".join(learned)
    assert f"--axis {alloc.CLOCK_WIDTH} --axis n-mid=2,3 " in " ".join(learned)
    assert "--axis n-mid=1,2 " in " ".join(flat)
    assert f"--axis {alloc.CLOCK_WIDTH},192:3 --axis n-mid=2,4,6 " in " ".join(bpe_lm)  # its grid grew twice
    with pytest.raises(SystemExit, match="stage 1"):
        main("sweep", "--clock", "--stage", "2", "--data", tmp_path, "--out", tmp_path)
    with pytest.raises(SystemExit, match="--ngrams: stage 2"):
        main("sweep", "--ngrams", "--data", tmp_path, "--out", tmp_path)
    records.write(tmp_path / "sweep1-learned" / "sweep.jsonl", [records.make(
        "sweep", "cell", 0, command="x", axes={"d-model": "64", "n-heads": "2", "n-mid": "2"}, val_bpb=2.0)])
    monkeypatch.setattr(alloc, "WIDTH", "d-model,n-heads=64:2")
    monkeypatch.setattr(alloc, "UNET_DEPTH", "n-mid=2")
    commands.clear()  # stage 2 with the tables: its own directory and axes, on stage 1's best, flat has none
    main("sweep", "--stage", "2", "--ngrams", "--data", tmp_path, "--out", tmp_path, "--methods", "learned", "flat")
    ((learned,),) = [commands]
    assert learned[4] == str(tmp_path / "sweep2n-learned") and " ".join(alloc.NGRAMS) in " ".join(learned)
    assert f"--axis {alloc.STAGE2N_WINDOWS} --axis {alloc.STAGE2N_RATES} " in " ".join(learned)
    assert "--d-model 64 --n-heads 2 --n-mid 2" in " ".join(learned) and "--target-rate" not in learned[-20:]
    (tmp_path / "sweep1-learned" / "sweep.jsonl").unlink()

    def cell(d, n_mid, bpb):
        heads = "3" if d == "192" else "2"
        return records.make("sweep", "cell", 0, command="x", axes={"d-model": d, "n-heads": heads, "n-mid": n_mid},
                            val_bpb=bpb, bytes=1e6, flops_total=1e12, train_seconds=100.0)

    grid = [cell(d, n, 2.5) for d in ("64", "96", "128") for n in ("2", "3")]
    grid[3]["val_bpb"] = 2.2  # d 96, n_mid 3
    records.write(tmp_path / "sweep1c-learned" / "sweep.jsonl", grid[:5])
    with pytest.raises(SystemExit, match="the clock sweep 1 has 5 of 6 cells"):
        alloc.allocation(tmp_path, "learned", clock=True)
    capsys.readouterr()
    main("best", "--out", tmp_path)  # an unfinished clock sweep is named, and the other methods still listed
    assert "learned at matched seconds: learned: the clock sweep 1 has 5 of 6 cells" in capsys.readouterr().out
    records.write(tmp_path / "sweep1c-learned" / "sweep.jsonl", grid)
    records.write(tmp_path / "sweep1-learned" / "sweep.jsonl",
                  [cell(d, n, 2.4 if (d, n) == ("64", "2") else 2.6) for d in ("64", "96", "128", "192")
                   for n in ("2", "3", "5")])
    assert alloc.allocation(tmp_path, "learned") == {"d-model": "64", "n-heads": "2", "n-mid": "2"}
    assert alloc.allocation(tmp_path, "learned", clock=True) == {"d-model": "96", "n-heads": "2", "n-mid": "3"}
    assert alloc.allocation(tmp_path, "uniform", clock=True) == {}  # no clock sweep yet
    capsys.readouterr()
    main("best", "--out", tmp_path)
    said = capsys.readouterr().out
    assert "learned at matched seconds: {'d-model': '96', 'n-heads': '2', 'n-mid': '3'}" in said
    assert "flat at matched seconds" not in said
    sweep_results, out = tmp_path / "sweep-records.jsonl", tmp_path / "restored"
    main("collect", "--out", tmp_path, "--results", sweep_results)
    rows = records.load(sweep_results)
    assert sorted({(r["stage"], r.get("clock", False)) for r in rows}) == [(1, False), (1, True), (2, False)]
    assert len(rows) == 12 + 6 + 3
    main("restore", "--out", out, "--results", tmp_path / "none.jsonl", "--sweep-results", sweep_results)
    assert records.load(out / "sweep1c-learned" / "sweep.jsonl") == records.load(tmp_path / "sweep1c-learned" /
                                                                                  "sweep.jsonl")
    assert alloc.allocation(out, "learned", clock=True) == {"d-model": "96", "n-heads": "2", "n-mid": "3"}
    table = alloc.sweep_table(sweep_results)
    assert "| learned | 1 (clock) | d-model 96, n-mid 3 | **2.2000** |" in table
    calls = []
    monkeypatch.setattr(alloc.arms, "train_arm", lambda run, data, method, **kw: calls.append((run.name, kw)) or
                        {"bytes": 1.0, "train_seconds": 100.0, "command": "x", "provenance": {}})
    final = ("final", "--data", tmp_path, "--out", tmp_path, "--seeds", "0", "--ngrams", "--clock")
    main(*final, "--series", "w", "--allocation", "clock", "--arms", "learned-ngrams")
    ((name, kw),) = calls  # at the clock sweep's best, for flat-ngrams' median seconds (every seed's, not --seeds')
    assert name == "final-learned-ngrams-x1-walloc-clock-w-seed0" and kw["time_budget"] == 100.0
    assert " --d-model 96 --n-heads 2 --n-mid 3 " in " ".join(kw["flags"]) + " "
    done = json.loads((tmp_path / name / "final.json").read_text())
    assert done["budget"]["allocation"] == "clock" and done["budget"]["series"] == "w"
    assert tmp_path / name not in [run for run, _, _ in alloc._stale(tmp_path)]  # judged by the clock allocation
    for bad, message in ((["--allocation", "clock"], "needs --clock and a --series"),
                         (["--series", "w", "--allocation", "clock", "--arms", "uniform-ngrams"],
                          "uniform has no clock sweep yet")):
        with pytest.raises(SystemExit, match=message):
            main(*final, *bad)


def test_train_arm_refuses_to_resume_an_interrupted_run_of_another_model(tmp_path, monkeypatch):
    """`--resume` restores the saved config whatever the flags say, so resuming an interrupted run under other
    model flags would train the old model under the new arm's name: train_arm refuses and names the field."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(arms.saved_config(["--preset", "small", "--boundaries", "uniform",
                                                                   "--d-model", "96"])))
    (run / "latest").write_text("step_000010")
    started = []
    monkeypatch.setattr(arms.subprocess, "run", lambda args, **kw: started.append(args) or 1 / 0)
    with pytest.raises(ValueError, match="model.d_model: 96 -> 64"):
        arms.train_arm(run, tmp_path, "uniform", rate=0.2, seed=0, flags=["--boundaries", "uniform", "--d-model", "64"])
    assert not started
    with pytest.raises(ZeroDivisionError):  # the same model: it resumes
        arms.train_arm(run, tmp_path, "uniform", rate=0.2, seed=0, flags=["--boundaries", "uniform", "--d-model", "96"])
    assert "--resume" in started[0]


def test_allocation_clock_sweep_is_stale_once_stage_2_chooses_other_settings(tmp_path, monkeypatch, capsys):
    """A clock sweep whose cells trained at the preset's byte window is refused (StaleSweep, which `best` names)
    once stage 2 chooses another window, and `retire` judges a run at the wall-clock allocation by today's stage 2;
    the clock sweep run again at stage 2's choice is current."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else ["byte-window=4,8"])

    def cell(axes, bpb, second=None):
        config = arms.saved_config(["--preset", "small",
                                    *alloc._flags("learned", {**axes, **(second or {})}, True)[2:]])
        return records.make("sweep", "cell", 0, command="x", axes=axes, val_bpb=bpb, config=config)

    clock = tmp_path / "sweep1c-learned" / "sweep.jsonl"
    records.write(clock, [cell({"n-mid": "2"}, 2.0), cell({"n-mid": "3"}, 2.1)])
    assert alloc.allocation(tmp_path, "learned", clock=True) == {"n-mid": "2"}  # no stage 2 yet
    run = alloc._run_dir(tmp_path, "learned-ngrams", 1.0, True, 0, "w", allocated="clock")
    run.mkdir()
    (run / "final.json").write_text(json.dumps({"flags": alloc._flags("learned", {"n-mid": "2"}, True)[2:]}))
    assert alloc._stale(tmp_path) == []

    def stage_2(name, best):
        records.write(tmp_path / name / "sweep.jsonl", [
            records.make("sweep", "cell", 0, command="x", axes={"byte-window": w}, val_bpb=2.0 if w == best else 2.1)
            for w in ("4", "8")])

    stage_2("sweep2-learned", "8")  # the plain stage 2: the plain arms' choice, not the clock sweep's (n-grams)
    with pytest.raises(alloc.UnfinishedSweep, match="stage 2 with n-grams has not run"):
        alloc.allocation(tmp_path, "learned", clock=True)
    with pytest.raises(alloc.UnfinishedSweep, match="stage 2 with n-grams has not run"):
        alloc.allocation(tmp_path, "learned", ngrams=True)
    ((_, _, now),) = alloc._stale(tmp_path)  # judged, meanwhile, by the plain stage 2's choice
    assert " --byte-window 8 " in " ".join(now) + " "
    stage_2("sweep2n-learned", "4")
    assert alloc.allocation(tmp_path, "learned") == {"byte-window": "8"}
    assert alloc.allocation(tmp_path, "learned", ngrams=True) == {"byte-window": "4"}
    with pytest.raises(alloc.StaleSweep, match=r"model\.byte_window: 8 -> 4\); move sweep1c-learned aside"):
        alloc.allocation(tmp_path, "learned", clock=True)
    capsys.readouterr()
    alloc.cmd_best(types.SimpleNamespace(out=tmp_path))
    assert "learned at matched seconds: learned: the clock sweep trained with other settings" in capsys.readouterr().out
    ((stale, _, now),) = alloc._stale(tmp_path)  # trained at window 8: retire moves it aside
    assert stale == run and " --byte-window 4 " in " ".join(now) + " "
    records.write(clock, [cell({"n-mid": n}, b, {"byte-window": "4"}) for n, b in (("2", 2.2), ("3", 2.1))])
    assert alloc.allocation(tmp_path, "learned", clock=True) == {"n-mid": "3", "byte-window": "4"}


def test_allocation_retire_moves_a_stale_clock_sweep_aside_and_keeps_its_cells_logged(tmp_path, monkeypatch):
    """`retire` moves a clock sweep that stage 2 made stale into OUT/retired/ and marks its collected cells retired
    with what changed: they stay in the records and the sweep table, `restore` no longer rebuilds them, the clock
    allocation is empty until the sweep runs again, and `collect` adds the new cells beside the retired ones; a
    current clock sweep stays where it is."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else ["byte-window=4,8"])

    def cell(axes, bpb, second=None):
        config = arms.saved_config(["--preset", "small",
                                    *alloc._flags("learned", {**axes, **(second or {})}, True)[2:]])
        return records.make("sweep", "cell", 0, command="x", axes=axes, val_bpb=bpb, config=config, bytes=1e6,
                            flops_total=1e13, train_seconds=600.0)

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        alloc.main()

    out, results, sweep_results = tmp_path / "out", tmp_path / "records.jsonl", tmp_path / "sweep.jsonl"
    clock = out / "sweep1c-learned" / "sweep.jsonl"
    records.write(clock, [cell({"n-mid": "2"}, 2.0), cell({"n-mid": "3"}, 2.1)])  # at the preset's window 8
    records.write(out / "sweep2n-learned" / "sweep.jsonl", [
        records.make("sweep", "cell", 0, command="x", axes={"byte-window": w}, val_bpb=b, bytes=1e6,
                     flops_total=1e13, train_seconds=600.0) for w, b in (("4", 2.0), ("8", 2.1))])
    main("collect", "--out", out, "--results", sweep_results)
    main("retire", "--out", out, "--results", results, "--sweep-results", sweep_results)
    moved = out / "retired" / "sweep1c-learned-1"
    assert not clock.parent.exists() and (moved / "sweep.jsonl").exists()
    assert alloc.allocation(out, "learned", clock=True) == {}  # not refused: it has to run again
    retired = [r for r in records.load(sweep_results) if r.get("retired")]
    assert len(retired) == 2 and all(r["clock"] and r["retired"]["dir"] == str(moved.resolve())
                                     and r["retired"]["changed"] == ["model.byte_window: 8 -> 4"] for r in retired)
    table = alloc.sweep_table(sweep_results)
    assert "| learned | 1 (clock, retired: model.byte_window: 8 -> 4) | n-mid 2 | **2.0000** |" in table
    main("restore", "--out", tmp_path / "new", "--results", results, "--sweep-results", sweep_results)
    assert not (tmp_path / "new" / "sweep1c-learned").exists() and (tmp_path / "new" / "sweep2n-learned").exists()
    assert records.load(sweep_results)[-1]["ngrams"] and "| learned | 2 (n-grams) | byte-window 4 |" in table
    records.write(clock, [cell({"n-mid": n}, b, {"byte-window": "4"}) for n, b in (("2", 2.2), ("3", 2.1))])
    main("retire", "--out", out, "--results", results, "--sweep-results", sweep_results)  # current: it stays
    assert clock.exists() and not (out / "retired" / "sweep1c-learned-2").exists()
    main("collect", "--out", out, "--results", sweep_results)
    assert sorted((r["axes"]["n-mid"], r["val_bpb"], bool(r.get("retired")))
                  for r in records.load(sweep_results) if r.get("clock")) == [
        ("2", 2.0, True), ("2", 2.2, False), ("3", 2.1, False), ("3", 2.1, True)]
    assert alloc.allocation(out, "learned", clock=True) == {"n-mid": "3", "byte-window": "4"}


def test_allocation_report_keeps_stage_1s_runs_beside_todays_once_stage_2_retired_them(tmp_path):
    """Once stage 2 gives learned a byte window, `retire` marks its stage-1 runs: the report shows today's runs
    in the tables, stage 1's (with the same flat runs) in a block of their own, and the levers table stage 1's
    levers where they differ and stage 2's own (today − stage 1, paired over seeds), not flat's unchanged runs."""
    alloc = _allocation()
    doc = {"documents": 2, "bytes": [10, 10], "bits": [10.0, 12.0]}

    def final(arm, seed, bpb, flags=(), **extra):
        return records.make("allocation", arm, seed, command="x", method=arm.removesuffix("-ngrams"),
                            flags=list(flags), test={"bpb": bpb, "bytes": 20, "per_document": doc},
                            val={"bpb": bpb}, train_seconds=1.0, flops_total=1e13,
                            budget={"scale": 1.0, "match": "flops-total", "flops_budget": 1e13}, **extra)

    window = ["--byte-window", "4"]
    path, preset = tmp_path / "records.jsonl", tmp_path / "preset.jsonl"
    records.write(path, [final("flat-ngrams", 0, 2.0), final("flat-ngrams", 1, 2.1),
                         *[final("learned-ngrams", s, b, retired={"now": window}) for s, b in ((0, 1.9), (1, 2.05))],
                         *[final("learned-ngrams", s, b, window) for s, b in ((0, 1.8), (1, 1.9))]])
    report = alloc.report(path)
    today, stage_1 = report.split("At stage 1's allocation")
    assert "| learned-ngrams | 2 | 1.8500" in today and "| -0.2000 [-0.2000, -0.2000] |" in today
    assert "| learned-ngrams | 2 | 1.9750" in stage_1.split("Retired runs")[0] and "| flat-ngrams | 2 |" in stage_1
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[5].strip()
            for line in alloc.levers_table(path, preset).splitlines()[2:]}
    assert rows["allocation: stage 2's byte window and rate", "learned-ngrams", "total FLOPs"].startswith("-0.1250 [")
    assert not any(k[0].startswith("allocation: stage 2") and "flat-ngrams" in k[1] for k in rows)  # unchanged
    records.write(path, [*records.load(path),  # stage 2 moved patches too: learned's gap to them is a row
                         *[final("uniform-ngrams", s, b, retired={"now": window}) for s, b in ((0, 2.0), (1, 2.1))],
                         *[final("uniform-ngrams", s, b, window) for s, b in ((0, 1.95), (1, 2.0))]])
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line.split("|")[5].strip()
            for line in alloc.levers_table(path, preset).splitlines()[2:]}
    assert rows["allocation: stage 2's byte window and rate", "learned-ngrams − uniform-ngrams", "total FLOPs"] \
        .startswith("-0.0500 [")  # learned moved -0.1 and -0.15, patches -0.05 and -0.1
    records.write(path, [r for r in records.load(path) if not r.get("retired")])  # no stage-2 retirement: no block
    assert "At stage 1's allocation" not in alloc.report(path) and "stage 2" not in alloc.levers_table(path, preset)


def test_allocation_retire_reinstates_the_runs_a_later_stage_2_chose_again(tmp_path, monkeypatch):
    """When stage 2 goes back to the settings a retired final run and a retired clock sweep trained at, `retire`
    moves today's stale run aside under a new name (NAME-2: a run of its name was retired before) and returns the
    old ones to their places with their records current again; `final` then trains nothing (the saved model is
    compared, so `--byte-window 8` given is the preset's window 8), and a second `retire` moves nothing."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else ["byte-window=4,8"])
    out, results, sweep_results = tmp_path / "out", tmp_path / "records.jsonl", tmp_path / "sweep.jsonl"

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        alloc.main()

    def stage_2(best):
        records.write(out / "sweep2n-learned" / "sweep.jsonl", [
            records.make("sweep", "cell", 0, command="x", axes={"byte-window": w}, val_bpb=2.0 if w == best else 2.1)
            for w in ("4", "8")])

    config = arms.saved_config(["--preset", "small", *alloc._flags("learned", {"n-mid": "2"}, True)[2:]])
    records.write(out / "sweep1c-learned" / "sweep.jsonl", [  # at the preset's byte window 8
        records.make("sweep", "cell", 0, command="x", axes={"n-mid": n}, val_bpb=b, config={**config, "model": {
            **config["model"], "n_mid": int(n)}}) for n, b in (("2", 2.0), ("3", 2.1))])
    main("collect", "--out", out, "--results", sweep_results)
    place = alloc._run_dir(out, "learned-ngrams", 1.0, False, 0)

    def trained(window):  # a finished final run of learned-ngrams, seed 0, at this byte window, and its record
        flags = alloc._flags("learned", {"byte-window": window} if window else {}, True)[2:]
        place.mkdir(parents=True)
        done = {"flags": flags, "config": arms.saved_config(["--preset", "small", *flags]), "method": "learned"}
        (place / "final.json").write_text(json.dumps(done))
        place.with_name(place.name + ".log").write_text(f"window {window or 8}")
        return records.make("allocation", "learned-ngrams", 0, command="x", method="learned", flags=flags,
                            run_dir=str(place.resolve()), test={"bpb": 2.0}, val={"bpb": 2.0}, train_seconds=1.0,
                            budget={"scale": 1.0, "match": "flops-total", "flops_budget": 1e13})

    stage_2("4")
    records.write(results, [trained(None)])  # stage 1's run, at the preset's window
    main("retire", "--out", out, "--results", results, "--sweep-results", sweep_results)
    first = out / "retired" / place.name
    assert not place.exists() and first.exists() and (out / "retired" / "sweep1c-learned-1").exists()
    records.write(results, [*records.load(results), trained("4")])  # stage 2's
    stage_2("8")  # a later stage 2 goes back to window 8
    main("retire", "--out", out, "--results", results, "--sweep-results", sweep_results)
    second = out / "retired" / (place.name + "-2")
    assert "--byte-window 4 " in " ".join(json.loads((second / "final.json").read_text())["flags"])
    assert (out / "retired" / (second.name + ".log")).read_text() == "window 4"
    assert "--byte-window" not in json.loads((place / "final.json").read_text())["flags"] and not first.exists()
    assert place.with_name(place.name + ".log").read_text() == "window 8"
    rows = records.load(results)
    assert [(r["run_dir"], bool(r.get("retired"))) for r in rows] == [(str(place.resolve()), False),
                                                                     (str(second.resolve()), True)]
    assert alloc._before_stage_2(rows) == rows[:1]  # today's run is stage 1's again
    assert (out / "sweep1c-learned").exists() and not any(r.get("retired") for r in records.load(sweep_results))
    assert alloc.allocation(out, "learned", clock=True) == {"n-mid": "2", "byte-window": "8"}
    assert "--byte-window" in alloc._flags("learned", alloc.allocation(out, "learned", ngrams=True), True)
    monkeypatch.setattr(alloc.arms, "train_arm", lambda *a, **k: pytest.fail("trained a finished run again"))
    main("final", "--data", tmp_path, "--out", out, "--ngrams", "--arms", "learned-ngrams", "--seeds", "0")
    main("retire", "--out", out, "--results", results, "--sweep-results", sweep_results)
    assert records.load(results) == rows and sorted(p.name for p in (out / "retired").iterdir()) == [
        second.name, second.name + ".log"]


def test_allocation_restore_keeps_retired_runs_so_a_new_machine_reinstates_them(tmp_path, monkeypatch):
    """`restore` on a new machine (another OUT) rebuilds the retired final runs and clock sweeps in OUT/retired/
    too, so when a later stage 2 chooses their settings again `retire` returns them to their places and clears
    their records' marks (matched by name in OUT, not by the old machine's path) instead of `final` training the
    same models again."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else ["byte-window=4,8"])

    def main(*argv):
        monkeypatch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        alloc.main()

    config = arms.saved_config(["--preset", "small", *alloc._flags("learned", {"n-mid": "2"}, True)[2:]])
    cells = [records.make("sweep", "cell", 0, command="x", axes={"n-mid": n}, val_bpb=b, method="learned", stage=1,
                          clock=True, config={**config, "model": {**config["model"], "n_mid": int(n)}},
                          retired={"changed": [], "dir": "/old/alloc/retired/sweep1c-learned-1"})
             for n, b in (("2", 2.0), ("3", 2.1))]
    stage_2 = [records.make("sweep", "cell", 0, command="x", axes={"byte-window": w}, val_bpb=b, method="learned",
                            stage=2, ngrams=True) for w, b in (("4", 2.1), ("8", 2.0))]  # window 8 chosen again
    flags = alloc._flags("learned", {}, True)[2:]  # stage 1's run: the preset's window 8
    run = {"flags": flags, "config": arms.saved_config(["--preset", "small", *flags]), "method": "learned",
           "ngrams": True, "train_seconds": 1.0, "test": {"bpb": 2.0}, "val": {"bpb": 2.0},
           "budget": {"scale": 1.0, "match": "flops-total", "flops_budget": 1e13}}
    results, sweep_results, out = tmp_path / "records.jsonl", tmp_path / "sweep.jsonl", tmp_path / "new"
    records.write(sweep_results, cells + stage_2)
    records.write(results, [records.make("allocation", "learned-ngrams", 0, command="x",
                                         run="final-learned-ngrams-x1-seed0",
                                         run_dir="/old/alloc/retired/final-learned-ngrams-x1-seed0",
                                         retired={"now": [*flags, "--byte-window", "4"]}, **run)])
    main("restore", "--out", out, "--results", results, "--sweep-results", sweep_results)
    assert not (out / "final-learned-ngrams-x1-seed0").exists() and alloc.allocation(out, "learned", clock=True) == {}
    main("retire", "--out", out, "--results", results, "--sweep-results", sweep_results)
    place = out / "final-learned-ngrams-x1-seed0"
    assert json.loads((place / "final.json").read_text())["restored"] and not list((out / "retired").iterdir())
    (rec,) = records.load(results)
    assert rec["run_dir"] == str(place.resolve()) and "retired" not in rec
    assert not any(r.get("retired") for r in records.load(sweep_results))
    assert alloc.allocation(out, "learned", clock=True) == {"n-mid": "2", "byte-window": "8"}
    monkeypatch.setattr(alloc.arms, "train_arm", lambda *a, **k: pytest.fail("trained a finished run again"))
    main("final", "--data", tmp_path, "--out", out, "--ngrams", "--arms", "learned-ngrams", "--seeds", "0")


def test_allocation_retire_judges_what_it_can_while_another_methods_sweep_runs(tmp_path, monkeypatch, capsys):
    """`retire` while one method's stage 2 is under way moves aside another method's stale run and leaves the
    unjudgeable method's runs where they are, saying which sweep it waits for, instead of stopping at the first."""
    alloc = _allocation()
    monkeypatch.setattr(alloc, "_axes", lambda method, stage, clock=False, ngrams=False:
                        ["n-mid=2,3"] if stage == 1 else ["byte-window=4,8"])
    out = tmp_path / "out"

    def stage_2(method, cells):
        records.write(out / f"sweep2n-{method}" / "sweep.jsonl", [
            records.make("sweep", "cell", 0, command="x", axes={"byte-window": w}, val_bpb=b) for w, b in cells])

    def trained(method, window):
        run = alloc._run_dir(out, f"{method}-ngrams", 1.0, False, 0)
        flags = alloc._flags(method, {"byte-window": window}, True)[2:]
        run.mkdir(parents=True)
        (run / "final.json").write_text(json.dumps({"flags": flags, "method": method,
                                                    "config": arms.saved_config(["--preset", "small", *flags])}))
        return run

    stage_2("whitespace", [("4", 2.1), ("8", 2.0)])  # finished: window 8
    stage_2("learned", [("4", 2.0)])  # under way
    stale, waiting = trained("whitespace", "4"), trained("learned", "4")
    monkeypatch.setattr(sys, "argv", ["run.py", "retire", "--out", str(out), "--results", str(tmp_path / "r.jsonl"),
                                      "--sweep-results", str(tmp_path / "s.jsonl")])
    alloc.main()
    assert not stale.exists() and (out / "retired" / stale.name).exists() and waiting.exists()
    assert "left as they are until a sweep finishes: learned: stage 2 with n-grams has 1 of 2 cells" in \
        capsys.readouterr().out


def test_headline_controls_pair_each_control_with_the_pairs_seeds(monkeypatch):
    """The headline's confound controls: each control's seeds are paired with uniform's and learned-w1-vb's runs of
    the same seed at the headline budget (transcribed seeds included, FLOPs shown where both runs kept them), an
    interval only from two seeds, and a set short of its declared seeds says so."""
    sys.path.insert(0, str(Path(arms.__file__).parent))
    import report

    def row(arm, seed, test, budget=2.4e7, **extra):
        return {"arm": arm, "seed": seed, "match": "flops", "budget_bytes": budget, "test": {"bpb": test, "rate": 0.2},
                **extra}

    rows = [row("uniform", 10, 2.10), row("learned-w1-vb", 10, 2.05),  # transcribed: no FLOPs
            row("uniform", 14, 2.10, flops=1e13), row("learned-w1-vb", 14, 2.00, flops=1.02e13),
            row("uniform-ee", 10, 2.08), row("uniform-ee", 14, 2.06, flops=1e13),
            row("uniform-ee", 15, 2.0),  # its pair has not run: left out
            row("learned-w1-vb-padded", 14, 2.03, flops=0.97e13, flops_padded=1e13),
            row("uniform-ee", 11, 1.0, budget=6e6)]  # another budget
    monkeypatch.setattr(report, "_leaderboard", lambda: tuple(rows))
    text = report.headline_controls()
    assert "| `uniform-ee` | 10 | 2.0800 | 0.200 | — | -0.0200 | -0.0300 |" in text
    assert "| `learned-w1-vb-padded` | 14 | 2.0300 | 0.200 | 0.970× / 1.000× | -0.0700 | -0.0300 |" in text
    assert ("`uniform-ee`, 2 of its 9 declared seeds (10–18), incomplete: test, control − uniform -0.0300 ["
            in text) and "`learned-w1-vb` − control -0.0450 [" in text
    assert "`learned-w1-vb-padded`, 1 of its 5 declared seeds (14–18): not yet two seeds" in text


def test_readme_names_a_headline_control_only_once_all_its_declared_seeds_ran(monkeypatch):
    """The README's headline line: a control's clause appears when every declared seed is paired, with the
    difference the control is for (learned-w1-vb − uniform-ee; learned-w1-vb-padded − uniform)."""
    sys.path.insert(0, str(Path(arms.__file__).parent))
    import report

    def row(arm, seed, test):
        return {"arm": arm, "seed": seed, "match": "flops", "budget_bytes": 2.4e7, "test": {"bpb": test}}

    rows = [row(a, s, b + 0.001 * (s % 3)) for s in range(10, 19)
            for a, b in (("uniform", 2.10), ("learned-w1-vb", 2.06), ("uniform-ee", 2.09))]
    rows += [row("learned-w1-vb-padded", s, 2.07 + 0.001 * (s % 3)) for s in range(14, 18)]  # seed 18 missing
    monkeypatch.setattr(report, "_leaderboard", lambda: tuple(rows))
    lb = report._script("leaderboard")
    said = report._controls_said(lb)
    assert said == (" The difference with the early-exit loss given to the patches too (`uniform-ee`, 9 seeds): "
                    "-0.0300 [-0.0300, -0.0300].")
    rows.append(row("learned-w1-vb-padded", 18, 2.07))
    assert report._controls_said(lb).endswith("; with learned's padded token slots counted (`learned-w1-vb-padded`, "
                                              "5 seeds): -0.0300 [-0.0300, -0.0300].")
    rows[:] = [r for r in rows if r["arm"] != "uniform-ee" or r["seed"] != 12]
    assert "uniform-ee" not in report._controls_said(lb)


def test_allocation_plot_draws_each_arms_mean_at_the_flops_it_spent(tmp_path):
    """The study's figure: per arm, the matched-total-FLOPs runs' mean test BPB and standard error over seeds at
    each budget's mean FLOPs; clock runs only from a wall-clock-allocation series that still holds learned's runs;
    retired runs and runs without their FLOPs left out; a PNG from it."""
    alloc = _allocation()

    def final(arm, seed, bpb, flops, scale=1.0, match="flops-total", **budget):
        return records.make("allocation", arm, seed, command="x", method=arm.removesuffix("-ngrams"),
                            test={"bpb": bpb}, flags=[], flops_total=flops,
                            budget={"scale": scale, "match": match, "flops_budget": 1e12 * scale, **budget})

    clock = {"allocation": "clock"}
    path = tmp_path / "records.jsonl"
    records.write(path, [
        final("learned-ngrams", 0, 2.0, 1.0e12), final("learned-ngrams", 1, 2.2, 1.1e12),
        final("learned-ngrams", 0, 1.8, 4e12, scale=4.0), final("flat-ngrams", 0, 2.3, 1e12),
        {**final("flat-ngrams", 1, 9.0, 1e12), "retired": {"now": []}},
        final("learned-ngrams", 0, 2.1, 5e11, match="time", series="x", **clock),
        final("flat-ngrams", 0, 2.4, 6e11, match="time", series="x", **clock),
        final("flat-ngrams", 0, 2.5, 7e11, match="time", series="w", **clock),  # learned's runs there retired
        {**final("learned-ngrams", 0, 2.9, 7e11, match="time", series="w", **clock), "retired": {"now": []}},
        final("flat-ngrams", 0, 2.6, 8e11, match="time", series="a"),  # not at the clock allocation
        {**final("flat-ngrams", 2, 2.7, 1e12), "flops_total": None}])
    pts = alloc.budget_points(records.load(path))
    (x, y, se, n), x4 = pts["flops"]["learned-ngrams"]
    assert (x, y, n) == (pytest.approx(1.05e12), pytest.approx(2.1), 2) and se == pytest.approx(0.1)
    assert x4 == (4e12, 1.8, 0.0, 1)
    assert pts["flops"]["flat-ngrams"] == [(1e12, 2.3, 0.0, 1)]
    assert pts["clock"] == {"learned-ngrams": [(5e11, 2.1, 0.0, 1)], "flat-ngrams": [(6e11, 2.4, 0.0, 1)]}
    pytest.importorskip("matplotlib")
    out = alloc.plot(path, tmp_path / "fig.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_study_cost_sums_every_records_training_time_by_part_retired_runs_included(monkeypatch, tmp_path):
    """The study's cost table: each part's runs, retired ones and training hours from the records (retired runs
    count: they were trained), parts in the study's order, and the headline's controls at its budget only."""
    sys.path.insert(0, str(Path(arms.__file__).parent))
    import report

    def write(name, rows):
        base = {"schema": 1, "study": "allocation", "arm": "flat", "seed": 0, "command": "-", "source": "transcribed",
                "provenance": {}}
        records.write(tmp_path / name, [{**base, **r} for r in rows])
        return tmp_path / name

    def final(scale, match, seconds, **extra):
        return {"train_seconds": seconds, "budget": {"scale": scale, "match": match, "flops_budget": 1e13}, **extra}

    files = {"PRESET_RECORDS": write("preset.jsonl", [{"train_seconds": 1800}]),
             "SWEEP_RECORDS": write("sweep.jsonl", [
                 {"method": "flat", "stage": 1, "clock": True, "train_seconds": 3600, "retired": {"dir": "x"}},
                 {"method": "flat", "stage": 2, "ngrams": True, "train_seconds": 1800},
                 {"method": "flat", "stage": 1, "train_seconds": 1800}]),
             "RECORDS": write("final.jsonl", [final(4, "flops-total", 7200), final(1, "time", 900),
                                              final(1, "flops-total", 900, retired={"now": []}),
                                              final(1, "flops-total", 1800)])}
    for name, path in files.items():  # report._script is cached: monkeypatch, so later tests read the real records
        monkeypatch.setattr(report._script("allocation"), name, path)
    monkeypatch.setattr(report, "_leaderboard", lambda: (
        {"arm": "uniform-ee", "seed": 10, "match": "flops", "budget_bytes": 2.4e7, "train_seconds": 3600},
        {"arm": "uniform-ee", "seed": 11, "match": "flops", "budget_bytes": 6e6, "train_seconds": 3600},  # budget
        {"arm": "uniform", "seed": 10, "match": "flops", "budget_bytes": 2.4e7, "train_seconds": 3600}))  # no control
    rows = report.study_cost().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == [
        "first screen (every method in the preset's shape)", "sweep cells, stage 1",
        "sweep cells, stage 2 with the n-gram tables", "sweep cells, matched seconds", "final runs, x1, total FLOPs",
        "final runs, x1, wall-clock", "final runs, x4, total FLOPs", "the headline's confound controls (2.4e7 bytes)",
        "**all**"]
    assert rows[3] == "| sweep cells, matched seconds | 1 | 1 | 1.0 |"
    assert rows[4] == "| final runs, x1, total FLOPs | 2 | 1 | 0.8 |"
    assert rows[7] == "| the headline's confound controls (2.4e7 bytes) | 1 | 0 | 1.0 |"
    assert rows[-1] == "| **all** | 9 | 2 | 6.5 |"


def test_allocation_queue_runs_the_study_in_order_and_saves_after_every_step(tmp_path):
    """experiments/allocation/queue.sh (the study's remaining steps, run again after any interruption) restores
    OUT first, collects after every sweep and scores after every final call, retires after stage 2 before any
    final, gives whitespace 3 seeds where the others get 5
    (bpe, entropy and hnet 3, with and without n-grams), runs half the budget's five n-gram arms right after clock
    series x, then the BPE transformer's clock sweep and clock series y (learned beside it, 5 seeds), the headline's
    controls with leaderboard's, and last the 4x budget's five n-gram arms, both at matched
    FLOPs with 3 seeds, 4x one arm at a time (each record collected as it lands): seed 0 at the x1 allocation, then
    seed 0 one width step wider, then seeds 1 and 2 at the width validation chose (the width check)."""
    log = tmp_path / "calls"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/bash\necho "$(basename "$(dirname "$1")")/$(basename "$1") ${{*:2}}" >> {log}\n')
    stub.chmod(0o755)
    script = Path(arms.__file__).parent / "allocation" / "queue.sh"
    subprocess.run(["bash", str(script), "DATA", str(tmp_path / "out")],
                   env={"PYTHON": str(stub), "PATH": "/usr/bin:/bin"}, check=True)
    calls = [line.split() for line in log.read_text().splitlines()]
    assert calls[0][:2] == ["allocation/run.py", "restore"]
    for i, call in enumerate(calls):
        if call[1] == "sweep":
            assert calls[i + 1][1] == "collect"
        if call[1] == "final":
            assert calls[i + 1][1] == "evaluate"
    finals = [c for c in calls if c[1] == "final"]
    assert calls.index(["allocation/run.py", "retire", "--out", str(tmp_path / "out")]) < calls.index(finals[0])

    def values(c: list[str], flag: str) -> list[str]:
        """The words after `flag` (which every final call gives) up to the next flag."""
        after = c[c.index(flag) + 1:]
        return after[:next((i for i, x in enumerate(after) if x.startswith("--")), len(after))]

    def value(c: list[str], flag: str) -> str | None:
        return c[c.index(flag) + 1] if flag in c else None

    seeds = {}
    for c in finals:
        for arm in values(c, "--arms"):
            for s in values(c, "--seeds"):
                scale = value(c, "--scale") or "1"
                seeds.setdefault((arm, "--clock" in c, "--convention" in c, scale), set()).add(int(s))
    assert seeds["whitespace-ngrams", False, False, "1"] == seeds["whitespace-ngrams", True, False, "1"] == {0, 1, 2}
    assert seeds["learned-ngrams", True, False, "1"] == seeds["uniform-ngrams", False, False, "1"] == set(range(5))
    assert seeds["whitespace", False, False, "1"] == {0, 1, 2} and seeds["learned", False, False, "1"] == set(range(5))
    assert seeds["learned-ngrams-chunks", False, False, "1"] == {0, 1, 2}
    for other in ("bpe", "entropy", "hnet"):  # with and without n-grams, as the issue asks
        assert seeds[other, False, False, "1"] == seeds[f"{other}-ngrams", False, False, "1"] == {0, 1, 2}
    for scale in ("4", "0.5"):
        assert {arm for arm, clock, _, s in seeds if s == scale} == {
            "learned-ngrams", "flat-ngrams", "bpe-lm-ngrams", "uniform-ngrams", "whitespace-ngrams"}
        assert all(seeds[key] == {0, 1, 2} and not key[1] for key in seeds if key[3] == scale)
    at = {s: [i for i, c in enumerate(calls) if c[1] == "final" and value(c, "--scale") == s] for s in ("4", "0.5")}
    x4 = [(values(calls[i], "--seeds"), values(calls[i], "--arms"), value(calls[i], "--allocation")) for i in at["4"]]
    five = ("learned-ngrams", "flat-ngrams", "bpe-lm-ngrams", "whitespace-ngrams", "uniform-ngrams")
    assert x4 == [(["0"], [arm], None) for arm in five] + [(["0"], [arm], "wider") for arm in five] + [
        ([str(s)], [arm], "chosen") for s in (1, 2) for arm in five]
    assert min(at["4"]) > max(i for i, c in enumerate(calls) if c[1] == "final" and "--scale" not in c)
    series_x = [i for i, c in enumerate(calls) if c[1] == "final" and value(c, "--series") == "x"]
    first_control = next(i for i, c in enumerate(calls) if c[0] == "leaderboard/run.py")
    assert max(series_x) < min(at["0.5"]) and max(at["0.5"]) < first_control  # it reads series x, before the rest
    series_y = [i for i, c in enumerate(calls) if c[1] == "final" and value(c, "--series") == "y"]
    bpe_clock = calls.index(["allocation/run.py", "sweep", "--data", "DATA", "--out", str(tmp_path / "out"),
                             "--clock", "--methods", "bpe-lm"])
    assert max(at["0.5"]) < bpe_clock < min(series_y) and max(series_y) < first_control
    assert all(value(calls[i], "--allocation") == "clock" and values(calls[i], "--arms") == [
        "learned-ngrams", "bpe-lm-ngrams"] for i in series_y)
    assert seeds["bpe-lm-ngrams", True, False, "1"] == set(range(5))
    controls = [c for c in calls if c[0] == "leaderboard/run.py"]
    assert [c[c.index("--arms") + 1] for c in controls] == ["uniform-ee", "learned-w1-vb-padded"]


def test_hierarchy_arms_build_the_models_they_name_and_report_pairs_by_seed(tmp_path):
    """experiments/hierarchy: the two-level arms are HierLMs whose three token-side layers match the one-level arms'
    three mid layers; every arm is matched in total FLOPs; the report pairs arms by seed."""
    from learntok.cli.train import parse_train_args
    from learntok.model import build_model
    from learntok.model.hier import HierLM

    spec = importlib.util.spec_from_file_location("hier_run", Path(arms.__file__).parent / "hierarchy" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    for name in run.ARMS:
        cfg = parse_train_args(["--preset", "small", *arms.arm_flags(name, run.RATE)])
        model = build_model(cfg.model, cfg.boundary)
        assert isinstance(model, HierLM) == name.startswith("hier2")
        assert cfg.model.n_mid + 2 * cfg.model.inner_layers == 3 and arms.FLOPS_CONVENTION[name] == "total"
    path = tmp_path / "records.jsonl"
    rows = [*_rows("hier1-learned", [2.0, 2.1, 2.2]), *_rows("hier2-learned", [1.9, 2.0, 2.0])]
    records.write(path, [records.make("hierarchy", r.pop("arm"), r.pop("seed"), command="x",
                                      prov={"git_sha": "0" * 40}, **r) for r in rows])
    text = run.report(path)
    assert "| hier1-learned − hier2-learned | +0.1333" in text and "(3 seeds)" in text
    assert run.summary(path) == ""  # no second-level figures in these records: nothing to say of its policy
    coin = {"boundary/inner_p_mean": 0.5, "boundary/inner_neg_log_pi": 0.69, "boundary/inner_rate": 0.5,
            "loss/early2": 2.0, "loss/early": 2.1}
    rows = [*_rows("hier1-learned", [2.0, 2.1, 2.2]), *_rows("hier2-learned", [2.1, 2.25, 2.3])]
    records.write(path, [records.make("hierarchy", r.pop("arm"), r.pop("seed"), command="x",
                                      prov={"git_sha": "0" * 40}, train_last=coin, **r) for r in rows])
    line = run.summary(path)
    assert "3 runs, 1 settings" in line and "within 0.003 nats" in line  # ln 2 − 0.69
    assert "two levels − one: +0.1167 [" in line and "one level better" in line
    learner = {**coin, "boundary/inner_p_mean": 0.3, "boundary/inner_neg_log_pi": 0.40}  # coin at 0.3: 0.611
    rows = [*_rows("hier1-learned", [2.0, 2.1, 2.2]), *_rows("hier2-learned", [2.1, 2.25, 2.3])]
    learnt = _rows("hier2-learned-g03-s50", [2.0, 2.1, 2.2])
    records.write(path, [records.make("hierarchy", r.pop("arm"), r.pop("seed"), command="x", prov={"git_sha": "0" * 40},
                                      train_last=last, **r)
                         for rs, last in ((rows, coin), (learnt, learner)) for r in rs])
    line = run.summary(path)
    assert "a coin (−log π within 0.02 nats of an input-blind policy) in 3 of 6 runs (2 settings)" in line
    assert "not yet solved" not in line


def test_hierarchy_variance_table_lists_each_measurement_setting_apart(tmp_path):
    """experiments/hierarchy variance: records measured with other draws or batch sizes are other measurements:
    the table lists them under their settings instead of averaging them with the default ones (and `variance`
    keys finished measurements by the same settings, so asking for more draws measures again)."""
    spec = importlib.util.spec_from_file_location("hier_run", Path(arms.__file__).parent / "hierarchy" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)

    def record(seed, samples, snr, gammas=(), arm="hier2-learned"):
        names = ("normalised", "centred, gamma=1", "centred", *(f"centred, gamma={g:g}" for g in gammas))
        rows = [{"name": n, "group": "policy", "snr": snr * (i + 1), "cosine": 0.5} for i, n in enumerate(names)]
        variance = {"batch": 8, "samples": samples, "reference_samples": 4 * samples, "groups": {"policy": 128},
                    "rows": rows, "gamma": 0.9, **({"gammas": list(gammas)} if gammas else {})}
        return records.make("hierarchy", f"{arm}/level2/trained", seed, command="x",
                            prov={"git_sha": "0" * 40}, level=2, state="trained", estimator="normalised",
                            variance=variance)

    path = tmp_path / "records-variance.jsonl"
    records.write(path, [record(0, 64, 0.5), record(1, 64, 0.25)])
    one = run.variance_table(path)
    assert "| hier2-learned | 2 | trained | 2 | 0.3750 (0.5000, 0.2500) | 2, 4 |" in one
    assert "draws per estimator" not in one
    records.write(path, [record(0, 64, 0.5), record(1, 64, 0.25), record(0, 256, 0.125)])
    two = run.variance_table(path)
    assert "64 draws per estimator, 256 reference draws" in two and "256 draws per estimator, 1024" in two
    assert "| hier2-learned | 2 | trained | 1 | 0.1250 (0.1250) | 8 |" in two
    assert "| hier2-learned | 2 | trained | 2 | 0.3750" in two
    assert run._settings(records.load(path)[2]) == (8, 256, 1024, ())
    records.write(path, [record(0, 64, 0.5), record(0, 64, 0.01, gammas=(0.0,)), record(1, 64, 0.03, gammas=(0.0,))])
    three = run.variance_table(path)
    assert "discounts 0 added" in three and "| hier2-learned | 2 | trained | 1 | 0.5000 (0.5000) | 2 |" in three
    assert three.count("for SNR 1") == 1  # the discounts' setting gets the discount table only
    assert "| hier2-learned | 2 | trained | 2 | 0.9 (the run's) | 0.0600 (0.0300, 0.0900) | 0.50 |" in three
    assert "| hier2-learned | 2 | trained | 2 | 0 | 0.0800 (0.0400, 0.1200) | 0.50 |" in three
    assert "| hier2-learned | 2 | trained | 2 | 1 | 0.0400 (0.0200, 0.0600) |" in three
    records.write(path, [record(0, 64, 0.5), record(0, 64, 0.25, arm="hier2-learned-g03")])  # arms apart
    four = run.variance_table(path)
    assert "| hier2-learned | 2 | trained | 1 | 0.5000" in four
    assert "| hier2-learned-g03 | 2 | trained | 1 | 0.2500" in four


def test_hierarchy_loss_spread_separates_the_levels_draws(tmp_path):
    """experiments/hierarchy sensitivity: fixed patches and fixed pairs draw nothing, so the loss does not spread;
    a learned second level under a held first level spreads it over its own draws only; the table reads the
    records per arm and state."""
    import torch

    from learntok.vocab import BOS

    from .conftest import build_model

    spec = importlib.util.spec_from_file_location("hier_run", Path(arms.__file__).parent / "hierarchy" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    batch = torch.randint(32, 127, (3, 49), generator=torch.Generator().manual_seed(0))
    batch[:, 0] = BOS
    ids, targets = batch[:, :-1], batch[:, 1:]
    fixed = run.loss_spread(build_model("uniform", None, {"inner_layers": 1, "inner_rate": 0.5}), ids, targets, 2, 3)
    assert fixed["byte_sd_second"] == 0 and fixed["byte_sd_first"] == 0 and fixed["loss"] > 0
    model = build_model("learned", None, {"inner_layers": 1, "inner_rate": 0.5}, policy_window=0)
    learned = run.loss_spread(model, ids, targets, 3, 4)
    assert learned["byte_sd_second"] > 0 and learned["byte_sd_first"] > 0 and model.training
    assert learned["row_sd_second"] < learned["byte_sd_second"]  # a sequence's mean averages bytes' spread
    assert learned["first_level_flips"] == 0  # the first level held exactly under the second level's draws

    path = tmp_path / "records-sensitivity.jsonl"
    records.write(path, [records.make("hierarchy", f"hier2-learned/sensitivity/{state}", seed, command="x",
                                      prov={"git_sha": "0" * 40}, state=state, draws=[3, 4], batch=3, **learned)
                         for state in ("init", "trained") for seed in (0, 1)])
    text = run.sensitivity_table(path)
    assert text.count("| hier2-learned |") == 2 and "| hier2-learned | trained | 2 |" in text
