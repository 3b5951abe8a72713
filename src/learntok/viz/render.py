"""Boundary maps as text: self-contained HTML, ANSI colours for terminals, and a one-line training preview.

Colours follow the paper's figures (blue = low, yellow = high boundary probability): a viridis ramp computed
here, so HTML and terminal output need no matplotlib. A drawn boundary (a_t = 1: a new token starts at this
character) is a red bar at the character's left edge in HTML/PNG and underlined bold text in a terminal.
"""

from __future__ import annotations

import html
import sys

import numpy as np

from learntok.viz.cells import BoundaryMap, Cell, from_arrays

# viridis at 0, 1/4, 1/2, 3/4, 1 (matplotlib's table): blue-purple for p = 0, yellow for p = 1
_RAMP = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)
BOUNDARY_RED = "#e8112d"


def rgb(p: float) -> tuple[int, int, int]:
    """The colour of probability p in [0, 1] (clipped; NaN counts as 0)."""
    p = 0.0 if not np.isfinite(p) else min(max(float(p), 0.0), 1.0)
    x = p * (len(_RAMP) - 1)
    i = min(int(x), len(_RAMP) - 2)
    c = _RAMP[i] + (x - i) * (_RAMP[i + 1] - _RAMP[i])
    return int(round(c[0])), int(round(c[1])), int(round(c[2]))


def hex_colour(p: float) -> str:
    r, g, b = rgb(p)
    return f"#{r:02x}{g:02x}{b:02x}"


def dark(p: float) -> bool:
    """True if text on colour p should be white (relative luminance below one half)."""
    r, g, b = rgb(p)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 128


# -- terminals -----------------------------------------------------------------------------------------------

def _ansi_bg(p: float) -> int:
    """Nearest entry of the xterm 256-colour 6x6x6 cube."""
    r, g, b = (round(c / 255 * 5) for c in rgb(p))
    return 16 + 36 * r + 6 * g + b


def _ansi(text: str, p: float, boundary: bool) -> str:
    fg = 231 if dark(p) else 16
    style = "1;4;" if boundary else ""
    return f"\x1b[{style}38;5;{fg};48;5;{_ansi_bg(p)}m{text}\x1b[0m"


def render_ansi(bmap: BoundaryMap, color: bool | None = None) -> str:
    """The map for a terminal: background shaded by p, drawn boundaries underlined and bold, lines broken at
    newlines (shown as ↵). color=False (or None when stdout is not a terminal): `|` before each boundary."""
    if color is None:
        color = sys.stdout.isatty()
    parts = []
    for c in bmap.cells():
        if color:
            parts.append(_ansi(c.text, c.p, c.boundary))
        else:
            parts.append(("|" if c.boundary else "") + c.text)
        if c.newline:
            parts.append("\n")
    return "".join(parts)


def ansi_legend(color: bool | None = None) -> str:
    """One line explaining the colours."""
    if color is None:
        color = sys.stdout.isatty()
    if not color:
        return "| = drawn boundary (a new token starts at the next character)"
    ramp = "".join(_ansi(f"{p:.1f} ", p, False) for p in np.linspace(0, 1, 6))
    return f"p = {ramp}  {_ansi('x', 0.5, True)} = drawn boundary"


def preview_map(bmap: BoundaryMap, width: int = 100, color: bool = True) -> str:
    """The first `width` characters of a map on one line (newlines shown as ↵, EOS as ␄); color=False puts
    `|` before boundaries instead (for logs that are not terminals)."""
    cells = bmap.cells()[:width]
    if not color:
        return "".join(("|" if c.boundary else "") + c.text for c in cells)
    return "".join(_ansi(c.text, c.p, c.boundary) for c in cells)


def preview_line(text_bytes: bytes, probs, mask, width: int = 100, color: bool = True) -> str:
    """One line of at most `width` characters: background by p, boundaries underlined and bold, ↵ for newlines.
    probs / mask (tensors or arrays) are per byte, aligned with text_bytes (drop the BOS position first)."""
    return preview_map(from_arrays(text_bytes, probs, mask), width=width, color=color)


# -- HTML ----------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:72em;padding:0 1em;
 color:#222;line-height:1.4}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
