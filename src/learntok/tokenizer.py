"""A learntok model's boundaries behind the interface of a tokenizer.

    tok = learntok.LearnedTokenizer.from_pretrained("enwiki-small")   # the bundled model, or any model path
    enc = tok.encode("Tokenizers, learned.")
    enc.tokens            # ['Tok', 'en', 'izers', ',', ' learned', '.'] (whatever the model draws)
    enc.offsets           # character offsets of each token, as offset_mapping in Hugging Face fast tokenizers
    tok.decode(enc)       # 'Tokenizers, learned.'
    batch = tok(["a text", "another"], padding=True, return_tensors="pt")

A learned tokenizer has no vocabulary: its tokens are spans of the byte sequence that the model reads. So the
ids it gives are the model's input, the UTF-8 bytes (id = byte value), and the segmentation is carried beside
them: `boundary_mask` (1 where a token starts) per byte, `token_offsets` and `token_lengths` per token. This is
how byte-level models with dynamic patches (BLT's patch lengths, H-Net's boundary mask) hand segmentations on.
Boundaries are drawn as `learntok segment` and `learntok show` draw them (learntok.draw.draw_texts: one sample
with the evaluation seed, or greedy), text by text, so a text's tokens do not depend on its batch. A two-level
model (`--inner-layers`) segments into its super-tokens with level=2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from learntok.draw import EVAL_SEED, check_level, check_precision, draw_texts, evaluates_greedily
from learntok.vocab import BOS, PAD


@dataclass
class Encoding:
    """One text's segmentation."""

    ids: list[int]
    """The text's UTF-8 bytes, the model's input ids (0-255)."""
    byte_offsets: list[tuple[int, int]]
    """(start, end) of each token in bytes."""
    offsets: list[tuple[int, int]]
    """(start, end) of each token in characters of the input str (bytes for bytes input). A token that starts or
    ends inside a multi-byte character covers that whole character, so neighbouring tokens may share it."""
    tokens: list[str]
    """Each token's text (a token that splits a multi-byte character shows U+FFFD for the part it holds)."""
    boundaries: list[bool] = field(repr=False)
    """One flag per byte: True where a token starts."""

    def __len__(self) -> int:
        return len(self.byte_offsets)

    @property
    def token_lengths(self) -> list[int]:
        return [e - s for s, e in self.byte_offsets]

    @property
    def token_bytes(self) -> list[bytes]:
        data = bytes(self.ids)
        return [data[s:e] for s, e in self.byte_offsets]


def _char_index(data: bytes) -> list[int]:
    """For each byte offset 0..len(data), the index of the character it falls in (len(text) at the end): UTF-8
    continuation bytes (10xxxxxx) belong to the character before them."""
    out, c = [], -1
    for b in data:
        c += (b & 0xC0) != 0x80
        out.append(max(c, 0))
    out.append(c + 1)
    return out


