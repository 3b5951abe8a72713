"""Statistics of an evaluation: means with standard errors, and boundary statistics on held-out text.

Standard errors are over independent units (held-out sequences, task examples): SE = s / sqrt(n) with the
sample standard deviation s (ddof = 1). A pooled ratio such as held-out BPB = sum(nll) / (ln 2 * sum(bytes))
gets the delta-method SE of a ratio estimator, which equals s / sqrt(n) of the per-sequence BPB when every
sequence has the same number of bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from learntok.boundaries.whitespace import spacebyte_boundaries

HIST_CAP = 64
"""Token lengths (bytes per token) of HIST_CAP or more share the last histogram bucket."""
SHIFTS = (-2, -1, 1, 2)
"""Offsets at which agreement with a reference is also measured: F1 at shift k compares the model's boundary at t
with the reference's at t + k, so boundaries one byte early (k = 1) or late (k = -1) show as such instead of as
chance."""


def mean_se(values: Sequence[float] | np.ndarray) -> dict:
    """{"mean", "se", "n"} of independent values; se is s / sqrt(n) (ddof = 1), 0 for fewer than 2 values."""
    v = np.asarray(values, dtype=np.float64)
    n = int(v.size)
    if n == 0:
        return {"mean": float("nan"), "se": float("nan"), "n": 0}
    se = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return {"mean": float(v.mean()), "se": se, "n": n}


def ratio_se(num: Sequence[float] | np.ndarray, den: Sequence[float] | np.ndarray) -> dict:
    """{"mean", "se", "n"} of R = sum(num) / sum(den) over n units, with the delta-method standard error
    SE(R) = sqrt(sum((num_i - R den_i)^2) / (n (n - 1))) / mean(den)."""
    a, b = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = int(a.size)
    if n == 0 or b.sum() <= 0:
        return {"mean": float("nan"), "se": float("nan"), "n": n}
    r = a.sum() / b.sum()
    se = float(math.sqrt(((a - r * b) ** 2).sum() / (n * (n - 1))) / b.mean()) if n > 1 else 0.0
    return {"mean": float(r), "se": se, "n": n}


def prf(tp: int, fp: int, fn: int) -> dict:
    """Precision, recall and F1 of boundary decisions from counts (nan where undefined)."""
    p = tp / (tp + fp) if tp + fp else float("nan")
    r = tp / (tp + fn) if tp + fn else float("nan")
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
    return {"precision": p, "recall": r, "f1": f1, "tp": tp, "fp": fp, "fn": fn}


def token_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Bytes per token of every complete token in `mask` (B,T) bool: a_t = 1 ends a token at t, so token lengths
    are the distances between consecutive boundaries. The BOS token (position 0) and the unfinished token after a
    row's last boundary are not counted. Returns a flat long tensor."""
    B, T = mask.shape
    t = torch.arange(T, device=mask.device).expand(B, T)
    last = torch.where(mask, t, torch.full_like(t, -1)).cummax(1).values  # (B,T) latest boundary at or before t
    prev = torch.nn.functional.pad(last[:, :-1], (1, 0), value=-1)  # (B,T) latest boundary strictly before t
    keep = mask & (prev >= 0)
    return (t - prev)[keep]


