"""One model for any compression rate: per-row target rates, their draw in training, the rate embedding that
conditions a policy on them, and the calibration table that maps an asked rate to a logit offset
(docs/method.md, "Variable rate").

- `Rates`: what a forward pass is told about rates: each row's target rate, and in training its stratum (rows of
  one stratum share a target, and the estimator's batch statistics are kept per stratum).
- `draw_rates`: the targets of one training step, keyed on (seed, step) like the boundary noise, so every process
  and micro-batch agrees and a resumed run draws what the uninterrupted one drew.
- `RateEmbedding`: a small MLP of the rate's logit, zero at initialisation.
- `Calibration`: logit offsets fitted on held-out text so that the realised rate matches the asked rate
  (`learntok calibrate`), interpolated in logit(rate); saved as RATE_CALIBRATION beside the weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from learntok import atomic

RATE_CALIBRATION = "rate_calibration.json"
"""The calibration table's file in a run or model directory."""

_RATE_KEY = 0x72617465
"""Third key of the rate draws' generator ([seed, step, key, stratum]), apart from the boundary noise's row keys."""


def logit(r: float) -> float:
    return math.log(r / (1 - r))


@dataclass(frozen=True)
class Rates:
    """Per-row target rates of a batch, for a strategy with a rate knob (`learned`)."""

    value: torch.Tensor
    """(B,) float: each row's target rate in (0, 1)."""
    group: torch.Tensor | None = None
    """(B,) long: each row's stratum in [0, strata) in training (rows of a stratum share a target, over the
    whole global batch), or None: one group."""
    offset: torch.Tensor | None = None
    """(B,) float logit offsets used instead of the calibration table's (calibration fits them), or None."""

    @staticmethod
    def fill(rate: float, batch: int, device, offset: float | None = None) -> Rates:
        """Every row at `rate` (and logit `offset`, if given)."""
        value = torch.full((batch,), float(rate), device=device)
        return Rates(value, offset=None if offset is None else torch.full((batch,), float(offset), device=device))


def draw_rates(seed: int, step: int, rows: np.ndarray, total_rows: int, rate_range: tuple[float, float],
               strata: int, distribution: str) -> tuple[np.ndarray, np.ndarray]:
    """(rates (len(rows),) float32, strata (len(rows),) int64) of global rows `rows` of a step's `total_rows`.

    The global batch is cut into `strata` consecutive blocks of rows; block s gets one target drawn from the
    s-th of `strata` equal-probability slices of the distribution (stratified: a step with several strata
    covers the range evenly), keyed on (seed, step, s). log-uniform: log r uniform on [log LOW, log HIGH] (equal
    weight per factor of rate, as an evaluation sweep over r_i = 0.95^i spaces its points); uniform: r uniform."""
    lo, hi = rate_range
    s = (np.asarray(rows, dtype=np.int64) * strata) // total_rows  # (n,)
    u = np.array([(k + np.random.default_rng([seed, step, _RATE_KEY, k]).random()) / strata
                  for k in range(strata)])
    if distribution == "log-uniform":
        r = lo * (hi / lo) ** u
    elif distribution == "uniform":
        r = lo + (hi - lo) * u
    else:
        raise ValueError(f"unknown rate distribution {distribution!r} (log-uniform or uniform)")
    return r[s].astype(np.float32), s


class RateEmbedding(nn.Module):
    """e(r) = W_2 silu(W_1 phi(r) + b_1) + b_2 with phi(r) = logit(r) - logit(r_centre): a vector of `dim` per row.
    The output layer starts at zero (`zero_output`), so a fresh variable-rate model is the fixed-rate one with
    its bias logit(r)."""

    def __init__(self, dim: int, centre: float, hidden: int = 32):
        super().__init__()
        self.centre = logit(centre)
        self.inp = nn.Linear(1, hidden)
        self.out = nn.Linear(hidden, dim)

    def zero_output(self) -> None:
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, rate: torch.Tensor) -> torch.Tensor:
        """rate (B,) -> (B, dim) in the layer's dtype."""
        phi = (torch.logit(rate.float()) - self.centre)[:, None].to(self.inp.weight.dtype)  # (B,1)
        return self.out(nn.functional.silu(self.inp(phi)))


