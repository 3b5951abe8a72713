"""Boundary maps: one HTML element per character carrying the model's own probability of the character's last
byte, windows for long texts, prescribed flags, terminal and PNG rendering (learntok.viz)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from learntok.boundaries import BoundaryOutput, BoundaryStrategy
from learntok.boundaries.whitespace import WhitespaceConfig
from learntok.viz.boundary_map import compute_map
from learntok.viz.cells import EOS_GLYPH, from_arrays
from learntok.viz.render import preview_line, render_ansi, render_html
from learntok.vocab import BOS, EOS

from .conftest import build_model

pytest.importorskip("matplotlib")

MIXED = "Grüße, 東京! 🙂 e\u0301 ok\n\tend"
"""2-, 3- and 4-byte characters, a combining mark, a newline and a tab."""

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")




class Page(HTMLParser):
    """Collects tag-balance errors, every tag's attributes, and the character spans inside .bmap blocks."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.maps: list[list[dict]] = []
        self._bmap_depth: int | None = None
        self._char: dict | None = None
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"unclosed {self.stack}")

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        classes = a.get("class", "").split()
        if tag == "div" and "bmap" in classes:
            self._bmap_depth = len(self.stack)
            self.maps.append([])
        if tag == "span" and "c" in classes and self._bmap_depth is not None:
            self._char = {"attrs": a, "text": ""}
            self.maps[-1].append(self._char)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "span":
            self._char = None
        if self._bmap_depth is not None and len(self.stack) == self._bmap_depth:
            self._bmap_depth = None

    def handle_data(self, data):
        if self._char is not None:
            self._char["text"] += data


def model_boundaries(model, data: bytes, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """p_t and a_t of each byte from one plain forward pass (byte i at position i + 1)."""
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([[BOS, *data]]), generator=torch.Generator().manual_seed(seed)).boundaries
    return out.probs[0, 1:].numpy(), out.mask[0, 1:].numpy()


def last_byte_index(text: str) -> list[int]:
    ends = np.cumsum([len(ch.encode()) for ch in text])
    return (ends - 1).tolist()


def test_html_has_one_span_per_character_with_the_models_last_byte_probability():
    model = build_model("learned")
    data = MIXED.encode()
    p, a = model_boundaries(model, data, seed=7)
    east = MIXED.index("東")
    first, last = sum(len(c.encode()) for c in MIXED[:east]), last_byte_index(MIXED)[east]
    assert abs(p[first] - p[last]) > 1e-6  # the byte whose p is shown matters for this input
    page = Page(render_html(compute_map(model, data, window=len(data), seed=7)))
    assert page.errors == []
    assert len(page.maps) == 1
    chars = page.maps[0]
    assert len(chars) == len(MIXED)  # one element per character (code point)
    for ch, span, i in zip(MIXED, chars, last_byte_index(MIXED)):
        attrs = span["attrs"]
        assert float(attrs["data-p"]) == pytest.approx(float(p[i]), abs=1e-6)
        assert ("b" in attrs["class"].split()) == bool(a[i])
        assert attrs["data-bytes"] == ch.encode().hex(" ")
        assert f"p={p[i]:.4f}" in attrs["title"] and f"bytes {ch.encode().hex(' ')}" in attrs["title"]
        if ch.isalnum():
            assert span["text"] == ch
    assert chars[MIXED.index("\n")]["text"] == "\u21b5\n"
    tokens = [int(s["attrs"]["data-t"]) for s in chars]
    assert tokens == np.cumsum(a)[last_byte_index(MIXED)].tolist()


def test_html_is_self_contained_and_escapes_markup():
    text = '<script>alert("x")</script> & "quotes"'
    bm = from_arrays(text.encode(), np.linspace(0, 1, len(text)), np.zeros(len(text), bool))
    page = Page(render_html(bm, title="<b>t</b>"))
    assert page.errors == []
    assert [s["text"] for s in page.maps[0]] == list(text)
    assert sum(1 for tag, _ in page.tags if tag == "script") == 1  # only the page's own script
    assert all(not a.get(k) or a[k].startswith("data:") for _, a in page.tags for k in ("src", "href"))


def test_cells_use_the_last_byte_and_count_tokens():
    data = "aé中😀".encode()  # 1 + 2 + 3 + 4 bytes
    probs = np.arange(10) / 10
    mask = np.array([1, 0, 1, 0, 0, 0, 1, 0, 0, 0], dtype=bool)
    cells = from_arrays(data, probs, mask).cells()
    assert [c.text for c in cells] == ["a", "é", "中", "😀"]
    assert [c.p for c in cells] == [0.0, 0.2, 0.5, 0.9]
    assert [c.boundary for c in cells] == [True, True, False, False]
    assert [c.inner for c in cells] == [False, False, False, True]  # 😀's first byte is a boundary
    assert [c.token for c in cells] == [1, 2, 2, 3]
    assert cells[3].hex == "f0 9f 98 80"
    packed = from_arrays([0x61, EOS, 0xFF, 0x62], [0.1, 1.0, 0.3, 0.4], [False, True, False, False]).cells()
    assert [c.text for c in packed] == ["a", EOS_GLYPH, "\ufffd", "b"]
    assert packed[1].newline and packed[1].boundary and packed[2].p == 0.3