class LearnedTokenizer:
    """Tokenizer-shaped segmentation with any byte-level learntok model (a run, checkpoint, exported directory,
    Hub id, or a bundled model's name)."""

    def __init__(self, model, *, greedy: bool = False, seed: int = EVAL_SEED, window: int | None = None,
                 batch_size: int = 32, precision: str = "fp32", rate: float | None = None, level: int = 1) -> None:
        if getattr(model, "predicts_tokens", False):
            raise ValueError("a learned tokenizer needs a byte-level model; the BPE baseline (--arch token) has a "
                             "fixed tokenizer of its own")
        self.model = model.eval()
        self.greedy, self.seed, self.batch_size, self.rate = greedy, seed, batch_size, rate
        self.level = check_level(model, level)
        if rate is not None:  # the model's asked rate (ByteLM.set_rate): every tokenizer sharing it sees it
            model.set_rate(rate)
        from learntok.boundaries.rates import warn_mismatch

        warn_mismatch(model, greedy=greedy or evaluates_greedily(model))
        self.precision = check_precision(precision)
        self.window = window or getattr(model, "seq_len", 512)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: str = "cpu", **kw) -> LearnedTokenizer:
        """Load a model (learntok.pretrained.load) and the tokenizer settings saved beside it, overridden by
        `kw` (greedy=, seed=, window=, batch_size=, precision= "fp32" or "bf16": bfloat16 autocast, about 1.4x
        faster on the project's CPU, a few decisions near p = 0.5 can differ; rate= a boundary rate to ask a
        learned policy for, calibrated when the model has a calibration table; level=2: a two-level model's
        super-tokens)."""
        from learntok.pretrained import TOKENIZER_SETTINGS, load

        loaded = load(name_or_path, device)
        saved = loaded.path / TOKENIZER_SETTINGS
        settings = json.loads(saved.read_text()) if saved.exists() else {}
        return cls(loaded.model, **{**settings, **kw})

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """The model exported (learntok.save_pretrained: also a transformers directory) with these settings."""
        from learntok.pretrained import TOKENIZER_SETTINGS, save_pretrained

        seq_len = getattr(self.model, "seq_len", self.window)  # the model's; the window is a setting
        out = save_pretrained(self.model, out_dir, seq_len=seq_len)
        settings = {"greedy": self.greedy, "seed": self.seed, **({"rate": self.rate} if self.rate is not None else {}),
                    **({"level": self.level} if self.level != 1 else {}),
                    **({"window": self.window} if self.window != seq_len else {})}
        (out / TOKENIZER_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
        return out

    def pre_tokenizer(self):
        """A Hugging Face `tokenizers` pre-tokenizer that splits text at the learned boundaries, so any
        tokenizers model (BPE, WordPiece, WordLevel) can run on learned pieces. Splits are at character
        granularity: a token that starts inside a multi-byte character joins the piece before. (A custom Python
        pre-tokenizer: `tokenizers` cannot serialise it; attach it again after loading.)"""
        from tokenizers.pre_tokenizers import PreTokenizer

        return PreTokenizer.custom(_PreTokenizer(self))

    # -- one text and many ---------------------------------------------------------------------------------

    def encode(self, text: str | bytes) -> Encoding:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str | bytes]) -> list[Encoding]:
        data = [t.encode() if isinstance(t, str) else bytes(t) for t in texts]
        drawn = draw_texts(self.model, data, self.window - 1, seed=self.seed, greedy=self.greedy,
                           batch_size=self.batch_size, precision=self.precision, level=self.level)
        return [self._encoding(t, d, m.tolist()) for t, d, (_, m) in zip(texts, data, drawn)]

    def stream_spans(self, blocks):
        """(start, end, bytes) of each token of one long text given as byte blocks (a file read piece by piece),
        in order, in bounded memory: the segmentation `encode` gives for the whole text. Strategies that annotate
        the whole text (bpe) read it whole first."""
        from learntok.draw import draw_stream

        if self.model.boundary.annotator is not None:
            data = b"".join(bytes(b) for b in blocks)
            yield from ((s, e, data[s:e]) for s, e in self.encode(data).byte_offsets)
            return
        feed = []  # blocks handed to the drawer, taken here in the same order

        def tee():
            for b in blocks:
                feed.append(bytes(b))
                yield feed[-1]

        buf, start, offset = b"", 0, 0  # bytes from the open token's start on; its start; the next flag's byte
        for mask in draw_stream(self.model, tee(), self.window - 1, seed=self.seed, greedy=self.greedy,
                                batch_size=self.batch_size, precision=self.precision, level=self.level):
            while len(buf) < offset - start + len(mask):
                buf += feed.pop(0)
            for j in mask.nonzero()[:, 0].tolist():
                if offset + j > start:
                    yield start, offset + j, buf[:offset + j - start]
                    buf, start = buf[offset + j - start:], offset + j
            offset += len(mask)
        if offset > start:
            yield start, offset, buf[:offset - start]

    def _encoding(self, text: str | bytes, data: bytes, flags: list[bool]) -> Encoding:
        if flags:
            flags[0] = True  # the text's first byte starts a token
        starts = [i for i, f in enumerate(flags) if f] + [len(data)]
        spans = list(zip(starts, starts[1:]))
        if isinstance(text, str):
            char = _char_index(data)
            offsets = [(char[s], char[e - 1] + 1) for s, e in spans]
        else:
            offsets = list(spans)
        tokens = [data[s:e].decode("utf-8", errors="replace") for s, e in spans]
        return Encoding(list(data), spans, offsets, tokens, flags)

    def decode(self, x: Encoding | list[int] | bytes, *, errors: str = "replace") -> str:
        """Text from an Encoding or from ids (bytes; BOS, EOS and PAD are skipped). Exact for any text that was
        encoded from a str; bytes that are not UTF-8 decode with `errors`."""
        ids = x.ids if isinstance(x, Encoding) else list(x)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors=errors)

    def tokenize(self, text: str | bytes) -> list[str]:
        return self.encode(text).tokens

    def __call__(self, text: str | bytes | list[str | bytes], *, padding: bool | str = False,
                 truncation: bool = False, max_length: int | None = None, add_special_tokens: bool = False,
                 return_tensors: str | None = None, return_offsets_mapping: bool = False) -> dict:
        """A batch as Hugging Face tokenizers return one, over bytes: input_ids (bytes; BOS first with
        add_special_tokens), attention_mask, boundary_mask (1 where a token starts) per byte; token_offsets
        (character offsets) with return_offsets_mapping, token_lengths (ids) and token_mask per token. BOS is a
        token of its own (length 1, offsets (0, 0)), so a row's token_mask sums to its boundary_mask and its
        token_lengths to its attention_mask.
        padding: False, True / "longest", or "max_length" (PAD, id 258, on the right); truncation cuts each text
        to max_length ids (bytes) before segmenting. return_tensors: None (lists), "pt" or "np"."""
        single = isinstance(text, (str, bytes))
        texts = [text] if single else list(text)
        if padding not in (False, True, "longest", "max_length", "do_not_pad"):
            raise ValueError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        if (truncation or padding == "max_length") and max_length is None:
            raise ValueError("truncation and padding='max_length' need max_length")
        if max_length is not None and max_length < int(add_special_tokens):
            raise ValueError(f"max_length must be at least {int(add_special_tokens)} (room for BOS with "
                             f"add_special_tokens=True), got {max_length}")
        if truncation:
            texts = [_truncate(t, max_length - int(add_special_tokens)) for t in texts]
        encs = self.encode_batch(texts)
        lead = [BOS] if add_special_tokens else []  # BOS is a token of its own, as in the model (a_0 = 1)
        rows = {"input_ids": [lead + e.ids for e in encs],
                "boundary_mask": [[1] * len(lead) + [int(f) for f in e.boundaries] for e in encs],
                "token_lengths": [[1] * len(lead) + e.token_lengths for e in encs]}
        if return_offsets_mapping:  # BOS covers no text: (0, 0), as Hugging Face gives special tokens
            rows["token_offsets"] = [[(0, 0)] * len(lead) + e.offsets for e in encs]
        rows["attention_mask"] = [[1] * len(r) for r in rows["input_ids"]]
        rows["token_mask"] = [[1] * len(r) for r in rows["token_lengths"]]
        if padding not in (False, "do_not_pad") or return_tensors is not None:
            n = max_length if padding == "max_length" else max((len(r) for r in rows["input_ids"]), default=0)
            n = max(n, max((len(r) for r in rows["input_ids"]), default=0))
            m = max((len(r) for r in rows["token_lengths"]), default=0)
            if padding == "max_length":
                m = max(m, n)
            fill = {"input_ids": (PAD, n), "boundary_mask": (0, n), "attention_mask": (0, n),
                    "token_lengths": (0, m), "token_offsets": ((0, 0), m), "token_mask": (0, m)}
            for key, (value, size) in fill.items():
                if key in rows:
                    rows[key] = [r + [value] * (size - len(r)) for r in rows[key]]
        if return_tensors is not None:
            rows = {k: _tensor(v, return_tensors) for k, v in rows.items()}
        elif single:
            rows = {k: v[0] for k, v in rows.items()}
        return rows


class _PreTokenizer:
    def __init__(self, tokenizer: LearnedTokenizer) -> None:
        self.tokenizer = tokenizer

    def split(self, _i: int, normalized):
        text = str(normalized)
        data = text.encode()
        char = _char_index(data)
        starts = sorted({char[s] for s, _ in self.tokenizer.encode(text).byte_offsets
                         if s == 0 or (data[s] & 0xC0) != 0x80} | {len(text)})
        return [normalized[a:b] for a, b in zip(starts, starts[1:]) if b > a]

    def pre_tokenize(self, pretok) -> None:
        pretok.split(self.split)


def _truncate(text: str | bytes, n: int) -> str | bytes:
    """The first n bytes of a text; a str stays a str (a character cut in two is dropped)."""
    if isinstance(text, str):
        return text.encode()[:n].decode("utf-8", errors="ignore")
    return bytes(text)[:n]


def _tensor(rows, kind: str):
    if kind == "pt":
        import torch

        return torch.tensor(rows, dtype=torch.long)
    if kind == "np":
        import numpy as np

        return np.asarray(rows, dtype=np.int64)
    raise ValueError(f"return_tensors must be 'pt' or 'np', got {kind!r}")
