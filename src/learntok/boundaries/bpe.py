"""BPE guidance (paper §4.3 and App. D.1; docs/baselines.md): prescribed boundaries at the first byte
of every byte-level BPE token.

The paper draws a boundary at the last byte of each BPE token and shifts it right by one byte, so a boundary is
revealed one byte after the token it ends. Equivalently: a boundary at the first byte of every token except the
document's first (whose start is the BOS / EOS position before it, which the data pipeline flags). The paper's
example writes the space as `_`: "hello tokenization" = hello | Ġtoken | ization gives
    0 0 0 0 0 1 0 0 0 0 0 1 0 0 0 0 0 0.

The shift does not remove every lookahead. When merges conflict, whether a token starts at byte t
can depend on bytes after t: with merge "b c" ranked above "a b", "abc" = a|bc but "abd" = ab|d, so the flag at "b"
tells whether "c" follows. Hence exactly_causal = False; `lookahead_leak_rate` measures how often it happens.

Choices where the paper and the spec are open:
- HF `tokenizers`: a BPE model over the ByteLevel alphabet (all 256 bytes are in the initial vocabulary, so no byte
  is ever unknown), GPT-2 regex pre-tokenisation, no normaliser, no special tokens (BOS / EOS belong to the data
  pipeline), merges seen at least twice. add_prefix_space=False: with it, the document's first token carries a
  phantom space that is not in the byte stream; the authors' code turns it on, which changes only how the first
  word of each document is split, and that word's boundary is the BOS / EOS flag either way.
- Byte spans come from the length of each token's ByteLevel string (one character per byte), not from character
  offsets (which give two pieces of one split multi-byte character the same offset); they are checked to tile the
  document. Bytes that are not valid UTF-8 (only in synthetic data) are one token each.
- Vocabulary search (bpe_vocab_size = 0): BPE training is greedy and does not depend on the requested size, so the
  tokenizer of size V is the first V tokens (and their merges) of a larger one (tested). We train once at a large
  size and bisect over truncations for the size whose held-out rate (tokens per byte) is closest to target_rate.
  Regex pre-tokenisation makes every pre-token at least one token, so the rate cannot fall below pre-tokens per
  byte (about 0.22 on Python code, 0.20 on English Wikipedia, and higher again for words never seen in training):
  then the largest size is kept and the reached rate is reported (self.rate, saved and logged as bpe/heldout_rate).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from learntok import atomic
from learntok.boundaries.base import BoundaryConfig, BoundaryOutput, BoundaryStrategy
from learntok.data.corpus import sample_documents
from learntok.errors import MissingDependency

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:  # pragma: no cover - the registry imports this module only when `bpe` is selected
    raise MissingDependency("the bpe boundary strategy needs the `tokenizers` package (pip install tokenizers)") from e

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "bpe_tokenizer.json"
META_FILE = "bpe_meta.json"
SEARCH_VOCAB = 1 << 18
"""Vocabulary size trained when searching; training stops earlier once no pair occurs twice."""
MIN_FREQUENCY = 2
"""A pair seen once is memorisation, not a merge."""
_ESCAPED = re.compile("([\udc80-\udcff])")  # bytes that are not valid UTF-8, as decoded by "surrogateescape"


@lru_cache(maxsize=1)
def byte_chars() -> tuple[str, ...]:
    """The ByteLevel (GPT-2) byte -> character table: printable Latin-1 bytes stand for themselves, the other 68
    bytes map to U+0100, U+0101, ... in byte order. One character per byte, so a token's string length is its byte
    length."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return tuple(out)


