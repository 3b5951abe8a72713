"""`learntok sweep`: the grid, every cell at one FLOPs or time budget, records, the table, resuming, bad axes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from learntok import records
from learntok.cli import UsageError, main
from learntok.cli.sweep import cells, parse_axes, table

BUDGET = "1.2e9"  # a few steps of the tiny model below


def _train_flags(corpus) -> list[str]:
    return ["--data", str(corpus), "--seq-len", "64", "--batch-size", "4", "--val-bytes", "512", "--eval-every", "0",
            "--ckpt-every", "2", "--d-model", "32", "--n-heads", "2", "--n-mid", "1", "--log-every", "1"]


def test_axes_multiply_and_zipped_axes_move_together():
    axes = parse_axes(("d-model=32,64", "n-mid,target-rate=2:0.5,4:0.25"))
    grid = cells(axes)
    assert grid == [{"d-model": "32", "n-mid": "2", "target-rate": "0.5"},
                    {"d-model": "32", "n-mid": "4", "target-rate": "0.25"},
                    {"d-model": "64", "n-mid": "2", "target-rate": "0.5"},
                    {"d-model": "64", "n-mid": "4", "target-rate": "0.25"}]


@pytest.mark.slow
def test_a_sweep_trains_every_cell_to_the_budget_records_it_and_resumes(text_corpus, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", str(out), "--axis", "byte-window=4,8", "--flops-budget", BUDGET, "--",
            *_train_flags(text_corpus)]
    assert main(argv) == 0
    rows = records.load(out / "sweep.jsonl")
    assert sorted(r["axes"]["byte-window"] for r in rows) == ["4", "8"]
    for r in rows:
        assert r["flops"] >= 1.2e9 and r["flops_total"] > r["flops"] and r["provenance"]["git_sha"]
        assert r["config"]["model"]["byte_window"] == int(r["axes"]["byte-window"])
        assert r["config"]["flops_budget"] == 1.2e9 and r["config"]["optim"]["schedule"] == "flops"
    assert "| byte-window |" in (out / "sweep.md").read_text()
    # resumable: a finished cell is not trained again; a cell whose record is lost but whose run finished is
    # recorded from its run without training; an interrupted cell continues from its checkpoint
    before = {r["axes"]["byte-window"]: r["val_bpb"] for r in rows}
    records.write(out / "sweep.jsonl", [])
    run = out / "byte-window_8__seed0"
    for ckpt in sorted(run.glob("step_*"))[1:]:  # back to the first checkpoint
        shutil.rmtree(ckpt)
    (run / "latest").write_text(sorted(p.name for p in run.glob("step_*"))[0] + "\n")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    capsys.readouterr()
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "byte-window_4__seed0: training" not in said and "byte-window_8__seed0: resuming" in said
    again = {r["axes"]["byte-window"]: r for r in records.load(out / "sweep.jsonl")}
    assert again["4"]["val_bpb"] == before["4"]  # recorded from its finished run, not trained again
    assert again["8"]["flops"] >= 1.2e9
    assert main(["sweep", str(out), "--report"]) == 0 and "| 4 |" in capsys.readouterr().out


@pytest.mark.slow
def test_the_python_api_sweeps_zipped_axes_and_resumes(text_corpus, tmp_path, capsys):
    """learntok.sweep: the command's grid from a dict (a tuple value moves two flags together), its records back;
    called again it trains nothing."""
    import learntok

    out = tmp_path / "api"
    rows = learntok.sweep(out, {"n-mid,target-rate": [(1, 0.5), (2, 0.25)]}, flops_budget=float(BUDGET),
                          train_flags=_train_flags(text_corpus))
    assert sorted((r["axes"]["n-mid"], r["axes"]["target-rate"]) for r in rows) == [("1", "0.5"), ("2", "0.25")]
    assert all(r["config"]["flops_budget"] == float(BUDGET) and r["flops"] >= float(BUDGET) for r in rows)
    assert {r["config"]["model"]["n_mid"] for r in rows} == {1, 2}
    capsys.readouterr()
    assert learntok.sweep(out, {"n-mid,target-rate": [(1, 0.5), (2, 0.25)]}, flops_budget=float(BUDGET),
                          train_flags=_train_flags(text_corpus)) == rows
    assert ": training" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="one of them"):
        learntok.sweep(out, {"d-model": [32]})


@pytest.mark.slow
def test_a_time_budget_sweep_trains_every_cell_for_the_same_seconds(text_corpus, tmp_path):
    out = tmp_path / "sweep"
    assert main(["sweep", str(out), "--axis", "d-model=32", "--time-budget", "1.5", "--",
                 *_train_flags(text_corpus)]) == 0
    (r,) = records.load(out / "sweep.jsonl")
    assert r["config"]["time_budget"] == 1.5 and r["config"]["optim"]["schedule"] == "time"
    assert r["config"]["flops_budget"] == 0 and r["budget"] == {"time_budget": 1.5}
    assert r["train_seconds"] >= 1.5 and r["flops_total"] > 0
    assert table([r]).startswith("| d-model |")


def test_bad_axes_and_cells_are_one_line_before_anything_trains(text_corpus, tmp_path, capsys):
    for axis, message in (("d-model", "FLAG=V1,V2"), ("n-mid,target-rate=2", "one value per flag"),
                          ("d-model=33", "cell {'d-model': '33'}"), ("bogus-flag=1", "cell {'bogus-flag': '1'}"),
                          ("seed=1,2", "the sweep sets --seed"), ("flops-budget=1e9,2e9", "sets --flops-budget"),
                          ("d-model=32,32", "a value is repeated"),
                          ("seq-len=64,4", "seq_len=4 is shorter than the byte window")):  # check_config's
        assert main(["sweep", str(tmp_path / "s"), "--axis", axis, "--flops-budget", "1e9", "--",
                     *_train_flags(text_corpus)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("learntok: error:") and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s").exists()
    assert main(["sweep", str(tmp_path / "s"), "--axis", "d-model=32"]) == 2
    assert "--flops-budget" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "s"), "--axis", "d-model=32", "--flops-budget", "1e9", "--time-budget",
                 "5"]) == 2
    assert "one of them" in capsys.readouterr().err
    for more in (["--seeds"], ["--seeds", "0", "0"]):
        assert main(["sweep", str(tmp_path / "s"), "--axis", "d-model=32", "--flops-budget", "1e9", *more]) == 2
        assert "distinct seeds" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "s"), "--axis", "d-model=32", "--flops-budget", "1e9", "--",
                 *_train_flags(text_corpus), "--seed", "3"]) == 2
    assert "--seed: the sweep sets these" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "none"), "--report"]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


def test_the_table_puts_the_best_cell_first():
    def row(d, bpb):
        return {"axes": {"d-model": d}, "val_bpb": bpb, "val_rate": 0.2, "byte_params": 1, "token_params": 2,
                "bytes": 1e6, "flops": 1e9, "flops_padded": 1e9, "flops_total": 2e9, "train_seconds": 3}
    text = table([row("64", 2.5), row("128", 2.1), row("128", 2.2)])
    body = [x for x in text.splitlines() if x.startswith("| 1") or x.startswith("| 6")]
    assert body[0].startswith("| 128 | 2 | 2.1500 ± 0.0500") and body[1].startswith("| 64 | 1 | 2.5000")
    assert json.dumps(row("1", 1.0))  # rows are JSON-ready
    with pytest.raises(ValueError, match="FLAG=V1,V2"):
        parse_axes(("=1,2",))


def test_a_cell_started_with_other_flags_is_refused(text_corpus, tmp_path, capsys):
    out = tmp_path / "sweep"
    cell = out / "byte-window_4__seed0"
    cell.parent.mkdir(parents=True)
    cell.with_name(cell.name + ".cell.json").write_text(json.dumps(["train", "--lr", "1"]) + "\n")
    assert main(["sweep", str(out), "--axis", "byte-window=4", "--flops-budget", BUDGET, "--",
                 *_train_flags(text_corpus)]) == 2
    assert "was started with other flags" in capsys.readouterr().err


def test_a_half_written_metrics_line_does_not_stop_the_sweep(tmp_path):
    """A kill can leave a metrics line cut short (training drops it when it resumes); the sweep's check of a cell
    skips it rather than ending in a JSON error that no rerun gets past."""
    from learntok.cli.sweep import _finished

    run = tmp_path / "cell"
    run.mkdir()
    done = {"step": 4, "flops_6n": 2e9, "val/bpb": 2.5}
    (run / "metrics.jsonl").write_text(json.dumps({"step": 4, "flops_6n": 2e9}) + "\n" + json.dumps(done) + "\n"
                                       + '{"step": 5, "loss/au')
    assert _finished(run, 1e9, "flops_6n") == done


def test_the_same_cell_with_out_spelled_another_way_is_not_refused(text_corpus, tmp_path, monkeypatch):
    """Cells are compared with their path flags resolved: OUT relative (or through a link) is the same cell."""
    from learntok.cli.sweep import _same_cell

    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path)
    cell = tmp_path / "sweep" / "byte-window_4__seed0"
    cell.parent.mkdir()
    _same_cell(cell, ["train", "--data", str(text_corpus), "--out", str(cell)])
    _same_cell(Path("sweep") / cell.name, ["train", "--data", str(text_corpus), "--out", f"sweep/{cell.name}"])
    _same_cell(cell, ["train", "--data", str(text_corpus), "--out", f"link/sweep/{cell.name}"])
    with pytest.raises(UsageError, match="other flags"):
        _same_cell(cell, ["train", "--data", str(text_corpus), "--out", f"other/{cell.name}"])