class BoundaryStats:
    """Accumulates boundary statistics over batches of held-out sequences.

    Counted positions: every input position (BOS and EOS included) for the rate, since each is a byte-level
    position that may form a token (this is the rate that enters the FLOPs); agreement with reference
    boundaries is over byte positions only (ids < 256: BOS is forced and EOS separators are not text)."""

    def __init__(self) -> None:
        self.n_pos = self.n_bound = 0
        self.nlp_sum = self.ent_sum = 0.0
        self.n_free = self.len_sum = 0
        self.has_policy = False
        self.hist = np.zeros(HIST_CAP + 1, dtype=np.int64)  # hist[k] = tokens of k bytes (k = HIST_CAP: >=)
        self.counts: dict[str, list[int]] = {}  # reference -> [tp, fp, fn, n_ref_boundaries, n_bytes]
        self.shift_hits: dict[str, dict[int, int]] = {}  # reference -> shift k -> boundaries matched at t + k

    def add(self, ids: torch.Tensor, out, references: dict[str, torch.Tensor] | None = None) -> None:
        """ids (B,T) model inputs; out the BoundaryOutput; references name -> (B,T) bool boundaries."""
        mask = out.mask.bool()  # (B,T)
        self.n_pos += mask.numel()
        self.n_bound += int(mask.sum())
        lengths = token_lengths(mask)
        self.len_sum += int(lengths.sum())
        self.hist += np.bincount(lengths.clamp(max=HIST_CAP).cpu().numpy(), minlength=HIST_CAP + 1)
        if out.log_prob is not None:
            self.has_policy = True
            free = out.free if out.free is not None else torch.ones_like(mask)
            lp = out.log_prob.detach().double()
            self.nlp_sum += float(-torch.where(free, lp, 0.0).sum())
            p = out.probs.detach().double().clamp(1e-12, 1 - 1e-12)  # Bernoulli entropy of each free decision
            ent = -(p * p.log() + (1 - p) * (1 - p).log())
            self.ent_sum += float(torch.where(free, ent, 0.0).sum())
            self.n_free += int(free.sum())
        byte = ids < 256  # (B,T)
        refs = {"whitespace": spacebyte_boundaries(ids), **(references or {})}
        for name, ref in refs.items():
            ref = ref.bool() & byte
            pred = mask & byte
            c = self.counts.setdefault(name, [0, 0, 0, 0, 0])
            c[0] += int((pred & ref).sum())
            c[1] += int((pred & ~ref).sum())
            c[2] += int((~pred & ref).sum())
            c[3] += int(ref.sum())
            c[4] += int(byte.sum())
            hits = self.shift_hits.setdefault(name, dict.fromkeys(SHIFTS, 0))
            for k in SHIFTS:  # the model's boundary at t against the reference's at t + k
                if k > 0:
                    hits[k] += int((pred[:, :-k] & ref[:, k:]).sum())
                else:
                    hits[k] += int((pred[:, -k:] & ref[:, :k]).sum())

    def result(self) -> dict:
        """JSON-ready statistics; policy terms are None for strategies without a policy."""
        rate = self.n_bound / max(self.n_pos, 1)
        n_tok = int(self.hist.sum())
        cum = np.cumsum(self.hist)

        def quantile(q: float) -> int | None:
            return int(np.searchsorted(cum, q * n_tok)) if n_tok else None

        agree = {}
        for name, (tp, fp, fn, n_ref, n_bytes) in self.counts.items():
            q = n_ref / max(n_bytes, 1)  # the reference's own rate over byte positions
            r_model = (tp + fp) / max(n_bytes, 1)
            chance = 2 * q * r_model / (q + r_model) if q + r_model > 0 else float("nan")
            n_pred, shifted = tp + fp, {0: prf(tp, fp, fn)["f1"]}
            for k, hit in self.shift_hits.get(name, {}).items():
                shifted[k] = 2 * hit / (n_pred + n_ref) if n_pred + n_ref else float("nan")
            best = max(sorted(shifted), key=lambda k: (shifted[k], -abs(k)))
            hits = tp if best == 0 else self.shift_hits[name][best]  # matches at the model's own alignment
            agree[name] = {**prf(tp, fp, fn), "reference_rate": q, "f1_chance": chance,
                           "f1_by_shift": {str(k): shifted[k] for k in sorted(shifted)}, "best_shift": best,
                           "at_best_shift": prf(hits, n_pred - hits, n_ref - hits)}
        return {
            "rate": rate,
            "positions": self.n_pos,
            "neg_log_pi": self.nlp_sum / self.n_free if self.has_policy and self.n_free else None,
            "policy_entropy": self.ent_sum / self.n_free if self.has_policy and self.n_free else None,
            "bytes_per_token": self.len_sum / n_tok if n_tok else None,
            "bytes_per_token_p10_p50_p90": [quantile(0.1), quantile(0.5), quantile(0.9)],
            "bytes_per_token_hist": self.hist[1:].tolist(),
            "agreement": agree,
        }