def _byte_level(tok: Tokenizer) -> Tokenizer:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def bpe_tokenizer(vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> Tokenizer:
    """A byte-level BPE tokenizer (this module's pre-tokenizer and decoder) from a vocabulary of ByteLevel strings
    and merges in rank order."""
    return _byte_level(Tokenizer(models.BPE(vocab=dict(vocab), merges=[tuple(m) for m in merges])))


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer of at most `vocab_size` tokens (256 bytes + merges) on `texts`."""
    tok = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=MIN_FREQUENCY, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def _model_json(tokenizer: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def truncate(tokenizer: Tokenizer, vocab_size: int,
             model: tuple[dict[str, int], list[tuple[str, str]]] | None = None) -> Tokenizer:
    """The tokenizer that training with `vocab_size` would have given: the tokens with id < vocab_size and the merges
    up to the first one whose token is cut (training adds tokens in merge order). `model`: `_model_json` output, to
    avoid re-parsing in a search."""
    vocab, merges = model or _model_json(tokenizer)
    kept = {t: i for t, i in vocab.items() if i < vocab_size}
    n = 0
    while n < len(merges) and "".join(merges[n]) in kept:
        n += 1
    return bpe_tokenizer(kept, merges[:n])


def token_lengths(tokenizer: Tokenizer, data: bytes) -> np.ndarray:
    """Byte length of each BPE token of `data` in order (int64; they tile `data` exactly: checked)."""
    try:
        pieces = [data.decode("utf-8")]
    except UnicodeDecodeError:  # invalid bytes become lone surrogates, each one token of one byte
        pieces = [p for p in _ESCAPED.split(data.decode("utf-8", "surrogateescape")) if p]
    texts = [p for p in pieces if not _ESCAPED.fullmatch(p)]
    encs = iter(tokenizer.encode_batch(texts, add_special_tokens=False) if len(texts) > 1 else
                [tokenizer.encode(t, add_special_tokens=False) for t in texts])
    lengths: list[int] = []
    for p in pieces:
        if _ESCAPED.fullmatch(p):
            lengths.append(1)
        else:
            lengths.extend(map(len, next(encs).tokens))  # ByteLevel strings: one character per byte
    out = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
    if int(out.sum()) != len(data) or (out <= 0).any():
        raise ValueError(f"BPE tokens do not tile the {len(data)}-byte text (they cover {int(out.sum())} bytes): the "
                         "tokenizer must be byte-level (ByteLevel pre-tokenizer, add_prefix_space=False)")
    return out


def bpe_boundaries(tokenizer: Tokenizer, text: bytes, shift: bool = True) -> np.ndarray:
    """Per-byte BPE boundary flags (bool, len(text)). shift=True (the paper's rule): True at the first byte of each
    token except the first; shift=False: True at the last byte of each token (leaks the next byte)."""
    ends = np.cumsum(token_lengths(tokenizer, text))  # (n_tokens,) exclusive end of each token
    flags = np.zeros(len(text), dtype=bool)
    flags[ends[:-1] if shift else ends - 1] = True
    return flags


def heldout_rate(tokenizer: Tokenizer, texts: Sequence[str]) -> float:
    """Tokens per byte of `texts`: the data pipeline's boundary rate (a document gives tokens - 1 flags plus the
    flag of its EOS)."""
    encs = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return sum(len(e.tokens) for e in encs) / max(1, sum(len(t.encode()) for t in texts))


def search_vocab(tokenizer: Tokenizer, texts: Sequence[str], target: float,
                 rel_tol: float = 0.01) -> tuple[Tokenizer, float, dict[int, float]]:
    """(tokenizer, rate, {size: rate tried}): the truncation of `tokenizer` whose rate on `texts` is closest to
    `target`, by bisection on a log scale down to sizes `rel_tol` apart (the rate falls as the vocabulary grows)."""
    model = _model_json(tokenizer)
    full = tokenizer.get_vocab_size()
    tried: dict[int, float] = {}

    def cut(v: int) -> Tokenizer:
        return tokenizer if v == full else truncate(tokenizer, v, model)

    def rate(v: int) -> float:
        if v not in tried:
            tried[v] = heldout_rate(cut(v), texts)
        return tried[v]

    lo, hi = 256, full
    if rate(hi) < target < rate(lo):  # otherwise the closest is an end point
        while hi - lo > max(1, int(lo * rel_tol)):
            mid = min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))
            lo, hi = (mid, hi) if rate(mid) > target else (lo, mid)
    best = min(tried, key=lambda v: (abs(tried[v] - target), v))
    return cut(best), tried[best], dict(sorted(tried.items()))


def prefix_last_token_lengths(tokenizer: Tokenizer, doc: bytes, n: int | None = None,
                              context: int | None = 2) -> np.ndarray:
    """For t < n: the byte length of the last BPE token when only the prefix doc[:t+1] is tokenised (int64, (n,)).

    context: re-tokenise only from the start of the pre-token `context` pre-tokens before the one holding t (BPE
    merges never cross pre-tokens, and regex pre-tokens are decided left to right); None tokenises the whole prefix
    (the O(n^2) reference). A prefix that ends inside a multi-byte character has its incomplete character as a last
    pre-token of raw bytes, merged by the BPE model alone."""
    text = doc.decode("utf-8")
    n = len(doc) if n is None else min(n, len(doc))
    t = np.arange(n)
    if context is None:
        start = np.zeros(n, dtype=np.int64)
    else:
        pre = [len(s) for s, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]  # bytes per pre-token
        bounds = np.concatenate([[0], np.cumsum(pre, dtype=np.int64)])  # (P+1,) pre-token starts, then the end
        k = np.searchsorted(bounds, t, side="right") - 1  # pre-token holding t
        start = bounds[np.maximum(k - context, 0)]
    arr = np.frombuffer(doc, dtype=np.uint8)
    cont = (arr & 0xC0) == 0x80  # UTF-8 continuation bytes
    lead = np.maximum.accumulate(np.where(cont, 0, np.arange(len(doc))))[:n]  # first byte of t's character
    complete = np.append(~cont[1:], True)[:n]  # t is the last byte of its character
    last = np.zeros(n, dtype=np.int64)
    whole = np.flatnonzero(complete)
    encs = tokenizer.encode_batch([doc[start[i]:i + 1].decode("utf-8") for i in whole], add_special_tokens=False)
    last[whole] = [len(e.tokens[-1]) for e in encs]
    table = byte_chars()
    for i in np.flatnonzero(~complete):
        tail = "".join(table[b] for b in doc[lead[i]:i + 1])
        last[i] = len(tokenizer.model.tokenize(tail)[-1].value)
    return last


def lookahead_leak_rate(tokenizer: Tokenizer, docs: Sequence[bytes], max_bytes: int = 4096,
                        context: int | None = 2) -> dict[str, float]:
    """How often a byte's BPE flag changes when the bytes after it are hidden (docs/baselines.md).

    For each position t of each document (the first `max_bytes` positions in all, each document tokenised whole),
    compare the flag from tokenising the whole document with the flag from tokenising only doc[:t+1]:
    shifted rule: is x_t the first byte of a token (not the document's first)? From the prefix: is the last token
    x_t alone. Unshifted rule: is x_t a token's last byte? From the prefix: always (the prefix ends there).
    Returns the disagreement rates `shifted` and `unshifted`; `shifted_extra` (the prefix flags x_t, the whole
    document does not: a word cut short ends in a one-byte token) and `shifted_missed` (the reverse: e.g. the regex
    gives a space before a word to the word, which only the next byte reveals), which sum to `shifted`; `bytes`
    evaluated, `flag_rate` (shifted flags per byte) and `midchar` (share of positions inside a multi-byte character,
    where the prefix's tail is incomplete).
    """
    budget, n_bytes, extra, missed, bad_u, flags, mid = max_bytes, 0, 0, 0, 0, 0, 0
    for doc in docs:
        n = min(len(doc), budget)
        if n <= 0:
            continue
        full_start = bpe_boundaries(tokenizer, doc)[:n]
        full_end = bpe_boundaries(tokenizer, doc, shift=False)[:n]
        last = prefix_last_token_lengths(tokenizer, doc, n, context)
        prefix_start = last == 1
        prefix_start[0] = False  # the document's first token has no flag
        prefix_end = np.ones(n, dtype=bool)  # the prefix's last token always ends at t
        extra += int((prefix_start & ~full_start).sum())
        missed += int((full_start & ~prefix_start).sum())
        bad_u += int((full_end != prefix_end).sum())
        flags += int(full_start.sum())
        arr = np.frombuffer(doc, dtype=np.uint8)
        mid += int((np.append((arr[1:] & 0xC0) == 0x80, False)[:n]).sum())
        n_bytes += n
        budget -= n
        if budget <= 0:
            break
    d = max(1, n_bytes)
    return {"shifted": (extra + missed) / d, "unshifted": bad_u / d, "shifted_extra": extra / d,
            "shifted_missed": missed / d, "bytes": float(n_bytes), "flag_rate": flags / d, "midchar": mid / d}


@dataclass(frozen=True, kw_only=True)
class BPEConfig(BoundaryConfig):
    """Options of `--boundaries bpe` (BPE guidance)."""

    boundaries: str = "bpe"
    target_rate: float = 0.2
    """Boundaries per byte the vocabulary search aims at (when bpe_vocab_size is 0)."""
    bpe_vocab_size: int = 0
    """Vocabulary size of the byte-level BPE tokenizer; 0 = search for the size whose held-out rate is closest
    to target_rate."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bpe_vocab_size and self.bpe_vocab_size < 256:
            raise ValueError(f"bpe_vocab_size must be 0 (search) or at least 256, got {self.bpe_vocab_size}")
        if not 0 < self.target_rate < 1:
            raise ValueError(f"target_rate must be in (0, 1), got {self.target_rate}")


def _sample(docs: Sequence[bytes], max_bytes: int, seed: int) -> list[str]:
    """Whole documents in a seeded random order up to `max_bytes` (the last one cut), as text; all if they fit."""
    return [d.decode("utf-8", "ignore") for d in sample_documents(docs, max_bytes, seed)]


class BPEBoundaries(BoundaryStrategy):
    """Prescribed boundaries from a byte-level BPE tokenizer trained on the training split (no parameters, no loss).

    prepare() trains the tokenizer (or reloads run_dir/bpe_tokenizer.json); annotate() gives the shifted flags of one
    document to the data pipeline, which hands them to propose() as `prescribed`."""

    config = BPEConfig
    learns_by = "prescribed"
    exactly_causal = False
    max_train_bytes: ClassVar[int] = 8_000_000
    """Training text cap (documents sampled with a fixed seed): 8 MB trains in ~15 s on two CPU cores."""
    max_eval_bytes: ClassVar[int] = 1_000_000
    """Held-out text used to measure the rate."""

    def __init__(self, cfg: BPEConfig, dim: int):
        super().__init__(cfg, dim)
        self.target_rate, self.requested_vocab = cfg.target_rate, cfg.bpe_vocab_size
        self.tokenizer: Tokenizer | None = None
        self.vocab_size, self.rate = 0, math.nan
        self.meta: dict = {}

    def prepare(self, train_docs: list[bytes], val_docs: list[bytes], run_dir: Path | None) -> None:
        """Load run_dir/bpe_tokenizer.json if it exists, else train one on `train_docs` (size searched on
        `val_docs` when bpe_vocab_size = 0) and save it there with bpe_meta.json (run_dir None: memory only)."""
        path = None if run_dir is None else Path(run_dir) / TOKENIZER_FILE
        if path is not None and path.exists():
            self._load(path, train_docs)
            return
        if not train_docs:
            where = f"no {path}" if path is not None else "no run directory"
            raise FileNotFoundError(f"bpe: {where} to load the tokenizer from, and no training documents to train one")
        t0 = time.perf_counter()
        texts = _sample(train_docs, self.max_train_bytes, seed=0)
        held = _sample(val_docs or train_docs, self.max_eval_bytes, seed=1)
        if self.requested_vocab:
            tok = train_tokenizer(texts, self.requested_vocab)
            rate, tried = heldout_rate(tok, held), {}
        else:
            tok, rate, tried = search_vocab(train_tokenizer(texts, SEARCH_VOCAB), held, self.target_rate)
        self.tokenizer, self.vocab_size, self.rate = tok, tok.get_vocab_size(), rate
        self.meta = dict(vocab_size=self.vocab_size, rate=rate, target_rate=self.target_rate,
                         requested_vocab_size=self.requested_vocab, train_bytes=sum(len(t.encode()) for t in texts),
                         eval_bytes=sum(len(t.encode()) for t in held), rate_on="val" if val_docs else "train",
                         search={str(v): r for v, r in tried.items()}, train_sha256=_digest(texts),
                         seconds=round(time.perf_counter() - t0, 2))
        if path is not None:  # atomic writes; every rank of a multi-process run trains the same tokenizer
            with atomic.atomic_path(path) as tmp:
                tok.save(str(tmp))
            atomic.write_text(path.with_name(META_FILE), json.dumps(self.meta, indent=2) + "\n")
        logger.info("bpe: vocab %d, held-out rate %.4f (target %.3f), trained on %d bytes in %.1f s", self.vocab_size,
                    rate, self.target_rate, self.meta["train_bytes"], self.meta["seconds"])

    def _load(self, path: Path, train_docs: list[bytes]) -> None:
        self.tokenizer = Tokenizer.from_file(str(path))
        self.vocab_size = self.tokenizer.get_vocab_size()
        meta_path = path.with_name(META_FILE)
        self.meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        self.rate = float(self.meta.get("rate", math.nan))
        stale = []
        if self.meta and self.requested_vocab != self.meta.get("requested_vocab_size", self.requested_vocab):
            stale.append(f"bpe_vocab_size {self.meta['requested_vocab_size']} -> {self.requested_vocab}")
        if self.meta and not self.requested_vocab and self.target_rate != self.meta.get("target_rate"):
            stale.append(f"target_rate {self.meta.get('target_rate')} -> {self.target_rate}")
        if train_docs and "train_sha256" in self.meta and \
                _digest(_sample(train_docs, self.max_train_bytes, seed=0)) != self.meta["train_sha256"]:
            stale.append("training documents differ")
        if stale:
            warnings.warn(f"bpe: reusing {path} although {', '.join(stale)}; delete it to train a new tokenizer",
                          stacklevel=2)

    def artifacts(self) -> list[str]:
        return [TOKENIZER_FILE, META_FILE]

    def annotate(self, doc: bytes) -> np.ndarray:
        """Shifted BPE flags of one document: True at the first byte of every token but the first."""
        if self.tokenizer is None:
            raise RuntimeError("bpe: call prepare() (which trains or loads the tokenizer) before annotate()")
        return bpe_boundaries(self.tokenizer, doc)

    def lookahead_leak_rate(self, docs: Sequence[bytes], max_bytes: int = 4096) -> dict[str, float]:
        """Disagreement of full-document and prefix-only flags (see the module function of this name)."""
        if self.tokenizer is None:
            raise RuntimeError("bpe: call prepare() before lookahead_leak_rate()")
        return lookahead_leak_rate(self.tokenizer, docs, max_bytes=max_bytes)

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        if prescribed is None:
            raise ValueError("the bpe strategy needs the data pipeline's prescribed boundary flags (ByteSequences("
                             "..., annotate=strategy.annotate), passed to the model as prescribed=); got None")
        if prescribed.shape != ids.shape:
            raise ValueError(f"bpe: prescribed flags {tuple(prescribed.shape)} do not match ids {tuple(ids.shape)}")
        mask = prescribed.to(device=ids.device, dtype=torch.bool).clone()  # (B,T)
        mask[:, 0] = True  # a_0 = 1 (BOS)
        stats = {"bpe/vocab_size": float(self.vocab_size)}
        if math.isfinite(self.rate):
            stats["bpe/heldout_rate"] = self.rate
        return BoundaryOutput(mask=mask, probs=mask.float(), stats=stats)


def _digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()
