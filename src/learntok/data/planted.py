"""A planted-boundary language: byte text with a known segmentation and an exactly computable entropy rate, the
benchmark where the optimal boundaries and the best achievable bits per byte are known
(experiments/planted/run.py).

Words are random lowercase strings from a prefix-free lexicon (no word begins another, so a text parses into
words in exactly one way, with or without separators). Text is a first-order Markov chain over words: each word's
successor is drawn from a Zipfian distribution over its own random set of `successors` words. With `separator`,
each word is followed by one space.

Because the word chain is stationary and the words decode uniquely, the byte process's entropy rate is the word
chain's divided by the mean bytes per word:

    H = sum_w mu(w) H(next | w) / sum_w mu(w) |w|        (bits per byte; mu the stationary distribution)

No model can beat it on long text (documents start from mu, which adds H(mu) bits per document; learntok counts
it, see `document_floor`). The planted boundaries are the last byte of every word (the space, with separators):
a token then holds a whole word when the next one is predicted.

Models are scored on packed windows (learntok.data.ByteSequences) that mostly begin mid-document and mid-word,
with no context, so the best achievable loss there is higher: `PlantedLanguage.windowed_floor` computes it exactly
(the Bayes-optimal predictor, a forward algorithm over the hidden word and position; about 0.02 bits per byte
above `document_floor` at seq_len 512), and `add_windowed_floor` records it in a data directory's planted.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

EVAL_BYTES = 262_144
"""Scored bytes per split of the benchmark's evaluation (experiments/arms.py), which the windowed floor matches."""


@dataclass(frozen=True)
class PlantedSpec:
    """The language's parameters."""

    vocab: int = 512
    """Words in the lexicon."""
    min_len: int = 2
    """Shortest word, in letters."""
    max_len: int = 6
    """Longest word, in letters."""
    successors: int = 32
    """Words each word can be followed by."""
    zipf: float = 1.1
    """Exponent of the Zipfian successor distribution (rank r has weight r^-zipf)."""
    separator: bool = True
    """Follow each word by a space."""
    seed: int = 0


