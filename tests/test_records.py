"""Experiment records (learntok.records), the exact Student-t interval, and the docs' generated tables: every
generated block in README.md and docs/results.md must equal what the committed records give."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from learntok import records
from learntok.evaluation.stats import paired_interval, t_quantile

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def test_a_record_round_trips_and_carries_its_provenance(tmp_path):
    path = tmp_path / "r" / "records.jsonl"
    rec = records.make("s", "uniform", 3, command=["learntok", "train", "--seed", "3"], metrics={"bpb": 2.0})
    assert rec["command"] == "learntok train --seed 3" and rec["source"] == "measured"
    prov = rec["provenance"]
    assert len(prov["git_sha"]) == 40 and isinstance(prov["git_dirty"], bool)  # tests run in a git checkout
    assert prov["torch"] and prov["python"] and prov["cpu_count"] >= 1 and prov["time"].endswith("Z")
    records.append(path, rec)
    records.append(path, {**rec, "seed": 4})
    assert [r["seed"] for r in records.load(path)] == [3, 4] and records.load(path)[0] == rec
    assert records.select(records.load(path), seed=4)[0]["arm"] == "uniform"
    assert not list(path.parent.glob("*.tmp"))  # written by replacing, nothing left behind
    assert records.load(tmp_path / "none.jsonl") == []


def test_bad_records_are_refused_with_the_reason(tmp_path):
    path = tmp_path / "records.jsonl"
    good = records.make("s", "a", 0, command="x", prov={"git_sha": "0" * 40})
    path.write_text(json.dumps(good) + "\n" + json.dumps({k: v for k, v in good.items() if k != "command"}) + "\n")
    with pytest.raises(ValueError, match=r"records.jsonl:2: missing command"):
        records.load(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"records.jsonl:1: not JSON"):
        records.load(path)
    with pytest.raises(ValueError, match="without a git SHA"):  # a measurement must say which code made it
        records.write(path, [records.make("s", "a", 0, command="x", prov={"git_sha": None})])
    with pytest.raises(ValueError, match="source"):
        records.make("s", "a", 0, command="x", source="remembered")
    assert records.make("s", "a", 0, command="x", source="transcribed", prov={})["provenance"] == {}


@pytest.mark.parametrize("level, df, t", [(0.95, 1, 12.7062), (0.95, 2, 4.3027), (0.95, 4, 2.7764), (0.95, 8, 2.3060),
                                          (0.95, 10, 2.2281), (0.95, 30, 2.0423), (0.975, 8, 2.7515),
                                          (0.99, 5, 4.0321), (0.95, 1000, 1.9623)])
def test_t_quantile_is_exact_at_any_degrees_of_freedom(level, df, t):
    """Published two-sided quantiles to 4 decimals; the old table fell back to 1.96 from 10 degrees of freedom."""
    assert t_quantile(level, df) == pytest.approx(t, abs=6e-5)


def test_paired_interval_says_tie_when_it_covers_zero():
    p = paired_interval([0.02, 0.02, 0.03])
    assert p["mean"] == pytest.approx(0.023333, abs=1e-6) and not p["tie"] and p["lo"] > 0
    assert p["half"] == pytest.approx(t_quantile(0.95, 2) * p["se"])
    assert paired_interval([0.10, -0.05, 0.0])["tie"]
    with pytest.raises(ValueError, match="at least 2"):
        paired_interval([0.1])
    with pytest.raises(ValueError, match="integer df"):
        t_quantile(0.95, 0)


def test_the_docs_tables_are_generated_from_the_committed_records():
    """`python experiments/report.py --check`: a hand-typed table or a record changed without regenerating fails."""
    sys.path.insert(0, str(EXPERIMENTS))
    import report

    assert report.stale() == []
    blocks = {m["name"] for path in report.DOCS for m in report.BLOCK.finditer(path.read_text())}
    assert {"headline", "default-run", "matched-time", "readme-summary"} <= blocks
    text = "<!-- generated: headline -->\nTYPED BY HAND\n<!-- end: headline -->\n"
    assert "TYPED BY HAND" not in report.render(text) and "seeds 10–18" in report.render(text)
    with pytest.raises(ValueError, match="unknown generated block"):
        report.render("<!-- generated: nope -->\nx\n<!-- end: nope -->\n")


def test_every_committed_record_file_is_valid():
    files = sorted(EXPERIMENTS.rglob("records*.jsonl"))
    assert files
    for f in files:
        rows = records.load(f)
        assert rows, f
        assert all(r["source"] != "measured" or r["provenance"].get("git_sha") for r in rows)
