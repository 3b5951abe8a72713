"""The learned tokenizer as a tool: segment any text with a trained model's boundaries.

    seg = Segmenter.from_pretrained("runs/tiny")           # a run directory or an exported model
    for span in seg.segment("def main():\\n    pass"):
        print(span.start, span.end, span.text)

A boundary byte *starts* a segment (a_t = 1: the token-level model reads byte t's state, which summarises the
text up to and including it); with BPE guidance's shifted rule this gives back the BPE tokens. Texts longer
than the model's context are read in windows of its training length, each re-reading the last quarter of the
one before as context (learntok.draw.draw_text), so a window start is not a forced boundary. Boundaries are
drawn the evaluation way (learntok.draw, as `learntok show` draws them): one sample with the evaluation seed by
default (the paper's protocol); greedy=True takes p > 0.5. Only the forward pass is needed, no training code.
A two-level model (`--inner-layers`) gives its super-tokens with level=2.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from learntok.draw import EVAL_SEED


@dataclass(frozen=True)
class Span:
    start: int
    """Byte offset of the segment's first byte in the UTF-8 text."""
    end: int
    """Byte offset one past its last byte."""
    text: str
    """The segment decoded as UTF-8 (a segment may split a multi-byte character: then with U+FFFD)."""


class Segmenter:
    """Spans of a text under a model's boundaries (learntok.tokenizer.LearnedTokenizer gives the same
    segmentation with a tokenizer's interface)."""

    def __init__(self, model, *, greedy: bool = False, seed: int = EVAL_SEED, window: int | None = None,
                 level: int = 1):
        from learntok.tokenizer import LearnedTokenizer

        self._wrap(LearnedTokenizer(model, greedy=greedy, seed=seed, window=window, level=level))

    def _wrap(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.model, self.greedy, self.seed, self.window = tokenizer.model, tokenizer.greedy, tokenizer.seed, \
            tokenizer.window

    @classmethod
    def from_pretrained(cls, path: str | Path, **kw) -> Segmenter:
        """A model and the tokenizer settings saved beside it (greedy, seed, level: LearnedTokenizer's), overridden
        by `kw` (greedy=, seed=, window=, level=)."""
        from learntok.tokenizer import LearnedTokenizer

        seg = cls.__new__(cls)  # the loaded tokenizer itself, not a second one over its model
        seg._wrap(LearnedTokenizer.from_pretrained(path, **kw))
        return seg

    def boundaries(self, data: bytes) -> list[bool]:
        """One flag per byte of `data`: True where a segment starts."""
        return self.tokenizer.encode(bytes(data)).boundaries

    def segment(self, text: str | bytes) -> list[Span]:
        return self.segment_batch([text])[0]

    def segment_batch(self, texts: list[str | bytes]) -> list[list[Span]]:
        """Each text's spans; windows of all texts run through the model together."""
        data = [t.encode() if isinstance(t, str) else bytes(t) for t in texts]
        return [[Span(s, e, tok) for (s, e), tok in zip(enc.byte_offsets, enc.tokens)]
                for enc in self.tokenizer.encode_batch(data)]


def _whole_word(core: bytes, before: bytes, after: bytes) -> bool:
    """Whether `core` is whole UTF-8 characters, all letters or digits (any script), with no letter or digit as
    the character just before it (the end of `before`) or just after it (the start of `after`)."""
    try:
        text = core.decode()
    except UnicodeDecodeError:  # a piece that cuts a character is no word
        return False
    prev, nxt = before.decode("utf-8", "ignore")[-1:], after.decode("utf-8", "ignore")[:1]
    return text.isalnum() and not prev.isalnum() and not nxt.isalnum()


def vocab_stats(docs: list[bytes], spans_per_doc: list[list[Span]], top: int = 30) -> dict:
    """Most frequent segments, mean segment length in bytes, and the share of segments that are whole words:
    letters/digits of any script only (after an optional leading space), with no letter or digit just before or
    after."""
    counts: Counter[str] = Counter()
    total_bytes, words, n = 0, 0, 0
    for data, spans in zip(docs, spans_per_doc):
        for s in spans:
            counts[s.text] += 1
            total_bytes += s.end - s.start
            n += 1
            start = s.start + (data[s.start:s.start + 1] == b" ")
            words += _whole_word(data[start:s.end], data[max(0, start - 4):start], data[s.end:s.end + 4])
    return {"segments": n, "distinct": len(counts), "mean_bytes": total_bytes / max(n, 1),
            "whole_word_share": words / max(n, 1), "most_frequent": counts.most_common(top)}