class RateController(nn.Module):
    """c(r): a learned logit offset per target rate, piecewise linear in logit(r) over `knots` points spanning the
    training range (constant beyond), zero at initialisation. It is trained by the rate loss alone (the policy
    uses its value without gradient), so it acts as an integral controller for each target, the online
    counterpart of the calibration table: without it, a per-step target moves the shared logits, and the
    rate of one target is learned only through the policy's other parameters (measured: asked 0.09, a
    variable-rate model drew 0.146)."""

    LR_SCALE = 30.0
    """Its learning rate is the schedule's times this (learntok.train.schedule.make_optimizer): at the model's rate
    of a few 1e-3 logit per step, an offset of one logit would take longer than a CPU run lasts."""

    def __init__(self, rate_range: tuple[float, float], knots: int = 9):
        super().__init__()
        lo, hi = (logit(r) for r in rate_range)
        self.grid = [lo + (hi - lo) * i / (knots - 1) for i in range(knots)]
        self.offset = nn.Parameter(torch.zeros(knots))

    def forward(self, rate: torch.Tensor) -> torch.Tensor:
        """rate (B,) -> c(rate) (B,) with gradient to the knots."""
        xs = torch.tensor(self.grid, dtype=torch.float32, device=rate.device)
        x = torch.logit(rate.float()).clamp(xs[0], xs[-1])
        i = torch.searchsorted(xs, x.detach(), right=True).clamp(1, len(self.grid) - 1)
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])  # (B,) in [0, 1]
        return self.offset[i - 1] * (1 - w) + self.offset[i] * w


def warn_mismatch(model, greedy: bool | None = None, checkpoint: str | None = None) -> None:
    """A LearntokWarning when the model's calibration table may not fit (Calibration.mismatch)."""
    cal = getattr(getattr(model, "boundary", None), "calibration", None)
    why = cal.mismatch(greedy, checkpoint) if cal is not None else None
    if why:
        import warnings

        from learntok.errors import LearntokWarning

        warnings.warn(why, LearntokWarning, stacklevel=3)


def lr_scales(model: nn.Module) -> dict[int, float]:
    """id(parameter) -> its learning-rate scale, for the parameters that have one (the rate controller's), found by
    module type (which survives FSDP2's sharding, unlike parameter attributes)."""
    return {id(p): m.LR_SCALE for m in model.modules() if isinstance(m, RateController) for p in m.parameters()}


def interp(x: torch.Tensor, xp: list[float], fp: list[float]) -> torch.Tensor:
    """Piecewise-linear interpolation of (xp, fp) at x (xp increasing), constant beyond the ends (np.interp)."""
    xs = torch.tensor(xp, dtype=torch.float32, device=x.device)
    fs = torch.tensor(fp, dtype=torch.float32, device=x.device)
    x = x.float().clamp(xs[0], xs[-1])
    if len(xp) == 1:
        return fs.expand_as(x).clone()
    i = torch.searchsorted(xs, x, right=True).clamp(1, len(xp) - 1)
    x0, x1, f0, f1 = xs[i - 1], xs[i], fs[i - 1], fs[i]
    return f0 + (f1 - f0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Calibration:
    """Logit offsets at asked rates: asked r -> boundary bias logit(r) + offset(r), offset interpolated linearly
    in logit(r) between the fitted rates and held constant beyond them. Fitted by
    learntok.evaluation.rates.calibrate on held-out text."""

    rates: tuple[float, ...]
    """The asked rates it was fitted at (increasing)."""
    offsets: tuple[float, ...]
    """The logit offset at each."""
    info: dict
    """How it was fitted (text, bytes, draw, realised rates), kept in the file."""

    def offset(self, rate: torch.Tensor) -> torch.Tensor:
        """(B,) offsets at asked rates (B,)."""
        return interp(torch.logit(rate.float()), [logit(r) for r in self.rates], list(self.offsets))

    def save(self, directory: str | Path) -> Path:
        return atomic.write_text(Path(directory) / RATE_CALIBRATION, json.dumps(
            {"rates": list(self.rates), "offsets": list(self.offsets), **self.info}, indent=2) + "\n")

    @staticmethod
    def load(directory: str | Path | None) -> Calibration | None:
        """The table saved in `directory`, or None if there is none."""
        if directory is None or not (Path(directory) / RATE_CALIBRATION).is_file():
            return None
        path = Path(directory) / RATE_CALIBRATION
        try:
            d = json.loads(path.read_text())
            rates, offsets = d.pop("rates"), d.pop("offsets")
        except (ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}: not a calibration table ({e}); run learntok calibrate again") from None
        if len(rates) != len(offsets) or not rates or any(b <= a for a, b in zip(rates, rates[1:])):
            raise ValueError(f"{path}: rates must be increasing, one offset each")
        return Calibration(tuple(rates), tuple(offsets), d)

    def mismatch(self, greedy: bool | None = None, checkpoint: str | None = None) -> str | None:
        """Why the table may not fit these draws: fitted for the other boundary mode (greedy or sampled; None:
        not checked), or on another checkpoint than `checkpoint`; None when it fits."""
        mode = self.info.get("mode")
        if greedy is not None and mode is not None and (mode == "greedy") != greedy:
            return (f"the rate calibration table was fitted for {mode} boundaries and these are "
                    f"{'greedy' if greedy else 'sampled'}: the realised rate can miss the asked one (run learntok "
                    f"calibrate {'--greedy ' if greedy else ''}again)")
        fitted = self.info.get("checkpoint")
        if checkpoint is not None and fitted is not None and fitted != checkpoint:
            return (f"the rate calibration table was fitted on {fitted}, not {checkpoint}: run learntok calibrate "
                    "again")
        return None
