"""Entropy patching (Byte Latent Transformer, Pagnoni et al. 2024; docs/baselines.md).

A separately trained, frozen small causal byte LM p_e gives the entropy of its next-byte distribution

    H_t = - sum_v p_e(v | x_<=t) log p_e(v | x_<=t)        (nats; it predicts x_{t+1})

and a token ends at t when the next byte is hard to predict (BLT's global rule):

    a_t = [H_t > theta],   a_0 = 1.

theta is calibrated on held-out text as the (1 - target_rate) quantile of H_t, so the rate is ~ target_rate
(BLT ships no calibration code: facebookresearch/blt#106, #141). Entropies are computed per sequence (each row
of the U-Net's batch on its own; BLT's flattened batch leaks across rows, facebookresearch/blt#123). H_t
depends on x_<=t only, so the boundaries are exactly causal. The entropy model is not a submodule of the
U-Net (learntok.entropy_model): its weights never enter the U-Net's checkpoint, optimizer or FLOPs count.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy, RateConfig, StepState
from learntok.data.corpus import total_bytes
from learntok.entropy_model import (
    THRESHOLD_FILE,
    EntropyLM,
    calibrate_threshold,
    fit_entropy_model,
    heldout_entropies,
    load_entropy_model,
    model_fingerprint,
    save_entropy_model,
)


@dataclass(frozen=True, kw_only=True)
class EntropyConfig(RateConfig):
    """Options of `--boundaries entropy` (BLT entropy patching with a global threshold)."""

    boundaries: str = "entropy"
    entropy_model: str = ""
    """Directory of the small byte LM trained by `learntok train-entropy-model` ("" = train one quickly)."""
    entropy_threshold: float = 0.0
    """Boundary when the next-byte entropy (nats) exceeds this; 0 = calibrate on held-out text so the rate is
    close to target_rate."""


@dataclass(kw_only=True)
class EntropyState(StepState):
    ids: torch.Tensor
    """(B,t) the bytes so far (the entropy model is causal, so it reruns on the prefix)."""


# -- the boundary strategy ---------------------------------------------------------------------------------


class EntropyBoundaries(BoundaryStrategy):
    """a_t = [H_t > theta] from a frozen entropy model (BLT's global threshold); no parameters, no loss."""

    config = EntropyConfig
    learns_by = "prescribed"
    has_step = True

    quick_steps: tuple[int, int] = (5, 600)
    """When prepare has to train an entropy model itself: one pass over the training bytes, clamped to
    these bounds (a few steps on test-sized data, the CLI's default on real data)."""

    def __init__(self, cfg: EntropyConfig, dim: int):
        super().__init__(cfg, dim)
        self.theta: float | None = None
        """The entropy threshold in nats (set by prepare)."""
        self.calibrated_rate: float | None = None
        """Share of held-out decided positions with H_t > theta (set by prepare)."""
        # Held in a plain list rather than as a module attribute: the frozen entropy model must not become a
        # submodule of the U-Net (its weights would enter the U-Net's checkpoint, optimizer and parameter count).
        self._entropy_model: list[EntropyLM] = []
        self.log: Callable[[str], None] = print

    @property
    def entropy_model(self) -> EntropyLM:
        if not self._entropy_model:
            raise RuntimeError("entropy boundaries: call prepare() first (it loads or trains the entropy model)")
        return self._entropy_model[0]

    def artifacts(self) -> list[str]:
        return ["entropy_model", THRESHOLD_FILE]

    def artifact_sources(self, run_dir: Path) -> dict[str, Path]:
        """An entropy model given with --entropy-model is exported from its own directory (the run has no copy)."""
        sources = super().artifact_sources(run_dir)
        if self.cfg.entropy_model:
            sources["entropy_model"] = Path(self.cfg.entropy_model)
        return sources

    def exported_config(self, bcfg: dict) -> dict:
        return {**bcfg, "entropy_model": ""}  # the export carries the model in entropy_model/ (same weights, theta)

    def prepare(self, train_docs: list[bytes], val_docs: list[bytes], run_dir: Path | None) -> None:
        """Load the entropy model (cfg.entropy_model, else run_dir/entropy_model, else train one quickly on
        train_docs and save it there), then fix theta: cfg.entropy_threshold if set, else the theta saved in
        run_dir for this very model (resume, evaluation), else calibrate it on held-out text and save it."""
        cfg = self.cfg
        run_dir = Path(run_dir) if run_dir is not None else None
        local = run_dir / "entropy_model" if run_dir is not None else None
        if cfg.entropy_model:
            self._entropy_model[:] = [load_entropy_model(cfg.entropy_model)]
            source = Path(cfg.entropy_model)
        elif local is not None and (local / "model.safetensors").exists():
            self._entropy_model[:] = [load_entropy_model(local)]
            source = local
        elif train_docs:
            lo, hi = self.quick_steps
            steps = min(hi, max(lo, (total_bytes(train_docs) + len(train_docs)) // (16 * 256)))  # about one pass
            self.log(f"entropy boundaries: no --entropy-model given; training one for {steps} steps "
                     "(`learntok train-entropy-model` trains a better one)")
            model, info = fit_entropy_model(train_docs, val_docs, steps=steps, log=self.log)
            self._entropy_model[:] = [model]
            source = save_entropy_model(model, local, info) if local is not None else None
        else:
            raise ValueError("entropy boundaries: no --entropy-model given, none saved in the run directory, "
                             "and no training documents to train one on")
        saved = run_dir / THRESHOLD_FILE if run_dir is not None else None
        fingerprint = model_fingerprint(source) if source is not None else None
        if cfg.entropy_threshold <= 0 and saved is not None and saved.exists():
            rec = json.loads(saved.read_text())
            # calibrated earlier in this run for this very model and rate (files before the rate was kept: any)
            if rec.get("model") == fingerprint and rec.get("target", cfg.target_rate) == cfg.target_rate:
                self.theta, self.calibrated_rate = float(rec["theta"]), float(rec["rate"])
                self.log(f"entropy boundaries: theta {self.theta:.4f} nats (rate {self.calibrated_rate:.4f}) "
                         f"from {saved}")
                return
        # Held-out text: the model underestimates entropy on its own training data (facebookresearch/blt#100).
        held_out = list(val_docs) or list(train_docs[-max(1, len(train_docs) // 10):])
        if not held_out:
            if cfg.entropy_threshold > 0:
                self.theta = cfg.entropy_threshold
                return
            raise ValueError(f"entropy boundaries: no saved threshold for the entropy model {source} and no "
                             "documents to calibrate one on (give --entropy-threshold or data)")
        h = heldout_entropies(self.entropy_model, held_out)  # (N,)
        calibrate = cfg.entropy_threshold <= 0
        self.theta = calibrate_threshold(h, cfg.target_rate) if calibrate else cfg.entropy_threshold
        self.calibrated_rate = float((h > self.theta).float().mean())
        self.log(f"entropy boundaries: theta {self.theta:.4f} nats gives rate {self.calibrated_rate:.4f} "
                 f"(target {cfg.target_rate}) on {len(h):,} held-out bytes"
                 f"{'' if val_docs else ' (the last tenth of the training documents)'}")
        if calibrate and saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps({"theta": self.theta, "rate": self.calibrated_rate, "target": cfg.target_rate,
                                         "model": fingerprint, "entropy_model": str(source), "held_out_bytes": len(h)},
                                        indent=2) + "\n")

    def entropies(self, ids: torch.Tensor) -> torch.Tensor:
        """H_t (B,T) of every row of ids, on ids' device (the model follows it there on first use)."""
        model = self.entropy_model
        if model.head.weight.device != ids.device:
            model.to(ids.device)
        return model.entropy(ids)

    def init_step_state(self, batch, noise):
        return EntropyState(noise=noise, ids=torch.zeros(batch, 0, dtype=torch.long, device=noise.device))

    def step(self, x_t, ids_t, t, state):
        """H_t from the entropy model over the whole prefix (it is causal, so this equals `propose`)."""
        state.ids = torch.cat([state.ids, ids_t[:, None]], dim=1)  # (B,t+1)
        a = self.entropies(state.ids)[:, -1] > self.theta if t > 0 else torch.ones_like(ids_t, dtype=torch.bool)
        return a, a.float()

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        if self.theta is None:
            raise RuntimeError("entropy boundaries: theta is not set; call prepare() first")
        h = self.entropies(ids)  # (B,T) nats, each row on its own
        mask = h > self.theta  # (B,T) a_t = [H_t > theta]: x_{t+1} is hard, so a token ends at t
        mask[:, 0] = True
        if self.cfg.force_last:
            mask[:, -1] = True
        return BoundaryOutput(mask=mask, probs=mask.float(), stats={"boundary/entropy": h.mean().detach()})
