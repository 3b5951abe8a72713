"""Asking a model for another compression rate: the calibration that makes the realised rate the asked one, and
the authors' rate sweep (bits per byte and realised rate at many asked rates).

The realised rate is `learntok eval`'s: boundaries per input position of the held-out sequences (BOS included),
drawn the evaluation way (one seeded sample per text, or greedy). Asking a model for rate r puts logit(r) where
its policy had logit(target rate) (a variable-rate model is also conditioned on r); whether it then draws r
boundaries per byte depends on how far its content term moves the probabilities, so `calibrate` fits, for each
of a grid of asked rates, the logit offset that makes the realised rate on held-out text equal the asked one
(bisection on the offset, with the encoder states computed once: the offset changes only the policy), and
`learntok calibrate` saves the table beside the model (learntok.boundaries.rates.Calibration).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from learntok.boundaries.rates import Calibration, Rates
from learntok.evaluation.bpb import BoundaryMode, evaluating, heldout_bpb, text_noise
from learntok.evaluation.stats import BoundaryStats

SWEEP = tuple(0.95**i for i in range(1, 45))
"""The authors' sweep of asked rates, 0.95^i for i = 0..44, without its first point: 0.95 down to 0.104. Rate 1.0
(i = 0) cannot be asked of a Bernoulli policy (its logit is infinite; `set_rate` refuses it)."""
PAPER_MODE = BoundaryMode()
"""One boundary sample per text with the evaluation seed (the paper's protocol)."""
OFFSET_BOUND = 12.0
"""Largest logit offset calibration searches (|offset|): a probability moves from 0.5 to 6e-6 over it."""


def log_spaced(lo: float, hi: float, n: int) -> list[float]:
    """n rates from lo to hi, evenly spaced in log rate."""
    if n == 1:
        return [lo]
    return [float(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)]


def default_rates(model, n: int = 9) -> list[float]:
    """A calibration grid: the variable-rate model's training range, or a factor of two around a fixed-rate
    model's target."""
    cfg = model.bcfg
    lo, hi = cfg.rate_range if getattr(cfg, "rate_range", None) else (cfg.target_rate / 2,
                                                                       min(2 * cfg.target_rate, 0.9))
    return log_spaced(lo, hi, n)


def _check(model) -> None:
    if not model.boundary.rate_knob:
        raise ValueError(f"--boundaries {model.bcfg.boundaries} has no rate knob: only a learned policy can be asked "
                         "for another rate")


class EncodedText:
    """The encoder states of held-out sequences, computed once, and the boundaries the policy draws on them for
    any asked rate and offset (exactly what a full forward pass would draw: the policy reads only X)."""

    def __init__(self, model, seqs, bm: BoundaryMode, max_bytes: int = 0, batch_size: int = 16):
        _check(model)
        self.model, self.bm = model, bm
        device = next(model.parameters()).device
        n = len(seqs) if max_bytes <= 0 else min(len(seqs), max(1, max_bytes // seqs.seq_len))
        self.parts = []
        with evaluating(model, bm), torch.no_grad():
            for start in range(0, n, batch_size):
                idx = np.arange(start, min(start + batch_size, n))
                ids = torch.from_numpy(seqs.batch(idx)).to(device)[:, :-1]  # (B,S) BOS first
                noise = None
                if bm.mode != "greedy":  # heldout_bpb's noise for these sequences (first draw)
                    noise = torch.from_numpy(np.stack([text_noise(bm, int(i), 0, ids.shape[1]) for i in idx]))
                    noise = noise.to(device)
                self.parts.append((model.encode(ids), ids, noise))
        self.positions = sum(ids.numel() for _, ids, _ in self.parts)

    @torch.no_grad()
    def rate(self, asked: float, offset: float | None = None) -> float:
        """Boundaries per position when asked for `asked` with logit `offset` (None: the model's own calibration,
        if it has one)."""
        n = 0
        with evaluating(self.model, self.bm):
            for x, ids, noise in self.parts:
                rates = Rates.fill(asked, ids.shape[0], ids.device, offset)
                out = self.model.boundary.propose(x, ids, noise=noise, generator=None, rates=rates)
                n += int(out.mask.sum())
        return n / self.positions


def fit_offset(encoded: EncodedText, asked: float, tol: float = 2e-4, iters: int = 40) -> tuple[float, float]:
    """(offset, realised rate): bisection on the logit offset until the realised rate is within `tol` of `asked`
    (the realised rate rises with the offset, up to sampling noise)."""
    lo, hi = -OFFSET_BOUND, OFFSET_BOUND
    best = (0.0, encoded.rate(asked, 0.0))
    for _ in range(iters):
        if abs(best[1] - asked) <= tol:
            break
        mid = (lo + hi) / 2
        got = encoded.rate(asked, mid)
        if abs(got - asked) < abs(best[1] - asked):
            best = (mid, got)
        lo, hi = (mid, hi) if got < asked else (lo, mid)
    return best


def calibrate(model, seqs, rates: Sequence[float], bm: BoundaryMode = PAPER_MODE, *, max_bytes: int = 262_144,
              batch_size: int = 16, source: str = "", log: Callable[[str], None] | None = None) -> Calibration:
    """The calibration table of `model` on held-out sequences `seqs` (a ByteSequences) at asked `rates`."""
    rates = sorted(set(float(r) for r in rates))
    if not rates or not all(0 < r < 1 for r in rates):
        raise ValueError(f"calibration rates must be in (0, 1), got {rates}")
    encoded = EncodedText(model, seqs, bm, max_bytes, batch_size)
    offsets, realised, before = [], [], []
    for r in rates:
        before.append(encoded.rate(r, 0.0))
        off, got = fit_offset(encoded, r)
        offsets.append(off)
        realised.append(got)
        if log:
            log(f"asked {r:.4f}: realised {before[-1]:.4f} uncalibrated, offset {off:+.3f} -> {got:.4f}")
    info = {"text": source, "positions": encoded.positions, "mode": bm.mode, "seed": bm.seed,
            "realised_uncalibrated": before, "realised": realised}
    return Calibration(tuple(rates), tuple(offsets), info)


@contextlib.contextmanager
def asking(model, rate: float | None, calibration: bool = True):
    """The model asked for `rate` meanwhile (and, with calibration=False, without its calibration table)."""
    strategy = model.boundary
    old_rate, old_cal = getattr(strategy, "asked", None), getattr(strategy, "calibration", None)
    model.set_rate(rate)
    if not calibration:
        strategy.calibration = None
    try:
        yield
    finally:
        strategy.asked = old_rate
        strategy.calibration = old_cal


def rate_sweep(model, seqs, rates: Sequence[float], bm: BoundaryMode = PAPER_MODE, *, max_bytes: int = 65_536,
               batch_size: int = 16, progress: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """Bits per byte and realised rate at every asked rate (the authors' protocol; SWEEP is their 45 points less
    rate 1.0), with the model's calibration table if it has one; also the realised rate without it."""
    _check(model)
    encoded = EncodedText(model, seqs, bm, max_bytes, batch_size)
    calibrated = getattr(model.boundary, "calibration", None) is not None
    points = []
    for r in rates:
        with asking(model, r):
            stats = BoundaryStats()
            res = heldout_bpb(model, seqs, bm, batch_size=batch_size, max_bytes=max_bytes, progress=progress,
                              stats=stats)
        point = {"asked": float(r), "realised": stats.result()["rate"], "bpb": res["bpb"], "bpb_se": res["bpb_se"],
                 "realised_uncalibrated": encoded.rate(r, 0.0) if calibrated else stats.result()["rate"]}
        points.append(point)
        if log:
            log(f"asked {r:.4f}: realised {point['realised']:.4f}, BPB {point['bpb']:.4f}")
    return {"points": points, "calibrated": calibrated, "bytes": res["bytes"], "sequences": res["sequences"],
            "mode": bm.mode, "seed": bm.seed}


def format_sweep(sweep: dict) -> str:
    """The sweep as a Markdown table."""
    cal = sweep["calibrated"]
    lines = ["| asked rate | realised | " + ("realised uncalibrated | " if cal else "") + "BPB |",
             "|---|---|" + ("---|" if cal else "") + "---|"]
    for p in sweep["points"]:
        lines.append(f"| {p['asked']:.4f} | {p['realised']:.4f} | "
                     + (f"{p['realised_uncalibrated']:.4f} | " if cal else "")
                     + f"{p['bpb']:.4f} ± {p['bpb_se']:.4f} |")
    worst = max(abs(p["realised"] - p["asked"]) for p in sweep["points"])
    lines.append(f"\nlargest |realised - asked|: {worst:.4f}" + (" (calibrated)" if cal else " (no calibration)"))
    return "\n".join(lines)


def interpolate_bpb(points: list[dict], rate: float) -> float:
    """BPB at realised `rate`, linear in log rate between the two sweep points around it (NaN outside)."""
    pts = sorted((p["realised"], p["bpb"]) for p in points)
    for (r0, b0), (r1, b1) in zip(pts, pts[1:]):
        if r0 <= rate <= r1 and r1 > r0:
            w = (math.log(rate) - math.log(r0)) / (math.log(r1) - math.log(r0))
            return b0 + w * (b1 - b0)
    return float("nan")