class PlantedLanguage:
    def __init__(self, spec: PlantedSpec):
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        words: set[bytes] = set()
        while len(words) < spec.vocab:
            n = int(rng.integers(spec.min_len, spec.max_len + 1))
            w = bytes(rng.integers(ord("a"), ord("z") + 1, n).astype(np.uint8))
            if not any(w.startswith(o) or o.startswith(w) for o in words):  # prefix-free
                words.add(w)
        self.words = sorted(words)
        V, K = spec.vocab, min(spec.successors, spec.vocab)
        self.next_words = np.stack([rng.choice(V, K, replace=False) for _ in range(V)])  # (V,K)
        p = np.arange(1, K + 1, dtype=np.float64) ** -spec.zipf
        self.next_probs = p / p.sum()  # (K,) the same Zipf law over each word's own successors
        trans = np.zeros((V, V))
        np.put_along_axis(trans, self.next_words, self.next_probs[None], axis=1)
        mu = np.full(V, 1.0 / V)
        for _ in range(10_000):  # stationary distribution by power iteration
            new = mu @ trans
            if np.abs(new - mu).max() < 1e-14:
                break
            mu = new
        self.mu = new / new.sum()
        self.trans = trans  # (V,V) word transition matrix
        self.lengths = np.array([len(w) + spec.separator for w in self.words], dtype=np.float64)

    @property
    def entropy_rate(self) -> float:
        """Bits per byte of the stationary process: the floor on long text."""
        h_next = -(self.next_probs * np.log2(self.next_probs)).sum()  # the same for every word
        return float(h_next / (self.mu @ self.lengths))

    def document_floor(self, n_bytes: float, n_docs: int) -> float:
        """Bits per byte of the best possible model on n_docs documents of n_bytes bytes in all: the entropy
        rate plus each document's first word (drawn from mu, H(mu) bits instead of H(next | previous))."""
        h_mu = -(self.mu[self.mu > 0] * np.log2(self.mu[self.mu > 0])).sum()
        h_next = -(self.next_probs * np.log2(self.next_probs)).sum()
        words = n_bytes / (self.mu @ self.lengths)
        return float((words * h_next + n_docs * (h_mu - h_next)) / n_bytes)

    @cached_property
    def _states(self) -> dict[str, np.ndarray]:
        """The byte-level chain's hidden states (word, position in it; word by word, so state s + 1 follows s
        within a word): the byte each emits, each word's first and last state, the stationary distribution and
        the document-start distribution."""
        sep = b" " if self.spec.separator else b""
        emit = np.frombuffer(b"".join(w + sep for w in self.words), dtype=np.uint8).astype(np.int16)  # (S,)
        lens = self.lengths.astype(np.int64)
        firsts = np.concatenate([[0], np.cumsum(lens)[:-1]])  # (V,)
        word = np.repeat(np.arange(len(self.words)), lens)  # (S,)
        start = np.zeros(len(emit))
        start[firsts] = self.mu
        return {"emit": emit, "firsts": firsts, "lasts": firsts + lens - 1, "nonfirst": np.diff(word, prepend=-1) == 0,
                "stationary": self.mu[word] / (self.mu @ self.lengths),  # every position of w has weight mu(w)
                "start": start}

    def window_probs(self, ids: np.ndarray, doc_start: bool = False) -> np.ndarray:
        """(B, L) float64: the Bayes-optimal probability of each target of windows `ids` (B, L + 1) cut as
        `learntok.data.ByteSequences.batch` cuts them (BOS, then bytes, EOS between packed documents); 1.0 at EOS
        targets, which evaluation does not score (so no byte's probability is spent on them).

        The predictor knows the language but not where the window lies (window 0 opens a document, but a model
        cannot tell it from the others). Prior, packed windows: the state of a random byte of the stream, i.e. the
        stationary law of (word, position), mu(w) / sum mu |w| at each position of w. Documents start from mu, so
        document starts are already part of it in their right share; a window whose first target is an EOS shows
        it. Unpacked windows (doc_start=True) are documents' first bytes: word ~ mu at position 0. After each byte
        the forward algorithm keeps the posterior over states, moves a word's last position to its successors'
        first (by the chain), and restarts at the document-start prior after an EOS. The previous word needs no
        state of its own: the chain is first-order, so it matters only through the current word's posterior.

        Exact but for one neglected fact: `write` gives every document exactly `doc_words` words, so seeing no EOS
        after a word says a little about how far into its document a window is. With separators the spaces fix
        how many words end in a window, so that evidence is the same for every hypothesis and cancels; without,
        two parses of a window's first bytes can differ by one word end, which would reweigh them by about
        1 / (doc_words - words in the window): a second-order change in loss (of order 1e-7 bits per byte at the
        defaults). A target the language cannot produce raises ValueError."""
        from learntok.vocab import EOS

        st = self._states
        emit, firsts, lasts = st["emit"], st["firsts"], st["lasts"]
        targets = np.asarray(ids, dtype=np.int64)[:, 1:]
        if ((targets > 255) & (targets != EOS)).any() or (targets < 0).any():
            raise ValueError("window_probs scores byte and EOS targets only")
        B, L = targets.shape
        first_byte = emit[firsts]
        enter = {c: (firsts[first_byte == c], self.trans[:, first_byte == c]) for c in np.unique(first_byte).tolist()}
        out = np.ones((B, L))
        pre = np.tile(st["start"] if doc_start else st["stationary"], (B, 1))  # (B,S) P(state of target t | before)
        for t in range(L):
            y = targets[:, t]
            byte = y != EOS
            pre *= emit == y[:, None]  # the posterior, unnormalised (an EOS matches no state)
            p = pre.sum(1)  # (B,) P(y_t | window so far)
            if (byte & (p <= 0)).any():
                raise ValueError(f"window(s) {np.flatnonzero(byte & (p <= 0)).tolist()}: byte {t} is impossible")
            out[byte, t] = p[byte]
            if t == L - 1:
                break
            pre /= np.where(byte, p, 1.0)[:, None]
            ends = pre[:, lasts]  # (B,V) posterior that the current word ends here
            nxt = np.empty_like(pre)
            nxt[:, 0] = 0.0
            np.multiply(pre[:, :-1], st["nonfirst"][1:], out=nxt[:, 1:])  # the same word's next position
            y2 = targets[:, t + 1]
            rows = np.flatnonzero(ends.any(1))
            for c in np.unique(y2[rows]).tolist():  # a word ends: its successor's first byte, for those that emit
                if c in enter:  # the next target (the others are masked out there anyway)
                    r = rows[y2[rows] == c]
                    cols, trans = enter[c]
                    nxt[np.ix_(r, cols)] = ends[r] @ trans
            nxt[~byte] = st["start"]
            pre = nxt
        return out

    def windowed_floor(self, docs, seq_len: int = 512, pack: bool = True, max_bytes: int = EVAL_BYTES,
                       batch: int = 512) -> float:
        """Bits per byte of the Bayes-optimal predictor (`window_probs`) on what `learntok.evaluation.bpb.heldout_bpb`
        scores of `docs` (bytes or a Corpus): the byte targets of the first max(1, max_bytes // seq_len) windows of
        `ByteSequences(docs, seq_len, pack)` (all of them when max_bytes is 0). The floor for models evaluated on
        those windows; `batch` windows run at once (the result does not depend on it)."""
        from learntok.data.sequences import ByteSequences

        seqs = ByteSequences(docs, seq_len, pack, name="planted floor")
        n = len(seqs) if max_bytes <= 0 else min(len(seqs), max(1, max_bytes // seq_len))
        bits, n_bytes = 0.0, 0
        for i in range(0, n, batch):
            ids = seqs.batch(np.arange(i, min(i + batch, n)))
            bits -= np.log2(self.window_probs(ids, doc_start=not pack)).sum()
            n_bytes += int((ids[:, 1:] < 256).sum())
        return float(bits / n_bytes)

    def word_chain(self, n_words: int, rng: np.random.Generator) -> list[int]:
        """n_words word indices from the chain, the first drawn from mu."""
        w = int(rng.choice(len(self.words), p=self.mu))
        ranks = rng.choice(len(self.next_probs), size=n_words - 1, p=self.next_probs)  # each step's successor rank
        out = [w]
        for r in ranks.tolist():
            w = int(self.next_words[w, r])
            out.append(w)
        return out

    def render(self, chain: list[int]) -> bytes:
        sep = b" " if self.spec.separator else b""
        return b"".join(self.words[w] + sep for w in chain)

    def bits(self, chain: list[int]) -> float:
        """-log2 of the chain's probability: what the true model pays for its text."""
        total = -np.log2(self.mu[chain[0]])
        for a, b in zip(chain, chain[1:]):
            total -= np.log2(self.next_probs[list(self.next_words[a]).index(b)])
        return float(total)

    def document(self, n_words: int, rng: np.random.Generator) -> bytes:
        """The text of n_words words from the chain."""
        return self.render(self.word_chain(n_words, rng))

    def boundaries(self, text: bytes) -> np.ndarray:
        """Planted flags of `text` (bool, len(text)): True at the last byte of each word (its space with
        separators). Parses greedily, which is exact for a prefix-free lexicon; bytes that do not parse (a
        window that starts mid-word) get False until the next word start is found."""
        flags = np.zeros(len(text), dtype=bool)
        lexicon = set(self.words)
        sep = int(self.spec.separator)
        i = 0
        while i < len(text):
            for n in range(self.spec.min_len, self.spec.max_len + 1):
                if text[i:i + n] in lexicon:
                    flags[min(i + n - 1 + sep, len(text) - 1)] = True  # the word's last byte, or its space
                    i += n + sep
                    break
            else:
                i += 1
        return flags

    def write(self, out: str | Path, *, train_bytes: float, val_bytes: float, test_bytes: float,
              doc_words: int = 400, seed: int = 1, seq_len: int | None = 512, pack: bool = True) -> Path:
        """A data directory: train / valid / test JSONL files of documents of `doc_words` words, and
        planted.json with the spec, the entropy rate and each split's floor, plus (unless seq_len is None) the
        validation and test splits' windowed floors for windows of `seq_len` (`add_windowed_floor`)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        floors = {}
        for name, size in (("train", train_bytes), ("valid", val_bytes), ("test", test_bytes)):
            n, docs = 0, 0
            with open(out / f"{name}.jsonl", "w") as f:
                while n < size:
                    doc = self.document(doc_words, rng).decode()
                    f.write(json.dumps({"text": doc}) + "\n")
                    n, docs = n + len(doc), docs + 1
            floors[name] = self.document_floor(n, docs)
        info = {"spec": asdict(self.spec), "entropy_rate": self.entropy_rate, "floor": floors,
                "mean_word_bytes": float(self.mu @ self.lengths)}
        (out / "planted.json").write_text(json.dumps(info, indent=1) + "\n")
        if seq_len is not None:
            add_windowed_floor(out, seq_len, pack)
        return out

    @staticmethod
    def load(data_dir: str | Path) -> PlantedLanguage:
        return PlantedLanguage(PlantedSpec(**json.loads((Path(data_dir) / "planted.json").read_text())["spec"]))


def add_windowed_floor(data_dir: str | Path, seq_len: int = 512, pack: bool = True,
                       max_bytes: int = EVAL_BYTES) -> dict:
    """planted.json's `floor["windowed"]`: {"seq_len", "pack", "max_bytes", "valid", "test"}, the windowed floor
    (`PlantedLanguage.windowed_floor`) of the validation and test splits as evaluation reads them (load_split).
    Computed and written into planted.json when it lacks them for these settings (a directory written before they
    existed, or other windows: they replace the recorded ones); older files stay loadable either way."""
    from learntok.config import DataConfig
    from learntok.data.splits import load_split

    path = Path(data_dir) / "planted.json"
    info = json.loads(path.read_text())
    want = {"seq_len": seq_len, "pack": pack, "max_bytes": max_bytes}
    old = info["floor"].get("windowed")
    if old is not None and all(old.get(k) == v for k, v in want.items()):
        return old
    lang = PlantedLanguage(PlantedSpec(**info["spec"]))
    cfg = DataConfig(source=str(data_dir))
    info["floor"]["windowed"] = {**want, **{name: lang.windowed_floor(load_split(cfg, split)[1], seq_len, pack,
                                                                      max_bytes)
                                            for name, split in (("valid", "val"), ("test", "test"))}}
    path.write_text(json.dumps(info, indent=1) + "\n")
    return info["floor"]["windowed"]
