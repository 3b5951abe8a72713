"""Text with its boundaries marked, for terminals (ANSI colours) and logs (plain `|` markers)."""

from __future__ import annotations

import sys

import torch


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


def _visible(ch: str) -> str:
    return {"\n": "\u21b5\n", "\t": "\u2192"}.get(ch, ch)


def mark_boundaries(data: bytes, mask: torch.Tensor | list[bool], color: bool | None = None) -> str:
    """Render `data` with boundary bytes highlighted. mask[i] refers to data[i] (a_t = 1: the token-level
    model reads this byte's state). A multi-byte character counts as a boundary if its last byte is one.
    color=None: colour when stdout is a terminal; otherwise a `|` is put before each boundary character."""
    if color is None:
        color = sys.stdout.isatty()
    mask = [bool(m) for m in (mask.tolist() if isinstance(mask, torch.Tensor) else mask)]
    parts = []
    for ch, _, end in utf8_chars(data):
        boundary = mask[end - 1] if end - 1 < len(mask) else False
        text = _visible(ch)
        if color:
            parts.append(f"\x1b[30;43m{text}\x1b[0m" if boundary else text)
        else:
            parts.append(("|" + text) if boundary else text)
    return "".join(parts)