def _t_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer `df` degrees of freedom, in closed form (Abramowitz and Stegun
    26.7.3-4): a finite series in the cosine of atan(t / sqrt(df))."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    total = theta
    if df > 1:
        term = series = 1.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
        total += s * math.cos(theta) * series
    return 2.0 * total / math.pi


def t_quantile(level: float, df: int) -> float:
    """The two-sided Student-t quantile: t with P(|T| <= t) = level at `df` degrees of freedom (exact to float
    precision for any integer df >= 1, by bisection on the closed-form coverage; 12.706 at df 1, 2.228 at 10)."""
    if not (0.0 < level < 1.0) or int(df) != df or df < 1:
        raise ValueError(f"t_quantile needs 0 < level < 1 and an integer df >= 1, got {level}, {df}")
    lo, hi = 0.0, 1.0
    while _t_coverage(hi, int(df)) < level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_coverage(mid, int(df)) < level else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def paired_bootstrap(bits_a: Sequence[float], bits_b: Sequence[float], n_bytes: Sequence[int], *,
                     resamples: int = 10_000, level: float = 0.95, seed: int = 0) -> dict:
    """BPB of model A − BPB of model B on the same text, with a percentile interval from a paired bootstrap over
    documents: each resample draws documents with replacement and takes the ratio of summed bits to summed
    bytes for both models on the same draw, so what the two share (how hard each document is) cancels.
    {"mean", "lo", "hi", "units", "resamples", "level", "tie"}; "mean" is the difference on the text itself."""
    a, b = np.asarray(bits_a, dtype=np.float64), np.asarray(bits_b, dtype=np.float64)
    w = np.asarray(n_bytes, dtype=np.float64)
    if not (a.shape == b.shape == w.shape) or a.ndim != 1 or a.size < 2:
        raise ValueError(f"a paired bootstrap needs the same >= 2 units for both models, got {a.size} and {b.size}")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples must be >= 1 and level in (0, 1), got {resamples} and {level}")
    rng, p, diffs = np.random.default_rng(seed), np.full(a.size, 1 / a.size), []
    for start in range(0, resamples, 1000):  # in chunks: resamples x units counts can be large
        counts = rng.multinomial(a.size, p, size=min(1000, resamples - start)).astype(np.float64)
        total = counts @ w
        diffs.append((counts @ a - counts @ b) / np.where(total > 0, total, 1))
    diffs = np.concatenate(diffs)
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float((a.sum() - b.sum()) / w.sum()), "lo": float(lo), "hi": float(hi), "units": int(a.size),
            "resamples": resamples, "level": level, "tie": bool(lo <= 0.0 <= hi)}


def interval_text(p: dict, digits: int = 4, tie: bool = False) -> str:
    """A paired interval (paired_interval's or paired_bootstrap's dict) as every table prints it: `mean [lo, hi]`,
    signed; with `tie`, " tie" appended when the interval covers 0."""
    text = f"{p['mean']:+.{digits}f} [{p['lo']:+.{digits}f}, {p['hi']:+.{digits}f}]"
    return text + (" tie" if tie and p["tie"] else "")


def paired_interval(diffs: Sequence[float], level: float = 0.95) -> dict:
    """Mean of paired differences (one per seed) with its Student-t interval: {"mean", "half", "se", "n", "t",
    "lo", "hi", "tie"} ("tie": the interval covers 0). Needs at least 2 differences."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        raise ValueError(f"a paired interval needs at least 2 differences, got {d.size}")
    m, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    half = t_quantile(level, d.size - 1) * se
    return {"mean": m, "half": half, "se": se, "n": int(d.size), "t": abs(m) / se if se else math.inf,
            "lo": m - half, "hi": m + half, "tie": m - half <= 0.0 <= m + half}