.bmap{font-family:"DejaVu Sans Mono",Menlo,Consolas,"Noto Sans Mono CJK JP",monospace;white-space:pre-wrap;
 word-break:break-all;line-height:1.7;font-size:15px;border:1px solid #ddd;padding:.6em;background:#fafafa}
.c{padding:1px 0;cursor:default}
.c.b{box-shadow:inset 2px 0 0 """ + BOUNDARY_RED + """}
.c.i{text-decoration:underline dotted """ + BOUNDARY_RED + """}
.c.hl{outline:1px solid #000}
.caption,.info{color:#555;font-size:.9em;margin:.3em 0}
.info{font-family:monospace;min-height:1.4em}
.legend span{display:inline-block;padding:0 .4em;font-family:monospace}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
th{background:#f3f3f3}img{max-width:100%}.note{color:#a33}
"""

# Hovering a character highlights every character of its token and prints its details under the map. On load
# the script counts the characters and tokens and stores them on <body> (a test checks it ran without error).
JS = """
(function () {
  "use strict";
  var nChars = 0;
  document.querySelectorAll(".bmap").forEach(function (m) {
    var groups = {}, current = [];
    var info = m.nextElementSibling;
    m.querySelectorAll(".c").forEach(function (c) {
      nChars += 1;
      (groups[c.dataset.t] = groups[c.dataset.t] || []).push(c);
    });
    m.dataset.tokens = String(Object.keys(groups).length);
    m.addEventListener("mouseover", function (e) {
      var c = e.target.closest(".c");
      if (!c) { return; }
      current.forEach(function (x) { x.classList.remove("hl"); });
      current = groups[c.dataset.t] || [];
      current.forEach(function (x) { x.classList.add("hl"); });
      if (info && info.classList.contains("info")) { info.textContent = c.title; }
    });
  });
  document.body.dataset.chars = String(nChars);
  document.body.dataset.ready = "1";
})();
"""

# Nothing may be fetched: images are data: URIs, styles and the script are inline. A violation would be a
# console error in a browser (the Chromium test looks for those).
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'")


def _title(c: Cell, probs: np.ndarray) -> str:
    shown = {"\u21b5": "newline", "\u2192": "tab", " ": "space", "\u2404": "EOS (document separator)"}
    name = shown.get(c.text, repr(c.text))
    parts = [f"{name}  bytes {c.hex}", f"p={c.p:.4f}", f"token {c.token}"]
    if c.boundary:
        parts.append("boundary")
    if c.end - c.start > 1:
        parts.append("p per byte " + " ".join(f"{q:.3f}" for q in probs[c.start:c.end]) + " (last byte shown)")
    if c.inner:
        parts.append("a boundary falls inside this character")
    return " \u00b7 ".join(parts)


def html_map(bmap: BoundaryMap) -> str:
    """The map as an HTML fragment: a caption, then one <span class="c"> per character with data-p (p of its
    last byte), data-t (token index), data-bytes (hex) and a hover title, then an info line for hovering."""
    n_tok = int(bmap.mask.sum())
    out = [f'<p class="caption">{html.escape(bmap.label)} \u00b7 {len(bmap.ids)} bytes, {n_tok} boundaries '
           f"(rate {bmap.rate:.3f})</p>", '<div class="bmap">']
    for c in bmap.cells():
        cls = "c" + (" b" if c.boundary else "") + (" i" if c.inner else "")
        style = f"background:{hex_colour(c.p)};color:{'#fff' if dark(c.p) else '#000'}"
        text = html.escape(c.text) + ("\n" if c.newline else "")
        out.append(f'<span class="{cls}" style="{style}" title="{html.escape(_title(c, bmap.probs))}" '
                   f'data-p="{c.p:.6f}" data-t="{c.token}" data-bytes="{c.hex}">{text}</span>')
    out.append("</div>")
    out.append('<div class="info"></div>')
    return "".join(out)


def html_legend() -> str:
    ramp = "".join(f'<span style="background:{hex_colour(p)};color:{"#fff" if dark(p) else "#000"}">{p:.1f}</span>'
                   for p in np.linspace(0, 1, 6))
    return (f'<p class="legend">boundary probability p: {ramp} &nbsp; <span class="c b">x</span> drawn boundary '
            "(a new token starts here); multi-byte characters show their last byte's p; hover for details</p>")


def html_page(title: str, body: str) -> str:
    """A complete self-contained page (inline CSS and script, strict content-security policy)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"{body}\n<script>{JS}</script>\n</body>\n</html>\n")


def render_html(bmap: BoundaryMap, title: str = "learntok boundary map") -> str:
    """A standalone page with one boundary map."""
    return html_page(title, f"<h1>{html.escape(title)}</h1>\n{html_legend()}\n{html_map(bmap)}")
