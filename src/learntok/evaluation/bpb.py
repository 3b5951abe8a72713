"""Scoring bytes under a trained model: held-out bits per byte and log-likelihoods of continuations.

    BPB = sum of next-byte cross-entropies (nats) / (ln 2 * number of bytes)          (learntok.bpb)

Boundaries at evaluation come from the strategy in eval() mode (the learned policy without its soft-cap), in
one of three modes:
    sample   one boundary sample with a fixed seed (the paper's protocol; the default)
    greedy   a_t = [p_t > 0.5]: the strategy's `eval_boundaries` is set to "greedy" for the duration
    average  k samples, averaged in probability space: log p(x) ~= log (1/k) sum_i p(x | a_i). Because a_t
             depends on x_{<=t} and a_{<t} only, pi(a | x) = prod_t pi(a_t | x_{<=t}, a_{<t}) and
             E_{a~pi}[p(x | a)] is exactly the model's marginal likelihood, so this is an importance-sampling
             (IWAE-style) estimate whose BPB is an upper bound that tightens as k grows. A continuation y of a
             context c uses the self-normalised ratio log sum_i p(c, y | a_i) - log sum_i p(c | a_i).

Boundary noise is drawn per text (not per batch) from numpy's generator seeded with (seed, text key, draw)
and indexed by byte offset in the text, so a score never depends on batching or padding, and the choices of one
multiple-choice question share the boundaries of their common context.

Rows are right-padded with PAD inputs and IGNORE targets; a causal model cannot let later (padded) positions
change earlier ones. Strategies that learn by "random" (e.g. exactly round(rate T) boundaries per row) depend on
the row length, so for them only rows of equal length share a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from learntok.boundaries import BoundaryOutput
from learntok.bpb import LN2, byte_targets
from learntok.draw import EVAL_SEED
from learntok.evaluation.byteclass import ClassBits
from learntok.evaluation.stats import ratio_se
from learntok.vocab import BOS, IGNORE, PAD

MODES = ("sample", "greedy", "average")


@dataclass(frozen=True)
class BoundaryMode:
    """How boundaries are drawn at evaluation."""

    mode: str = "sample"
    """sample | greedy | average (see the module docstring)."""
    samples: int = 1
    """k, the number of boundary samples averaged in `average` mode."""
    seed: int = EVAL_SEED
    """Seed of the boundary noise."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown boundaries mode {self.mode!r}; choose one of: {', '.join(MODES)}")
        if self.samples < 1 or (self.mode == "average" and self.samples < 2):
            raise ValueError(f"--samples must be >= 1 (>= 2 for average), got {self.samples}")
        if self.seed < 0:
            raise ValueError(f"--seed must be non-negative, got {self.seed}")

    @property
    def draws(self) -> int:
        return self.samples if self.mode == "average" else 1


def check_mode(model, bm: BoundaryMode) -> str:
    """A one-line description of the boundaries this evaluation uses; ValueError for a mode the strategy lacks."""
    learns_by, name = model.boundary.learns_by, model.bcfg.boundaries
    if learns_by == "prescribed":
        return f"{name}: prescribed boundaries (deterministic; --boundaries-mode does not apply)"
    if bm.mode == "greedy" and learns_by == "random":
        raise ValueError(f"--boundaries-mode greedy: the {name} strategy draws random boundaries; "
                         "use sample or average")
    if bm.mode == "greedy":
        return f"{name}: greedy boundaries (p > 0.5), eval mode (no soft-cap)"
    if bm.mode == "sample":
        return f"{name}: one boundary sample per text, seed {bm.seed}, eval mode (no soft-cap)"
    return f"{name}: average of {bm.samples} boundary samples in probability space, seed {bm.seed}, eval mode"


@contextmanager
def evaluating(model, bm: BoundaryMode):
    """model.eval(); for greedy, the strategy's `cfg.eval_boundaries` is "greedy" meanwhile (strategies without
    that option are deterministic or refuse greedy in `check_mode`). Restores both."""
    from learntok.boundaries.rates import warn_mismatch

    strategy = model.boundary
    old = strategy.cfg
    warn_mismatch(model, greedy=bm.mode == "greedy" or getattr(old, "eval_boundaries", "") == "greedy")
    swap = bm.mode == "greedy" and hasattr(old, "eval_boundaries")
    was_training = model.training
    if swap:
        strategy.cfg = replace(old, eval_boundaries="greedy")
    model.eval()
    try:
        yield
    finally:
        if swap:
            strategy.cfg = old
        model.train(was_training)


