"""Entropy patching (Byte Latent Transformer, Pagnoni et al. 2024; baselines.md §2f).

A separately trained, frozen small causal byte LM p_e gives the entropy of its next-byte distribution

    H_t = - sum_v p_e(v | x_<=t) log p_e(v | x_<=t)        (nats; it predicts x_{t+1})

and a token ends at t when the next byte is hard to predict (BLT's global rule):

    a_t = [H_t > theta],   a_0 = 1.

theta is calibrated on held-out text as the (1 - target_rate) quantile of H_t, so the rate is ~ target_rate
(BLT ships no calibration code: facebookresearch/blt#106, #141). Entropies are computed per sequence (each row
of the U-Net's batch on its own; BLT's flattened batch leaks across rows, facebookresearch/blt#123). H_t
depends on x_<=t only, so the boundaries are exactly causal. The entropy model is not a submodule of the
U-Net: its weights never enter the U-Net's checkpoint, optimizer or FLOPs count (its forward pass costs
2 x its matrix params per byte on top, reported by `train_entropy_model`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_model, save_model

from learntok.boundaries.base import BoundaryOutput, BoundaryStrategy
from learntok.config import BoundaryConfig, DataConfig
from learntok.data import BatchIterator, ByteSequences, describe, load_splits, val_batches
from learntok.model.layers import Block, RMSNorm, rope_tables
from learntok.vocab import VOCAB_SIZE

LN2 = math.log(2.0)
CALIB_SEQ_LEN = 512
"""Sequence length (BOS + bytes) of the held-out windows theta is calibrated on."""
CALIB_BYTES = 262_144
"""At most this many held-out bytes are used for calibration and validation."""
THRESHOLD_FILE = "entropy_threshold.json"
"""Written in the run directory: theta, the rate it gave on held-out text, and the entropy model's hash."""


@dataclass(frozen=True, kw_only=True)
class EntropyModelConfig:
    """The small causal byte LM whose next-byte entropy places the boundaries."""

    d_model: int = 64
    """Width."""
    n_layers: int = 2
    """Transformer blocks (Gemma-2 blocks of learntok.model.layers)."""
    n_heads: int = 2
    """Attention heads; d_model / n_heads must be even (RoPE)."""
    window: int = 64
    """Sliding-window size: byte t attends to bytes t-window+1 .. t, so H_t sees at most
    n_layers * (window - 1) + 1 bytes of context."""
    mlp_mult: float = 2.0
    """GeGLU hidden width as a multiple of d_model."""
    rope_base: float = 10000.0
    """RoPE base."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of matrices and embeddings."""


class EntropyLM(nn.Module):
    """Byte embedding, sliding-window blocks (SDPA, no soft-cap), final norm, head: logits over VOCAB_SIZE."""

    def __init__(self, cfg: EntropyModelConfig):
        super().__init__()
        d, H = cfg.d_model, cfg.n_heads
        if d % H or (d // H) % 2:
            raise ValueError(f"entropy model: d_model={d} must split into n_heads={H} heads of even size")
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB_SIZE, d)
        hidden = round(cfg.mlp_mult * d)
        self.blocks = nn.ModuleList(Block(d, H, hidden, cfg.window, 0.0, "sdpa") for _ in range(cfg.n_layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, VOCAB_SIZE, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=cfg.init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B,T) -> next-byte logits (B,T,V) in fp32; row b depends on row b only, position t on ids_<=t."""
        T = ids.shape[1]
        rope = rope_tables(torch.arange(T, device=ids.device), self.cfg.d_model // self.cfg.n_heads,
                           self.cfg.rope_base)
        h = self.embed(ids)  # (B,T,D)
        for blk in self.blocks:
            h = blk(h, rope)
        return self.head(self.norm(h)).float()  # (B,T,V)

    @torch.no_grad()
    def entropy(self, ids: torch.Tensor) -> torch.Tensor:
        """H_t in nats (B,T), fp32 with autocast off so that theta means the same on CPU and under bf16."""
        with torch.autocast(ids.device.type, enabled=False):
            logp = F.log_softmax(self(ids), dim=-1)  # (B,T,V)
            return -(logp.exp() * logp).sum(-1)  # (B,T)

    def matrix_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2)


# -- save / load -------------------------------------------------------------------------------------------


def save_entropy_model(model: EntropyLM, out_dir: str | Path, info: dict | None = None) -> Path:
    """Write out_dir/config.json (+ an optional info.json) and out_dir/model.safetensors."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(model.cfg), indent=2) + "\n")
    if info is not None:
        (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    save_model(model, str(out / "model.safetensors"))
    return out


def load_entropy_model(path: str | Path) -> EntropyLM:
    """The frozen model saved by `save_entropy_model` (eval mode, no grad). Unknown config keys are errors."""
    path = Path(path)
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"{path}: not an entropy model directory (needs config.json and model.safetensors)")
    d = json.loads((path / "config.json").read_text())
    names = {f.name for f in dataclasses.fields(EntropyModelConfig)}
    if set(d) - names:
        raise ValueError(f"{path}/config.json: unknown entropy-model key(s) {sorted(set(d) - names)}")
    model = EntropyLM(EntropyModelConfig(**d))
    load_model(model, str(path / "model.safetensors"))
    return model.eval().requires_grad_(False)


def model_fingerprint(path: str | Path) -> str:
    """sha256 of the weights file: ties a saved theta to the entropy model it was calibrated for."""
    return hashlib.sha256((Path(path) / "model.safetensors").read_bytes()).hexdigest()[:16]


# -- data, evaluation, calibration -------------------------------------------------------------------------


def _sequences(docs: Sequence[bytes], seq_len: int, name: str) -> ByteSequences:
    """Packed sequences; seq_len shrinks to the whole stream when the documents are shorter than one window."""
    stream = sum(len(d) + 1 for d in docs)
    return ByteSequences(docs, max(2, min(seq_len, stream)), pack=True, name=name)


@torch.no_grad()
def evaluate_bpb(model: EntropyLM, docs: Sequence[bytes], seq_len: int = CALIB_SEQ_LEN,
                 max_bytes: int = CALIB_BYTES, batch_size: int = 16) -> float:
    """Bits per byte of `model` on the first max_bytes of `docs` (byte targets only, as train.evaluate)."""
    nll, n = 0.0, 0
    for batch in val_batches(_sequences(docs, seq_len, "entropy-model validation data"), batch_size, max_bytes):
        ids, targets = batch[:, :-1], batch[:, 1:]  # (B,T), (B,T)
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(), reduction="none")  # (B*T,)
        byte = targets.flatten() < 256
        nll, n = nll + float(loss[byte].sum()), n + int(byte.sum())
    return nll / (LN2 * max(n, 1))


