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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


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
              doc_words: int = 400, seed: int = 1) -> Path:
        """A data directory: train / valid / test JSONL files of documents of `doc_words` words, and
        planted.json with the spec, the entropy rate and each split's floor."""
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
        return out

    @staticmethod
    def load(data_dir: str | Path) -> PlantedLanguage:
        return PlantedLanguage(PlantedSpec(**json.loads((Path(data_dir) / "planted.json").read_text())["spec"]))

