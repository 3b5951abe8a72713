"""Where in the text a model spends its bits: held-out bits broken down by the class of each predicted byte.

A byte is a *word start* when it is a word byte (an ASCII letter or digit, or any byte of a multi-byte UTF-8
character) after a byte that is not (or after the start of a sequence); *word inside* when it is a word byte after
a word byte; *space* when it is whitespace; *punctuation* otherwise (ASCII symbols). The classes need only the byte
and the one before it, so every model is broken down the same way whatever its tokenization, and two runs scored on
the same text can be compared class by class: how much of one's lead over the other each class carries
(`learntok eval --by-class`, `learntok compare --paired`).

Given the model's boundaries, each class is split again by where its bytes fall in the model's own tokens: a
token's *first byte* is the byte after a boundary (a_t = 1 at the position that predicts it, so the token that
just closed is the freshest state the prediction reads), the *rest* are the bytes inside a token. Which bytes a
policy makes first bytes, and what they cost there, is where its boundaries help or hurt.
"""

from __future__ import annotations

import torch

from learntok.bpb import byte_targets
from learntok.vocab import BOS

CLASSES = ("word start", "word inside", "space", "punctuation")
"""The byte classes, in the order of `byte_classes`' indices."""
SPACE = b" \t\n\r\x0b\x0c"


def _tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(word, space): bool over the byte ids and the special ids after them (specials are neither)."""
    word = torch.zeros(BOS + 8, dtype=torch.bool)
    space = torch.zeros(BOS + 8, dtype=torch.bool)
    for b in range(256):
        word[b] = b >= 0x80 or chr(b).isalnum()
    space[list(SPACE)] = True
    return word, space


_WORD, _SPACE = _tables()


def byte_classes(ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B,T) int64: the index in CLASSES of each target byte, given the byte before it (`ids`, the model's input
    at that position); -1 where the target is not a byte (EOS, PAD, IGNORE)."""
    word, space = _WORD.to(targets.device), _SPACE.to(targets.device)
    is_byte = byte_targets(targets)
    t = torch.where(is_byte, targets, 0)
    prev = ids.clamp(0, word.numel() - 1)
    cls = torch.where(word[t], torch.where(word[prev], 1, 0), torch.where(space[t], 2, 3))
    return torch.where(is_byte, cls, -1)


class ClassBits:
    """Accumulates bits and bytes per byte class over batches, and, given boundaries, those of each class's bytes
    that are a token's first byte."""

    def __init__(self) -> None:
        self.bits = torch.zeros(len(CLASSES), dtype=torch.float64)
        self.bytes = torch.zeros(len(CLASSES), dtype=torch.int64)
        self.first_bits = torch.zeros(len(CLASSES), dtype=torch.float64)
        self.first_bytes = torch.zeros(len(CLASSES), dtype=torch.int64)
        self.split = False

    def add(self, ids: torch.Tensor, targets: torch.Tensor, bits: torch.Tensor,
            boundaries: torch.Tensor | None = None) -> None:
        """`bits` (B,T): each target's bits (0 where it is not a byte); `boundaries` (B,T) bool: a_t, whose
        True positions predict a token's first byte."""
        cls = byte_classes(ids, targets).flatten().cpu()
        keep = cls >= 0
        flat_bits = bits.flatten().cpu().double()
        self.bits += torch.bincount(cls[keep], flat_bits[keep], minlength=len(CLASSES))
        self.bytes += torch.bincount(cls[keep], minlength=len(CLASSES))
        if boundaries is not None:
            self.split = True
            first = keep & boundaries.flatten().cpu().bool()
            self.first_bits += torch.bincount(cls[first], flat_bits[first], minlength=len(CLASSES))
            self.first_bytes += torch.bincount(cls[first], minlength=len(CLASSES))

    def result(self) -> dict:
        out = {"classes": list(CLASSES), "bits": self.bits.tolist(), "bytes": self.bytes.tolist()}
        if self.split:
            out["token_first"] = {"bits": self.first_bits.tolist(), "bytes": self.first_bytes.tolist()}
        return out


def token_split(c: dict) -> list[dict]:
    """Per class of a `ClassBits.result()` with boundaries (and for all bytes, last): its bytes, the fraction of
    them that are a token's first byte, and bits per byte on first bytes and on the rest (None where there are
    none)."""
    first = c["token_first"]
    rows = zip([*c["classes"], "all"], [*c["bits"], sum(c["bits"])], [*c["bytes"], sum(c["bytes"])],
               [*first["bits"], sum(first["bits"])], [*first["bytes"], sum(first["bytes"])], strict=True)
    return [{"class": name, "bytes": n, "first": n1 / n if n else None, "bpb_first": b1 / n1 if n1 else None,
             "bpb_rest": (b - b1) / (n - n1) if n > n1 else None} for name, b, n, b1, n1 in rows]


def class_difference(a: dict, b: dict) -> list[dict]:
    """Per class, from two `ClassBits.result()`s on the same bytes: its share of the bytes, each run's bits per
    byte in it, their difference, and its contribution to the difference in overall BPB (the class's bits of A −
    B over all bytes: the contributions add up to A's BPB − B's); with a run's boundaries, the fraction of the
    class's bytes that are its token's first byte (first_a, first_b). ValueError if they counted different
    bytes."""
    if a["classes"] != b["classes"] or a["bytes"] != b["bytes"]:
        raise ValueError("the two runs' byte classes counted different bytes: a class breakdown needs the same text")
    total = sum(a["bytes"])
    out = []
    for name, bits_a, bits_b, n in zip(a["classes"], a["bits"], b["bits"], a["bytes"], strict=True):
        out.append({"class": name, "share": n / total, "bpb_a": bits_a / n if n else None,
                    "bpb_b": bits_b / n if n else None, "diff": (bits_a - bits_b) / n if n else None,
                    "contribution": (bits_a - bits_b) / total})
    for key, run in (("first_a", a), ("first_b", b)):  # where each run's tokens begin, when it was split
        if "token_first" in run:
            for row, split in zip(out, token_split(run)[:-1], strict=True):  # [:-1]: not the "all" row
                row[key] = split["first"]
    return out