@torch.no_grad()
def heldout_entropies(model: EntropyLM, docs: Sequence[bytes], seq_len: int = CALIB_SEQ_LEN,
                      max_bytes: int = CALIB_BYTES, batch_size: int = 16) -> torch.Tensor:
    """H_t at every decided position (t >= 1) of the held-out windows, laid out as the U-Net sees them
    (BOS + seq_len - 1 bytes per row): a flat fp32 tensor."""
    out = []
    for batch in val_batches(_sequences(docs, seq_len, "calibration data"), batch_size, max_bytes):
        out.append(model.entropy(batch[:, :-1])[:, 1:].flatten())  # (B*(T-1),) position 0 is forced
    return torch.cat(out)


def calibrate_threshold(h: torch.Tensor, target_rate: float) -> float:
    """theta with exactly k = round(target_rate * N) of the N entropies above it (barring ties): the midpoint
    between the k-th and (k+1)-th largest, i.e. the (1 - target_rate) quantile."""
    s = h.float().sort(descending=True).values  # (N,)
    k = min(max(round(target_rate * len(s)), 1), len(s) - 1)
    return float((s[k - 1] + s[k]) / 2)


# -- training ----------------------------------------------------------------------------------------------


def fit_entropy_model(train_docs: Sequence[bytes], val_docs: Sequence[bytes], *, steps: int = 600,
                      seq_len: int = 256, batch_size: int = 16, lr: float = 3e-3, seed: int = 0,
                      cfg: EntropyModelConfig | None = None,
                      log: Callable[[str], None] = print) -> tuple[EntropyLM, dict]:
    """Train the entropy model with AdamW (weight decay 0.1 on matrices, linear warm-up over 5% of the steps,
    cosine to 10%) on packed BOS-prefixed windows of train_docs (learntok's data pipeline); return the frozen
    model and a record of the run (time, validation BPB on val_docs). Deterministic given `seed`; CPU."""
    cfg = cfg or EntropyModelConfig()
    torch.manual_seed(seed)
    model = EntropyLM(cfg)
    batches = BatchIterator(_sequences(train_docs, seq_len, "entropy-model training data"), batch_size, seed)
    decay = [p for p in model.parameters() if p.dim() >= 2 and p is not model.embed.weight]
    rest = [p for p in model.parameters() if p.dim() < 2 or p is model.embed.weight]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"entropy model: {n_params / 1e3:.0f}k parameters ({model.matrix_params() / 1e3:.0f}k in matrices), "
        f"{steps} steps of {batch_size} x {seq_len} bytes")
    t0, every = time.perf_counter(), max(1, steps // 5)
    model.train()
    for step in range(1, steps + 1):
        frac = (step - warmup) / max(1, steps - warmup)
        scale = step / warmup if step <= warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = lr * scale
        ids = batches.next_batch()  # (B,T+1): BOS + T bytes
        logits = model(ids[:, :-1])  # (B,T,V)
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == 1 or step % every == 0 or step == steps:
            log(f"entropy model step {step}/{steps}: train bpb {loss.item() / LN2:.3f} "
                f"({time.perf_counter() - t0:.1f} s)")
    seconds = time.perf_counter() - t0
    model.eval().requires_grad_(False)
    val_bpb = evaluate_bpb(model, val_docs) if val_docs else float("nan")
    log(f"entropy model trained in {seconds:.1f} s: validation bpb {val_bpb:.4f}")
    info = {"steps": steps, "seq_len": seq_len, "batch_size": batch_size, "lr": lr, "seed": seed,
            "seconds": round(seconds, 2), "val_bpb": val_bpb, "params": n_params,
            "forward_flops_per_byte": 2 * model.matrix_params()}
    return model, info


def train_entropy_model(train_docs: Sequence[bytes], val_docs: Sequence[bytes], out_dir: str | Path, *,
                        steps: int = 600, seq_len: int = 256, batch_size: int = 16, lr: float = 3e-3,
                        seed: int = 0, log: Callable[[str], None] = print) -> Path:
    """`fit_entropy_model`, then save to out_dir (config.json, model.safetensors, info.json); returns out_dir."""
    model, info = fit_entropy_model(train_docs, val_docs, steps=steps, seq_len=seq_len, batch_size=batch_size,
                                    lr=lr, seed=seed, log=log)
    return save_entropy_model(model, out_dir, info)


# -- the boundary strategy ---------------------------------------------------------------------------------


class EntropyBoundaries(BoundaryStrategy):
    """a_t = [H_t > theta] from a frozen entropy model (BLT's global threshold); no parameters, no loss."""

    learns_by = "prescribed"

    quick_steps: tuple[int, int] = (5, 600)
    """When prepare has to train an entropy model itself: one pass over the training bytes, clamped to
    these bounds (a few steps on test-sized data, the CLI's default on real data)."""

    def __init__(self, cfg: BoundaryConfig, dim: int):
        super().__init__()
        if not 0 < cfg.target_rate < 1:
            raise ValueError(f"target_rate must be in (0, 1), got {cfg.target_rate}")
        self.cfg = cfg
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
            steps = min(hi, max(lo, sum(len(d) + 1 for d in train_docs) // (16 * 256)))  # about one pass
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
            if rec.get("model") == fingerprint:  # calibrated earlier in this run for this very model
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
            saved.write_text(json.dumps({"theta": self.theta, "rate": self.calibrated_rate, "model": fingerprint,
                                         "entropy_model": str(source), "held_out_bytes": len(h)}, indent=2) + "\n")

    def entropies(self, ids: torch.Tensor) -> torch.Tensor:
        """H_t (B,T) of every row of ids, on ids' device (the model follows it there on first use)."""
        model = self.entropy_model
        if model.head.weight.device != ids.device:
            model.to(ids.device)
        return model.entropy(ids)

    has_step = True

    def init_step_state(self, batch, noise):
        return {"ids": torch.zeros(batch, 0, dtype=torch.long, device=noise.device)}

    def step(self, x_t, ids_t, t, state):
        """H_t from the entropy model over the whole prefix (it is causal, so this equals `propose`)."""
        state["ids"] = torch.cat([state["ids"], ids_t[:, None]], dim=1)  # (B,t+1)
        a = self.entropies(state["ids"])[:, -1] > self.theta if t > 0 else torch.ones_like(ids_t, dtype=torch.bool)
        return a, a.float()

    def propose(self, x, ids, *, noise, generator, prescribed=None):
        if self.theta is None:
            raise RuntimeError("entropy boundaries: theta is not set; call prepare() first")
        h = self.entropies(ids)  # (B,T) nats, each row on its own
        mask = h > self.theta  # (B,T) a_t = [H_t > theta]: x_{t+1} is hard, so a token ends at t
        mask[:, 0] = True
        if self.cfg.force_last:
            mask[:, -1] = True
        return BoundaryOutput(mask=mask, probs=mask.float(), stats={"boundary/entropy": float(h.mean())})


# -- command line ------------------------------------------------------------------------------------------


def main_train_entropy_model(argv: list[str]) -> int:
    """`learntok train-entropy-model --data PATH|stdlib --out DIR ...`: train and save an entropy model for
    `learntok train --boundaries entropy --entropy-model DIR`."""
    p = argparse.ArgumentParser(prog="learntok train-entropy-model",
                                description="Train the small byte LM whose next-byte entropy places the boundaries "
                                            "of --boundaries entropy (BLT entropy patching).")
    p.add_argument("--data", default="stdlib", help="training data (same spellings as learntok train --data)")
    p.add_argument("--val-data", default=None, help="validation data (default: a split of --data)")
    p.add_argument("--out", required=True, help="output directory (config.json + model.safetensors)")
    p.add_argument("--steps", type=int, default=600, help="optimizer steps")
    p.add_argument("--seq-len", type=int, default=256, help="bytes per training sequence")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed for initialisation and data order")
    args = p.parse_args(argv)
    train_docs, val_docs = load_splits(DataConfig(data=args.data, val_data=args.val_data))
    print(describe(train_docs, val_docs))
    out = train_entropy_model(train_docs, val_docs, args.out, steps=args.steps, seq_len=args.seq_len,
                              batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    print(f"saved to {out}; use it with: learntok train --boundaries entropy --entropy-model {out}")
    return 0
