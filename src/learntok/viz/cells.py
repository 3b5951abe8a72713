"""Boundary maps as data: per-byte boundary probabilities p_t and draws a_t of a text, split into characters.

A `BoundaryMap` holds, for every byte of a text, p_t (the policy's boundary probability for `learned`, the soft
probability of straight-through strategies, 0/1 for prescribed ones) and a_t (the drawn boundary). `cells()`
splits it into one `Cell` per character, coloured by the probability of the character's LAST byte (the paper's
appendix B convention for multi-byte characters such as "ü"). No torch or matplotlib needed here.

Alignment (docs/architecture.md): model position 0 is BOS, so byte i of a text is at position i + 1, and
a_t = 1 means byte t starts reading a new token (plain text rendering puts a `|` before it).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from learntok.vocab import EOS

EOS_GLYPH = "\u2404"  # ␄ stands for the separator between packed documents


@dataclass
class Cell:
    """One displayed character."""

    text: str
    """What to draw: the character, or a visible stand-in for newline / tab / control bytes / EOS."""
    start: int
    end: int
    """Byte range [start, end) in the map's ids."""
    p: float
    """Boundary probability of the character's last byte."""
    boundary: bool
    """a_t of the character's last byte."""
    inner: bool
    """A boundary was drawn at a byte inside the character (not its last): hidden by the last-byte rule."""
    token: int
    """Number of drawn boundaries at or before the last byte: 0 = still reading the BOS token."""
    hex: str
    """The character's byte(s) in hex, e.g. "e4 b8 ad"."""
    newline: bool = False


@dataclass
class BoundaryMap:
    """Per-byte boundary probabilities and draws of one text. ids: byte values 0..255 or EOS (packed data)."""

    ids: list[int]
    probs: np.ndarray
    """(N,) float: p_t per byte."""
    mask: np.ndarray
    """(N,) bool: a_t per byte."""
    label: str = ""
    """Shown as a caption, e.g. the strategy and how boundaries were drawn."""

    def __post_init__(self) -> None:
        self.probs = np.asarray(self.probs, dtype=np.float64).reshape(-1)
        self.mask = np.asarray(self.mask, dtype=bool).reshape(-1)
        if not (len(self.ids) == len(self.probs) == len(self.mask)):
            raise ValueError(f"boundary map: {len(self.ids)} ids but {len(self.probs)} probs / {len(self.mask)} flags")

    @property
    def rate(self) -> float:
        """Drawn boundaries per byte."""
        return float(self.mask.mean()) if len(self.mask) else 0.0

    def cells(self) -> list[Cell]:
        """One cell per character (UTF-8 decoded between EOS separators); token index counts boundaries."""
        tokens = np.cumsum(self.mask)  # (N,) boundaries at or before each byte
        cells: list[Cell] = []
        seg_start = 0
        for i in [*(j for j, b in enumerate(self.ids) if b == EOS), len(self.ids)]:
            for ch, s, e in utf8_chars(bytes(self.ids[seg_start:i])):
                s, e = s + seg_start, e + seg_start
                cells.append(self._cell(visible(ch), s, e, tokens, newline=ch == "\n"))
            if i < len(self.ids):
                cells.append(self._cell(EOS_GLYPH, i, i + 1, tokens, newline=True))
            seg_start = i + 1
        return cells

    def _cell(self, text: str, s: int, e: int, tokens: np.ndarray, newline: bool) -> Cell:
        last = e - 1
        return Cell(text=text, start=s, end=e, p=float(self.probs[last]), boundary=bool(self.mask[last]),
                    inner=bool(self.mask[s:last].any()), token=int(tokens[last]),
                    hex=" ".join(f"{b:02x}" if b < 256 else "EOS" for b in self.ids[s:e]), newline=newline)


def utf8_chars(data: bytes) -> list[tuple[str, int, int]]:
    """Split bytes into (character, start, end) by UTF-8 lead bytes; invalid bytes become U+FFFD."""
    out, i = [], 0
    while i < len(data):
        b = data[i]
        n = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        chunk = data[i:i + n]
        try:
            ch = chunk.decode("utf-8")
        except UnicodeDecodeError:
            ch, n = "\ufffd", 1
        out.append((ch, i, i + n))
        i += n
    return out


def visible(ch: str) -> str:
    """A printable stand-in for whitespace and control characters (↵ newline, → tab, ␀.. control pictures)."""
    if ch == "\n":
        return "\u21b5"
    if ch == "\t":
        return "\u2192"
    cat = unicodedata.category(ch)
    if cat == "Cc":
        return chr(0x2400 + ord(ch)) if ord(ch) < 0x20 else "\u2421" if ord(ch) == 0x7F else "\ufffd"
    if cat in ("Zl", "Zp"):  # line / paragraph separators
        return "\u21b5"
    if cat == "Mn":  # a lone combining mark: draw it on a dotted circle so it stays visible and hoverable
        return "\u25cc" + ch
    return ch


def _as_numpy(x) -> np.ndarray:
    """A tensor (any device / dtype) or sequence as a numpy array, without importing torch."""
    return x.detach().float().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def from_arrays(text_bytes: bytes | Sequence[int], probs, mask, label: str = "") -> BoundaryMap:
    """A map from bytes and per-byte probs / mask already aligned with them (position 0 = first byte)."""
    ids = list(text_bytes)
    n = len(ids)
    return BoundaryMap(ids, _as_numpy(probs)[:n], _as_numpy(mask).astype(bool)[:n], label)