def test_long_text_is_mapped_in_overlapping_windows():
    """Each window after the first re-reads window // 4 bytes of context and keeps its new bytes' draws."""
    model = build_model("learned").eval()
    data = ("def f(x):\n    return x + 1  # ok\n" * 3).encode()
    window, ctx = 16, 4
    bm = compute_map(model, data, window=window, seed=3)
    gen = torch.Generator().manual_seed(3)
    probs, s = [], 0
    with torch.no_grad():
        while s < len(data):
            lead = 0 if s == 0 else ctx
            end = min(len(data), s - lead + window)
            out = model(torch.tensor([[BOS, *data[s - lead:end]]]), generator=gen).boundaries
            probs.append(out.probs[0, 1 + lead:])
            s = end
    np.testing.assert_allclose(bm.probs, torch.cat(probs).numpy(), atol=1e-6)
    whole, _ = model_boundaries(model, data, seed=3)  # negative control: one pass sees more context
    assert not np.allclose(bm.probs[window:], whole[window:], atol=1e-6)
    greedy = compute_map(model, data, window=window, greedy=True)
    assert (greedy.mask == (greedy.probs > 0.5)).all()


class EveryThird(BoundaryStrategy):
    """A prescribed strategy with `annotate` (like BPE guidance): flags at every third byte of the document."""

    config = WhitespaceConfig
    learns_by = "prescribed"

    def annotate(self, doc: bytes) -> np.ndarray:
        return np.arange(len(doc)) % 3 == 0

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        assert prescribed is not None and prescribed.shape == ids.shape
        mask = prescribed.clone()
        mask[:, 0] = True
        return BoundaryOutput(mask=mask, probs=mask.float())


def test_prescribed_flags_come_from_annotate_over_the_whole_text():
    model = build_model("whitespace")
    model.boundary = EveryThird(model.bcfg, 32)
    data = bytes(range(97, 97 + 26)) * 2
    bm = compute_map(model, data, window=16)  # windows of 16 bytes: per-window flags would restart the pattern
    assert bm.mask.tolist() == [i % 3 == 0 for i in range(len(data))]
    assert (bm.probs == bm.mask).all()


def test_plain_rendering_marks_characters_whose_last_byte_is_a_boundary():
    text = "Grüße 東京\n\tx y!"
    data = text.encode()
    mask = np.arange(len(data)) % 4 == 1  # bytes 1, 5, 9, 13, 17: the ends of r, ß, 京 and the space; inside 東
    bm = from_arrays(data, np.full(len(data), 0.5), mask)
    assert render_ansi(bm, color=False) == "G|rü|ße 東|京\u21b5\n\u2192x| y!"


def _cube(code: int) -> tuple[int, int, int]:
    i = code - 16
    return i // 36, (i // 6) % 6, i % 6


def test_preview_line_is_one_line_of_width_characters():
    data = ("line one\n" * 40).encode()
    line = preview_line(data, torch.rand(len(data)), torch.zeros(len(data), dtype=torch.bool), width=100)
    plain = ANSI.sub("", line)
    assert "\n" not in line and len(plain) == 100 and plain.startswith("line one\u21b5line")
    hi = preview_line(b"a", [1.0], [True])
    lo = preview_line(b"a", [0.0], [False])
    r, g, b = _cube(int(re.search(r"48;5;(\d+)", hi).group(1)))
    assert r >= 4 and g >= 4 and b <= 2  # p = 1: yellow, as in the paper's figures
    r, g, b = _cube(int(re.search(r"48;5;(\d+)", lo).group(1)))
    assert b > g  # p = 0: blue-purple
    assert "1;4;" in hi and "1;4;" not in lo  # drawn boundary: bold underline


def test_png_of_multibyte_text_is_written(tmp_path):
    from PIL import Image

    from learntok.viz.mpl import map_image, save_map_png

    model = build_model("learned")
    bm = compute_map(model, (MIXED * 3).encode(), window=63)
    path = tmp_path / "map.png"
    notices = save_map_png(bm, path, width=40)
    assert all(isinstance(n, str) and "\n" not in n for n in notices)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = np.asarray(Image.open(path).convert("RGB"))
    assert img.shape[0] > 50 and img.shape[1] > 200 and img.std() > 10  # a drawing, not a blank canvas
    arr = map_image(bm, width=40)
    assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3


def test_png_without_fonts_falls_back_with_one_notice(tmp_path, monkeypatch):
    from learntok.viz import mpl

    monkeypatch.setattr(mpl, "fonts", lambda: ())  # as if no candidate font were installed
    data = "東京 🙂".encode()
    bm = from_arrays(data, np.zeros(len(data)), np.zeros(len(data), bool))
    notices = mpl.save_map_png(bm, tmp_path / "m.png")
    assert len(notices) == 1 and "東" in notices[0] and "fonts-noto-cjk" in notices[0]
    assert (tmp_path / "m.png").stat().st_size > 0


def test_preview_sample_shows_the_validation_draw_of_a_packed_row():
    from learntok.viz.boundary_map import preview_sample

    model = build_model("learned")
    seq = torch.tensor([BOS, *b"ab cd = 1 + 2", EOS, *b"def f(x):\n    return x", 0x61])  # + one target byte
    with torch.no_grad():
        mask = model.eval()(seq[None, :-1], generator=torch.Generator().manual_seed(9)).boundaries.mask[0]
    assert mask[1:].any()  # some boundary to place
    shown = {EOS: EOS_GLYPH, ord("\n"): "\u21b5"}
    expected = "".join(("|" if a else "") + shown.get(b, chr(b)) for b, a in zip(seq[1:-1].tolist(), mask[1:]))
    assert preview_sample(model, seq, seed=9, color=False) == expected
    coloured = preview_sample(model, seq, seed=9, width=4)
    assert ANSI.sub("", coloured) == "ab c" and "\n" not in coloured
