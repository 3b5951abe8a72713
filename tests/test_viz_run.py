"""`learntok show / plot / report` on a real (3-step) training run, and the report rendered in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from learntok.cli.viz import cmd_plot, cmd_report, cmd_show
from learntok.train import train
from learntok.viz.curves import load_metrics, plot_boundaries, plot_bpb

from .conftest import tiny_train_config
from .test_viz import Page, model_boundaries

pytest.importorskip("matplotlib")

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run trained for 3 steps with an evaluation after each (same corpus as conftest's text_corpus)."""
    root = tmp_path_factory.mktemp("viz")
    corpus = root / "corpus"
    (corpus / "train").mkdir(parents=True)
    (corpus / "valid").mkdir()
    lines = Path(torch.__file__).read_text(encoding="utf-8").splitlines()
    for i in range(8):
        (corpus / "train" / f"{i}.txt").write_text("\n".join(lines[i * 200:(i + 1) * 200]) + "\n")
    (corpus / "valid" / "0.txt").write_text("\n".join(lines[1600:1800]) + "\n")
    train(tiny_train_config(root / "run", corpus, max_steps=3, eval_every=1), log=lambda *_: None)
    return root / "run"


def test_show_writes_html_and_png_with_the_checkpoints_probabilities(run_dir, tmp_path, capsys):
    from learntok.checkpoint import load_run

    text = "x = 1  # 東京 ü\n"
    rc = cmd_show([str(run_dir), "--text", text, "--html", str(tmp_path / "m.html"), "--png",
                   str(tmp_path / "m.png"), "--seed", "5", "--color", "never"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "rate" in out
    page = Page((tmp_path / "m.html").read_text(encoding="utf-8"))
    assert page.errors == [] and len(page.maps[0]) == len(text)
    _, model = load_run(run_dir)
    p, _ = model_boundaries(model, text.encode(), seed=5)
    last = np.cumsum([len(c.encode()) for c in text]) - 1
    np.testing.assert_allclose([float(s["attrs"]["data-p"]) for s in page.maps[0]], p[last], atol=1e-6)
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_show_rejects_bad_input_in_one_line(run_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        cmd_show([str(run_dir), "--file", str(tmp_path / "missing.txt")])
    with pytest.raises(ValueError, match="not both"):
        cmd_show([str(run_dir), "--text", "a", "--file", "b"])
    with pytest.raises(ValueError, match="empty"):
        cmd_show([str(run_dir), "--text", ""])
    with pytest.raises(FileNotFoundError, match="config.json"):
        cmd_show([str(tmp_path), "--text", "a"])
    with pytest.raises(ValueError, match=r"\.png, \.pdf or \.svg"):  # it used to write a PNG named x.txt
        cmd_show([str(run_dir), "--text", "a", "--png", str(tmp_path / "x.txt")])


def test_show_writes_the_image_type_its_suffix_names_with_nothing_cut_off(run_dir, tmp_path):
    """`--png x.pdf` used to write a PNG; a short text's title and colour bar were cut off at the figure's edge."""
    from PIL import Image

    assert cmd_show([str(run_dir), "--text", "hi", "--png", str(tmp_path / "m.pdf"), "--quiet"]) == 0
    assert (tmp_path / "m.pdf").read_bytes()[:4] == b"%PDF"
    assert cmd_show([str(run_dir), "--text", "hi", "--png", str(tmp_path / "m.svg"), "--quiet"]) == 0
    assert b"<svg" in (tmp_path / "m.svg").read_bytes()[:400]
    assert cmd_show([str(run_dir), "--text", "hi", "--png", str(tmp_path / "m.png"), "--quiet"]) == 0
    img = np.asarray(Image.open(tmp_path / "m.png").convert("L"))
    edges = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    assert (edges > 250).all()  # a white margin all round: nothing drawn runs into the edge


def test_load_metrics_splits_training_and_evaluation_lines(run_dir, tmp_path):
    run = load_metrics(run_dir)
    assert [r["step"] for r in run.train] == [1, 2, 3] and [r["step"] for r in run.evals] == [1, 2, 3]
    assert run.label == "run: learned, d32 L1-1-1, \u03c0\u0304=0.2"
    torn = tmp_path / "torn"
    torn.mkdir()
    text = (run_dir / "metrics.jsonl").read_text()
    (torn / "metrics.jsonl").write_text(text + '{"step": 4, "loss/au')  # a line still being written
    assert load_metrics(torn).skipped == 1 and len(load_metrics(torn).train) == 3
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        load_metrics(tmp_path / "nowhere")


def test_plot_writes_every_figure_for_several_runs(run_dir, tmp_path, capsys):
    other = tmp_path / "uniform_run"
    other.mkdir()
    shutil.copy(run_dir / "metrics.jsonl", other / "metrics.jsonl")
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["boundary"]["boundaries"], cfg["model"]["d_model"] = "uniform", 64
    (other / "config.json").write_text(json.dumps(cfg))
    assert cmd_plot([str(run_dir), str(other), "--out", str(tmp_path / "figs")]) == 0
    files = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert files == sorted(f"{n}.png" for n in ("bpb", "boundaries", "losses", "throughput"))
    assert all((tmp_path / "figs" / f).read_bytes()[:4] == b"\x89PNG" for f in files)
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(ValueError, match="invalid choice"):
        cmd_plot([str(run_dir), "--format", "jpg"])
    runs = [load_metrics(run_dir), load_metrics(other)]
    for fig in (plot_bpb(runs), plot_boundaries(runs)):
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert any(lab.startswith("run: learned, d32") for lab in labels)
        assert any(lab.startswith("uniform_run: uniform, d64") for lab in labels)
    ax_flops = plot_bpb(runs).axes[0]
    assert ax_flops.get_xscale() == "log"
    x, y = ax_flops.lines[0].get_data()
    assert list(y) == [r["val/bpb"] for r in runs[0].evals] and list(x) == [r["flops"] for r in runs[0].evals]


def _report(run_dir: Path, out: Path, **extra) -> Page:
    assert cmd_report([str(run_dir), "--out", str(out), "--samples", "2", "--sample-bytes", "40", *extra]) == 0
    page = Page(out.read_text(encoding="utf-8"))
    assert page.errors == []
    return page


def test_report_is_one_self_contained_file(run_dir, tmp_path):
    (run_dir / "eval.json").write_text(json.dumps({"heldout": {"bpb": 7.25, "rate": 0.19}, "tasks": ["piqa"]}))
    try:
        page = _report(run_dir, tmp_path / "r.html")
    finally:
        (run_dir / "eval.json").unlink()
    srcs = [a[k] for _, a in page.tags for k in ("src", "href") if k in a]
    assert len(srcs) == 4 and all(s.startswith("data:image/png;base64,") for s in srcs)  # the four figures
    assert not any(tag == "link" for tag, _ in page.tags)
    assert len(page.maps) == 2 and all(len(m) > 0 for m in page.maps)
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    for needle in ("heldout.bpb", "7.25", "model.d_model", "torch_threads", "Content-Security-Policy"):
        assert needle in text


def test_report_says_when_the_data_is_missing(run_dir, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    cfg = json.loads((moved / "config.json").read_text())
    cfg["data"]["source"] = str(tmp_path / "gone")
    (moved / "config.json").write_text(json.dumps(cfg))
    page = _report(moved, tmp_path / "r.html")
    assert page.maps == []
    assert "is not available here" in (tmp_path / "r.html").read_text(encoding="utf-8")


def _chromium(path: Path, profile: Path) -> tuple[str, list[str]]:
    """(dumped DOM, console lines) of a page loaded by headless Chromium."""
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout, [line for line in res.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.integration
def test_report_renders_in_headless_chromium_without_console_errors(run_dir, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip("chromium not installed (apt-get install chromium): cannot render the report in a browser")
    page = _report(run_dir, tmp_path / "r.html")
    dom, console = _chromium(tmp_path / "r.html", tmp_path / "profile")
    assert console == []
    n_chars = sum(len(m) for m in page.maps)
    assert 'data-ready="1"' in dom and f'data-chars="{n_chars}"' in dom  # the page's script ran to the end
    assert dom.count('class="bmap"') == 2 and dom.count("<img") == 4
    # Negative control: the same check sees a script error and a blocked external resource.
    bad = tmp_path / "bad.html"
    bad.write_text((tmp_path / "r.html").read_text(encoding="utf-8").replace(
        "</body>", '<img src="https://example.com/x.png"><script>undefinedFunction();</script></body>'))
    _, console = _chromium(bad, tmp_path / "profile")
    assert any("Uncaught ReferenceError" in line for line in console)
    assert any("Content Security Policy" in line for line in console)


def test_report_of_a_run_without_a_checkpoint_or_with_diverged_evaluations(tmp_path):
    """A run that has written config.json and metrics but no checkpoint yet gets a report with a note (it was an
    error); evaluations that all diverged (nan) neither make the best BPB nan nor leave the BPB chart empty."""
    from learntok.config import to_dict
    from learntok.presets import get_preset
    from learntok.viz.curves import load_metrics, plot_bpb
    from learntok.viz.report import _summary, write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(to_dict(get_preset("tiny"))))
    lines = [{"step": s, "bytes": 100 * s, "flops": 1e6 * s, "train/bpb": 3.0 - 0.1 * s} for s in range(1, 5)]
    lines += [{"step": 2, "bytes": 200, "flops": 2e6, "val/bpb": float("nan")},
              {"step": 4, "bytes": 400, "flops": 4e6, "val/bpb": 2.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    html = write_report(run).read_text()
    assert "no boundary maps: could not load a checkpoint" in html
    assert dict(_summary(load_metrics(run)))["best validation bits per byte"] == "2.5000"
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:-1]))  # only the nan one
    fig = plot_bpb([load_metrics(run)])
    assert all(len(ax.lines) == 1 for ax in fig.axes[:2])  # the training BPB instead
