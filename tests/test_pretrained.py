"""Shareable checkpoints and the learned tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import learntok
from learntok.cli import main
from learntok.segment import Segmenter, vocab_stats
from learntok.train import train

from .conftest import tiny_train_config


@pytest.fixture
def run(tmp_path, text_corpus):
    train(tiny_train_config(tmp_path / "run", text_corpus, max_steps=2), log=lambda *_: None)
    return tmp_path / "run"


def test_export_round_trip_and_strict_loading(tmp_path, run):
    out = tmp_path / "export"
    assert main(["export", str(run), str(out)]) == 0
    names = {p.name for p in out.iterdir()}  # the map image needs matplotlib
    hf = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
          "modeling_learntok.py"}  # the transformers files (tests/test_transformers.py)
    assert {"README.md", "config.json", "model.safetensors", *hf} <= names <= {
        "README.md", "config.json", "model.safetensors", "boundary_map.png", *hf}
    model = learntok.from_pretrained(out)
    ref = learntok.from_pretrained(run)
    ids = torch.tensor([[256, *b"def f(x):\n    return x"]])
    noise = torch.full(ids.shape, 0.5)
    torch.testing.assert_close(model(ids, noise=noise).logits, ref(ids, noise=noise).logits, rtol=0, atol=0)
    # missing tensor
    tensors = load_file(str(out / "model.safetensors"))
    tensors.pop("head.weight")
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="missing"):
        learntok.from_pretrained(out)
    # older / other config version
    cfg = json.loads((out / "config.json").read_text())
    cfg["config_version"] = 0
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="not supported"):
        learntok.from_pretrained(out)
    # a hand-made config without a section, a damaged one: errors that name the problem (a KeyError traceback, and
    # "an exported model directory, not a training run", before)
    (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "boundary"}))
    with pytest.raises(ValueError, match="no boundary"):
        learntok.from_pretrained(out)
    (out / "config.json").write_text(json.dumps(cfg)[:40])
    with pytest.raises(ValueError, match="not valid JSON"):
        learntok.from_pretrained(out)
    with pytest.raises(FileNotFoundError):
        learntok.from_pretrained(tmp_path / "nothing")


def test_export_refuses_a_run_directory_or_another_models_config(tmp_path, run, capsys):
    """`export RUN RUN` replaced the run's config.json (its --resume then failed); a directory with another
    config.json lost it. Both are one-line errors that change nothing; an earlier export is replaced."""
    before = (run / "config.json").read_bytes()
    assert main(["export", str(run), str(run)]) == 2
    assert "a training run's directory" in capsys.readouterr().err
    assert (run / "config.json").read_bytes() == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "gpt2"}')
    assert main(["export", str(run), str(other)]) == 2
    assert "not a learntok export's config" in capsys.readouterr().err
    assert (other / "config.json").read_text() == '{"model_type": "gpt2"}' and len(list(other.iterdir())) == 1
    assert main(["export", str(run), str(tmp_path / "e")]) == 0
    assert main(["export", str(run), str(tmp_path / "e")]) == 0  # again into its own export


def test_segmenter_spans_tile_the_text(run):
    seg = Segmenter.from_pretrained(run, window=16)  # small window: texts span several windows
    text = "héllo wörld 日本語 😀 " * 5
    spans = seg.segment(text)
    data = text.encode()
    assert spans[0].start == 0 and spans[-1].end == len(data)
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))
    assert b"".join(data[s.start:s.end] for s in spans) == data
    assert seg.segment_batch([text, ""]) == [spans, []]
    # boundaries agree with the model's forward pass on a short text
    short = b"x = 1\nprint(x)\n"
    mask = seg.model(torch.tensor([[256, *short]]), noise=torch.full((1, len(short) + 1), 0.5)).boundaries.mask
    starts = [s.start for s in Segmenter(seg.model, greedy=True).segment(short)]
    assert starts == [0] + [i for i in range(1, len(short)) if mask[0, i + 1]]


def test_segment_and_show_draw_the_same_boundaries(run):
    """`learntok segment` (Segmenter) and `learntok show` (compute_map) draw with the evaluation seed by default, so
    one text splits the same way in both."""
    import inspect

    from learntok.cli.use import SegmentArgs
    from learntok.cli.viz import ShowArgs
    from learntok.draw import EVAL_SEED
    from learntok.tokenizer import LearnedTokenizer
    from learntok.viz.boundary_map import compute_map

    assert SegmentArgs.__dataclass_fields__["seed"].default is None  # None: the tokenizer's saved seed or its default
    assert ShowArgs.__dataclass_fields__["seed"].default == EVAL_SEED == \
        inspect.signature(LearnedTokenizer).parameters["seed"].default
    model = learntok.from_pretrained(run)
    data = ("def tokenize(text):\n    return text.split()  # words\n" * 2).encode()
    bmap = compute_map(model, data, window=15)
    starts = [s.start for s in Segmenter(model, window=16).segment(data)]
    assert starts == [i for i in range(len(data)) if i == 0 or bmap.mask[i]]
    other = compute_map(model, data, window=15, seed=EVAL_SEED + 1)  # negative control: another seed, other draws
    assert (other.mask != bmap.mask).any()


def test_long_texts_have_no_forced_boundary_at_window_starts():
    """Texts longer than the window are read in overlapping windows: with a strategy whose boundaries are a rule
    on the bytes (whitespace), segmenting with a 16-byte window gives the rule's boundaries everywhere, as one
    pass over the whole text does (consecutive windows, context=0, would force one at every window start)."""
    from learntok.draw import draw_text

    from .conftest import build_model

    model = build_model("whitespace").eval()
    data = b"tokenization of long documents should not depend on where a window starts " * 3
    whole = draw_text(model, data, len(data))[1]
    starts = [s.start for s in Segmenter(model, window=16).segment(data)]
    assert starts == [i for i in range(len(data)) if i == 0 or whole[i]]
    cut = draw_text(model, data, 15, context=0)[1]
    assert not cut[15:].equal(whole[15:])  # negative control: the forced boundaries of consecutive windows


def test_model_card_image_needs_only_matplotlib(run, tmp_path, monkeypatch):
    """Without matplotlib the card has no image; any other ImportError (a bug in learntok.viz) is not hidden."""
    import sys

    import learntok.viz.mpl
    from learntok.card import write_model_card

    model = learntok.from_pretrained(run)
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)  # not installed, as importlib.util.find_spec sees it
        card = write_model_card(tmp_path, model, 64, run)
    assert "boundary map" not in card.read_text() and not (tmp_path / "boundary_map.png").exists()
    pytest.importorskip("matplotlib")

    def broken(*a, **k):
        raise ImportError("a bug in learntok.viz")

    monkeypatch.setattr(learntok.viz.mpl, "save_map_png", broken)
    with pytest.raises(ImportError, match="a bug in learntok.viz"):
        write_model_card(tmp_path, model, 64, run)


def test_vocab_stats_counts_whole_words():
    data = b"the cat sat"
    from learntok.segment import Span

    spans = [Span(0, 3, "the"), Span(3, 7, " cat"), Span(7, 9, " s"), Span(9, 11, "at")]
    st = vocab_stats([data], [spans])
    assert st["segments"] == 4 and st["mean_bytes"] == pytest.approx(11 / 4)
    assert st["whole_word_share"] == pytest.approx(2 / 4)
    # any script: "Grüße" is a word, "caf" before "é" is not, and a piece cutting a character is none
    data = "Grüße café".encode()
    cut = data.index("é".encode())
    spans = [Span(0, 7, "Grüße"), Span(7, cut, " caf"), Span(cut, cut + 1, "?"), Span(cut + 1, len(data), "?")]
    assert vocab_stats([data], [spans])["whole_word_share"] == pytest.approx(1 / 4)


def test_segment_and_vocab_commands(tmp_path, run, text_corpus, capsys):
    assert main(["segment", str(run), "--text", "import os\n", "--format", "jsonl"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "".join(x["text"] for x in lines) == "import os\n"
    assert main(["vocab", str(run), "--data", str(text_corpus), "--max-bytes", "2000"]) == 0
    assert "whole words" in capsys.readouterr().out
    # a file is segmented in blocks (bounded memory); the spans equal those of the same text given whole
    text = (text_corpus / "valid" / "0.txt").read_text()[:3000]
    (tmp_path / "f.txt").write_text(text)
    assert main(["segment", str(run), "--file", str(tmp_path / "f.txt"), "--format", "jsonl",
                 "--out", str(tmp_path / "file.jsonl")]) == 0
    assert main(["segment", str(run), "--text", text, "--format", "jsonl", "--out", str(tmp_path / "t.jsonl")]) == 0
    assert (tmp_path / "file.jsonl").read_text() == (tmp_path / "t.jsonl").read_text()
    assert main(["segment", str(run), "--file", str(tmp_path / "nope.txt")]) == 2
    assert "--file" in capsys.readouterr().err
    # segment edges inside a character: recoverable in jsonl, shown as bytes in text (both U+FFFD once)
    cjk = "東京は日本の首都です。" * 4
    assert main(["segment", str(run), "--text", cjk, "--format", "jsonl"]) == 0
    pieces = [json.loads(x)["text"] for x in capsys.readouterr().out.splitlines()]
    assert "".join(pieces).encode("utf-8", "surrogateescape") == cjk.encode()
    assert any(p.encode("utf-8", "surrogateescape") != p.encode("utf-8", "replace") for p in pieces)  # cuts occur
    assert main(["segment", str(run), "--text", cjk]) == 0
    shown = capsys.readouterr().out
    assert "\ufffd" not in shown and "\\x" in shown
    assert main(["vocab", str(run), "--data", str(text_corpus), "--max-bytes", "-5"]) == 2
    assert "--max-bytes must be >= 1" in capsys.readouterr().err


def test_a_loaded_bpe_model_saves_its_tokenizer_again(tmp_path):
    """save_pretrained(model) of a model loaded from a directory copies its strategy's files from there: a copy
    of a BPE-guided model used to have no tokenizer and could not be loaded (push_to_hub(model) likewise)."""
    from learntok.pretrained import save_pretrained

    from .conftest import build_model, prescribed_for

    run = tmp_path / "run"
    first = save_pretrained(build_model("bpe", run).eval(), tmp_path / "first", seq_len=64, source_dir=run, card=False)
    model = learntok.from_pretrained(first)
    copy = save_pretrained(model, tmp_path / "copy", seq_len=64, card=False)
    assert (copy / "bpe_tokenizer.json").read_bytes() == (first / "bpe_tokenizer.json").read_bytes()
    again = learntok.from_pretrained(copy)
    ids = torch.tensor([[256, *b"def f(x):\n    return x"]])
    kw = {"noise": torch.full(ids.shape, 0.5), "prescribed": prescribed_for(model, ids)}
    torch.testing.assert_close(again(ids, **kw).logits, model(ids, **kw).logits, rtol=0, atol=0)


def test_an_entropy_model_given_by_path_travels_with_the_export(tmp_path):
    """A run with --entropy-model PATH has no entropy_model/ of its own: the export used to leave it out and keep
    PATH in config.json, so the export could not be loaded once PATH was gone (another machine, the Hub)."""
    import shutil

    from learntok.entropy_model import EntropyLM, EntropyModelConfig, save_entropy_model
    from learntok.pretrained import save_pretrained

    from .conftest import build_model

    torch.manual_seed(0)
    ent = save_entropy_model(EntropyLM(EntropyModelConfig()), tmp_path / "ent")
    run = tmp_path / "run"
    run.mkdir()
    model = build_model("entropy", run, entropy_model=str(ent)).eval()
    out = save_pretrained(model, tmp_path / "exp", seq_len=64, source_dir=run, card=False)
    assert json.loads((out / "config.json").read_text())["boundary"]["entropy_model"] == ""
    shutil.rmtree(ent)
    again = learntok.from_pretrained(out)
    assert again.boundary.theta == model.boundary.theta  # the saved theta, calibrated for these very weights
    ids = torch.tensor([[256, *b"the cat sat on the mat"]])
    torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_exporting_again_into_a_directory_leaves_no_stale_strategy_file(tmp_path):
    """A strategy file the model does not have (here a calibration table) is removed from an earlier export into
    the same directory, not left to be loaded with the new model."""
    from learntok.boundaries.rates import RATE_CALIBRATION, Calibration
    from learntok.pretrained import save_pretrained

    from .conftest import build_model

    model = build_model("learned").eval()
    model.boundary.calibration = Calibration(rates=(0.1, 0.5), offsets=(3.0, 3.0), info={})
    out = save_pretrained(model, tmp_path / "exp", seq_len=64, card=False)
    assert (out / RATE_CALIBRATION).exists()
    model.boundary.calibration = None
    save_pretrained(model, out, seq_len=64, card=False)
    assert not (out / RATE_CALIBRATION).exists() and learntok.from_pretrained(out).boundary.calibration is None