def text_noise(bm: BoundaryMode, key: int, draw: int, n: int) -> np.ndarray:
    """(n,) float32 uniforms for the bytes of text `key`; a prefix of a longer draw (same key) is identical."""
    return np.random.default_rng([bm.seed, key, draw]).random(n, dtype=np.float32)


@torch.no_grad()
def forward_nll(model, ids: torch.Tensor, targets: torch.Tensor, noise: torch.Tensor | None,
                prescribed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, BoundaryOutput, torch.Tensor]:
    """(nll (B,T) nats, 0 at IGNORE; argmax (B,T) predicted ids; the boundaries; n_tokens (B,)). A model that
    predicts tokens (the BPE baseline) gives each token's NLL at its last byte and no byte predictions (-1)."""
    if getattr(model, "predicts_tokens", False):
        out = model(ids, targets, noise=noise, prescribed=prescribed)
        return out.nll, torch.full_like(targets, -1), out.boundaries, out.n_tokens
    out = model(ids, noise=noise, prescribed=prescribed)
    logits = out.logits.float()  # (B,T,V)
    nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                          reduction="none").view_as(targets)  # (B,T)
    return nll, logits.argmax(-1), out.boundaries, out.n_tokens


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="row", disable=not enabled, dynamic_ncols=True, leave=False)


