"""The small causal byte LM of BLT-style entropy patching (`--boundaries entropy`), and its trainer.

Its next-byte entropy H_t = - sum_v p_e(v | x_<=t) log p_e(v | x_<=t) (nats) places the entropy strategy's
boundaries (learntok.boundaries.entropy). It is trained separately (`learntok train-entropy-model`, or quickly by
the strategy itself when none is given) and frozen: its weights never enter the U-Net's checkpoint, optimizer
or FLOPs count; its forward pass costs 2 x its matrix params per byte on top (reported as
`forward_flops_per_byte`).
"""

from __future__ import annotations

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

from learntok.bpb import LN2, BitsPerByte
from learntok.data import BatchIterator, ByteSequences, val_batches
from learntok.nn.layers import Block, RMSNorm, rope_tables
from learntok.vocab import VOCAB_SIZE

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
    """Transformer blocks (Gemma-2 blocks of learntok.nn.layers)."""
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
    """Bits per byte of `model` on the first max_bytes of `docs` (learntok.bpb: byte targets only)."""
    acc = BitsPerByte()
    for batch in val_batches(_sequences(docs, seq_len, "entropy-model validation data"), batch_size, max_bytes):
        ids, targets = batch[:, :-1], batch[:, 1:]  # (B,T), (B,T)
        nll = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(), reduction="none")  # (B*T,)
        acc.add(nll.view_as(targets), targets)
    return acc.bpb


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