@torch.no_grad()
def heldout_bpb(model, seqs, bm: BoundaryMode, *, batch_size: int = 8, max_bytes: int = 0, skip_bytes: int = 0,
                per_document: bool = False, references: dict | None = None, progress: bool = False,
                stats=None, by_class: bool = False) -> dict:
    """Bits per byte of the sequences of a `learntok.data.ByteSequences` (max_bytes // seq_len of them, or all
    when max_bytes is 0, starting after the first skip_bytes of the stream, rounded up to whole sequences: text
    earlier screens have read can be left out), counting byte targets only (not EOS separators), with the
    standard error over sequences. A sequence's boundary noise is keyed on its index in the split, so skipping
    does not change how a sequence is scored. `per_document` also returns each document's bits and bytes
    within the scored range, and each sequence's (the units of a paired bootstrap,
    `learntok.evaluation.stats.paired_bootstrap`; one boundary draw only). `stats` (a BoundaryStats) collects
    the boundaries of the first draw, compared with `references` (name -> ByteSequences whose flags are
    reference boundaries). `by_class` also returns the bits and bytes of each byte class of the first draw
    (`learntok.evaluation.byteclass`: word starts, the rest of words, spaces, punctuation), each split by the
    bytes that begin one of the model's tokens, for a model that predicts bytes."""
    if skip_bytes < 0:
        raise ValueError(f"skip_bytes must be non-negative, got {skip_bytes}")
    first = -(-skip_bytes // seqs.seq_len)
    if first >= len(seqs):
        raise ValueError(f"{seqs.name}: skipping {skip_bytes:,} bytes leaves no sequence to score (it has "
                         f"{len(seqs)} of {seqs.seq_len} bytes)")
    if per_document and bm.draws > 1:
        raise ValueError("per-document scores need one boundary draw (a k-sample average is per sequence)")
    if by_class and getattr(model, "predicts_tokens", False):
        raise ValueError("a byte-class breakdown needs a model that predicts bytes: a BPE transformer's bits are "
                         "per token")
    classes = ClassBits() if by_class else None
    device = next(model.parameters()).device
    n = len(seqs) - first if max_bytes <= 0 else min(len(seqs) - first, max(1, max_bytes // seqs.seq_len))
    ll = np.zeros((bm.draws, n))
    n_bytes = np.zeros(n)
    n_tok = 0
    doc_bits: dict[int, float] = {}
    doc_bytes: dict[int, int] = {}
    bar = _progress(n, "held-out", progress)
    with evaluating(model, bm):
        for start in range(first, first + n, batch_size):
            idx = np.arange(start, min(start + batch_size, first + n))
            batch = torch.from_numpy(seqs.batch(idx)).to(device)  # (B,S+1) BOS first
            ids, targets = batch[:, :-1], batch[:, 1:]  # (B,S)
            flags = seqs.flag_batch(idx)
            prescribed = None if flags is None else torch.from_numpy(flags[:, :-1]).to(device)
            byte = byte_targets(targets)  # (B,S) BPB counts bytes, not EOS
            n_bytes[idx - first] = byte.sum(1).cpu().numpy()
            for k in range(bm.draws):
                noise = None
                if bm.mode != "greedy":
                    noise = torch.from_numpy(np.stack([text_noise(bm, int(i), k, ids.shape[1]) for i in idx]))
                    noise = noise.to(device)  # (B,S)
                nll, _, out, count = forward_nll(model, ids, targets, noise, prescribed)
                ll[k, idx - first] = -torch.where(byte, nll, 0.0).sum(1).double().cpu().numpy()
                if per_document:
                    bits = nll.double().cpu().numpy() / LN2
                    for row, i in enumerate(idx):
                        for doc, pos, length in seqs.document_spans(int(i)):
                            doc_bits[doc] = doc_bits.get(doc, 0.0) + float(bits[row, pos:pos + length].sum())
                            doc_bytes[doc] = doc_bytes.get(doc, 0) + length
                if k == 0:
                    n_tok += int(count.sum())
                    if classes is not None:
                        classes.add(ids, targets, torch.where(byte, nll, 0.0).double() / LN2, out.mask)
                    if stats is not None:
                        refs = {name: torch.from_numpy(r.flag_batch(idx)[:, :-1]).to(device)
                                for name, r in (references or {}).items()}
                        stats.add(ids, out, refs)
            bar.update(len(idx))
    bar.close()
    if bm.draws > 1:  # log (1/k) sum_i p(x | a_i), per sequence
        seq_ll = torch.logsumexp(torch.from_numpy(ll), 0).numpy() - math.log(bm.draws)
    else:
        seq_ll = ll[0]
    res = ratio_se(-seq_ll / LN2, n_bytes)
    out_d = {"bpb": res["mean"], "bpb_se": res["se"], "sequences": n, "bytes": int(n_bytes.sum()),
             "seq_len": seqs.seq_len, "tokens": n_tok, "first_sequence": first}
    if per_document:
        docs = sorted(doc_bits)
        out_d["per_document"] = {"documents": docs, "bits": [doc_bits[d] for d in docs],
                                 "bytes": [doc_bytes[d] for d in docs]}
        out_d["per_sequence"] = {"bits": (-ll[0] / LN2).tolist(), "bytes": n_bytes.astype(int).tolist()}
    if classes is not None:
        out_d["by_class"] = classes.result()
    if bm.draws > 1:  # the plain average of the k per-sample BPBs, for reference
        out_d["bpb_mean_over_samples"] = float(np.mean([-row.sum() / LN2 / n_bytes.sum() for row in ll]))
    return out_d


@dataclass
class PairScore:
    """The score of one continuation given its context."""

    nll: float
    """-log p(continuation | context) in nats (average mode: the self-normalised k-sample estimate)."""
    n_bytes: int
    """Bytes of the continuation."""
    greedy: bool
    """Every continuation byte is the argmax given its prefix (first draw)."""
    next_byte: int
    """The argmax id after the continuation (first draw): greedy decoding's next byte."""
    truncated: bool
    """The context was left-truncated to fit the window."""


def _row(ctx: bytes, cont: bytes, window: int, annotate) -> dict:
    """Input row for (context, continuation): ids = BOS + kept text, targets = kept text + IGNORE, so the last
    position predicts the byte after the continuation. The text is left-truncated to window - 1 bytes (the
    model's training length including BOS), keeping the whole continuation even if that is longer."""
    full = ctx + cont
    keep = max(window - 1, len(cont))
    off = max(0, len(full) - keep)
    kept = full[off:]
    ids = np.frombuffer(kept, dtype=np.uint8).astype(np.int64)
    row = {"ids": np.concatenate([[BOS], ids]), "targets": np.concatenate([ids, [IGNORE]]), "off": off,
           "n_ctx": len(kept) - len(cont), "n_cont": len(cont), "flags": None}
    if annotate is not None:
        flags = np.asarray(annotate(full), dtype=bool)[off:]  # annotate the whole text, then crop (baselines.md)
        row["flags"] = np.concatenate([[True], flags])
    return row


def _batches(lengths: Sequence[int], batch_size: int, pad_safe: bool) -> list[list[int]]:
    """Row indices grouped into batches, longest first; without pad_safe only equal lengths share a batch."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out and len(out[-1]) < batch_size and (pad_safe or lengths[out[-1][0]] == lengths[i]):
            out[-1].append(i)
        else:
            out.append([i])
    return out


@torch.no_grad()
def score_pairs(model, pairs: Sequence[tuple[bytes, bytes]], keys: Sequence[int], window: int, bm: BoundaryMode,
                *, batch_size: int = 16, progress: bool = False, desc: str = "score") -> list[PairScore]:
    """Score each continuation given its context. keys[i] names the text whose boundary noise row i uses (give
    the choices of one question the same key)."""
    device = next(model.parameters()).device
    annotate = model.boundary.annotator
    rows = [_row(c, y, window, annotate) for c, y in pairs]
    pad_safe = model.boundary.learns_by != "random"
    ctx_ll = np.zeros((bm.draws, len(rows)))
    cont_ll = np.zeros((bm.draws, len(rows)))
    greedy = np.zeros(len(rows), dtype=bool)
    nxt = np.zeros(len(rows), dtype=np.int64)
    bar = _progress(len(rows), desc, progress)
    with evaluating(model, bm):
        for group in _batches([len(r["ids"]) for r in rows], batch_size, pad_safe):
            B, L = len(group), max(len(rows[i]["ids"]) for i in group)
            ids = np.full((B, L), PAD, dtype=np.int64)
            targets = np.full((B, L), IGNORE, dtype=np.int64)
            flags = np.zeros((B, L), dtype=bool) if annotate is not None else None
            for b, i in enumerate(group):
                r = rows[i]
                ids[b, : len(r["ids"])] = r["ids"]
                targets[b, : len(r["ids"])] = r["targets"]
                if flags is not None:
                    flags[b, : len(r["ids"])] = r["flags"]
            t_ids, t_tg = torch.from_numpy(ids).to(device), torch.from_numpy(targets).to(device)
            prescribed = None if flags is None else torch.from_numpy(flags).to(device)
            for k in range(bm.draws):
                noise = None
                if bm.mode != "greedy":
                    u = np.ones((B, L), dtype=np.float32)  # padding: any value (it cannot reach real positions)
                    for b, i in enumerate(group):
                        r = rows[i]
                        u[b, 1: len(r["ids"])] = text_noise(bm, keys[i], k, r["off"] + len(r["ids"]) - 1)[r["off"]:]
                    noise = torch.from_numpy(u).to(device)
                nll, arg, _, _ = forward_nll(model, t_ids, t_tg, noise, prescribed)
                nll, arg = nll.double().cpu().numpy(), arg.cpu().numpy()
                for b, i in enumerate(group):
                    r = rows[i]
                    c, m = r["n_ctx"], r["n_cont"]
                    ctx_ll[k, i] = -nll[b, :c].sum()
                    cont_ll[k, i] = -nll[b, c:c + m].sum()
                    if k == 0:
                        greedy[i] = bool((arg[b, c:c + m] == r["targets"][c:c + m]).all())
                        nxt[i] = arg[b, c + m]
            bar.update(B)
    bar.close()
    if bm.draws > 1:
        joint, marg = torch.from_numpy(ctx_ll + cont_ll), torch.from_numpy(ctx_ll)
        est = (torch.logsumexp(joint, 0) - torch.logsumexp(marg, 0)).numpy()
    else:
        est = cont_ll[0]
    return [PairScore(nll=float(-est[i]), n_bytes=rows[i]["n_cont"], greedy=bool(greedy[i]), next_byte=int(nxt[i]),
                      truncated=rows[i]["off"] > 0) for i in range(len(rows))]


@torch.no_grad()
def greedy_decode(model, contexts: Sequence[bytes], keys: Sequence[int], n_new: int | Sequence[int], window: int,
                  bm: BoundaryMode, *, batch_size: int = 16,
                  stop: Callable[[int, bytes], bool] | None = None) -> list[bytes]:
    """Greedy byte-by-byte continuation of each context, one full forward per new byte (boundaries and, for
    strategies with `annotate`, prescribed flags are recomputed on each prefix, so nothing is looked up from
    bytes not yet generated). Row i stops after n_new (or n_new[i]) bytes, at a special id, or when
    stop(i, generated) is true.
    In average mode the first draw decodes."""
    bm1 = bm if bm.mode != "average" else replace(bm, mode="sample", samples=1)
    limits = [n_new] * len(contexts) if isinstance(n_new, int) else list(n_new)
    gen = [b""] * len(contexts)
    active = [i for i in range(len(contexts)) if limits[i] > 0]
    while active:
        scores = score_pairs(model, [(contexts[i] + gen[i], b"") for i in active], [keys[i] for i in active],
                             window, bm1, batch_size=batch_size)
        still = []
        for i, s in zip(active, scores):
            if not 0 <= s.next_byte < 256:  # a special id, or none (-1: a model that predicts tokens)
                continue
            gen[i] += bytes([s.next_byte])
            if len(gen[i]) < limits[i] and (stop is None or not stop(i, gen[i])):
                still.append(i)
        active = still
    return gen
