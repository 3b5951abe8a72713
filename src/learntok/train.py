"""The training loop: `train(cfg) -> RunResult`, plus small helpers.

One training step (docs/architecture.md walks through it): for each micro-batch, forward (encoder, boundary
sampling, token stack, decoder, both heads), the estimator's rewards / returns / advantages and all losses,
backward; then clip, AdamW, and the byte-based learning-rate schedule. Every `log_every` steps a line goes to
metrics.jsonl with bytes seen and cumulative training FLOPs (paper accounting), so curves can be drawn
against either.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from learntok import __version__
from learntok.boundaries import BoundaryStrategy
from learntok.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from learntok.config import TrainConfig, to_dict
from learntok.data import BatchIterator, ByteSequences, describe, load_splits, val_batches_with_flags
from learntok.display import mark_boundaries
from learntok.model.lm import ByteLM
from learntok.vocab import IGNORE

LN2 = math.log(2)


@dataclass
class RunResult:
    out: Path
    steps: int
    bytes_seen: int
    val_bpb: float
    val_rate: float
    seconds: float
    bytes_per_s: float
    sample: str
    """A held-out snippet with the final model's boundaries marked."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return dev


def check_config(cfg: TrainConfig) -> None:
    """Reject inconsistent settings with one clear line before any work is done."""
    mc, dc = cfg.model, cfg.data_cfg
    problems = []
    if dc.seq_len < 2:
        problems.append(f"seq_len={dc.seq_len} is too short (need at least 2 bytes)")
    if dc.seq_len < mc.byte_window:
        problems.append(f"seq_len={dc.seq_len} is shorter than the byte window ({mc.byte_window}) this model needs")
    mb = cfg.micro_batch_size or cfg.batch_size
    if cfg.batch_size < 1 or cfg.batch_size % mb:
        problems.append(f"batch_size={cfg.batch_size} must be a positive multiple of micro_batch_size={mb}")
    if cfg.max_steps <= 0 and cfg.max_bytes <= 0:
        problems.append("give a training length: --max-steps N or --max-bytes N")
    if problems:
        raise ValueError("; ".join(problems))


def total_steps(cfg: TrainConfig) -> int:
    if cfg.max_steps > 0:
        return cfg.max_steps
    return max(1, math.ceil(cfg.max_bytes / (cfg.batch_size * cfg.data_cfg.seq_len)))


def lr_at(cfg: TrainConfig, bytes_seen: float, total_bytes: float) -> float:
    """Linear warm-up over warmup_bytes, then cosine decay to min_lr_ratio * lr at total_bytes."""
    if bytes_seen < cfg.warmup_bytes:
        return cfg.lr * (bytes_seen + 1) / cfg.warmup_bytes
    frac = min(1.0, (bytes_seen - cfg.warmup_bytes) / max(1.0, total_bytes - cfg.warmup_bytes))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not norms, biases or the byte embedding)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("embed") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=True)


def run_info() -> dict:
    """Code version, library versions and hardware, recorded in config.json."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    import numpy
    return {"learntok": __version__, "git_sha": sha, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


@torch.no_grad()
def evaluate(model: ByteLM, batches: list[tuple[torch.Tensor, torch.Tensor | None]], device: torch.device,
             seed: int = 1234) -> dict:
    """Validation bits per byte (byte targets only), boundary rate and early-exit BPB.
    Boundaries: the policy without soft-cap, sampled with a fixed seed (method.md §8.12)."""
    was_training = model.training
    model.eval()
    gen = torch.Generator(device).manual_seed(seed)
    nll = nll_early = n_bytes = n_bound = n_pos = 0.0
    for batch, flags in batches:
        batch = batch.to(device)
        ids, targets = batch[:, :-1], batch[:, 1:]
        out = model(ids, targets, generator=gen, prescribed=None if flags is None else flags[:, :-1].to(device))
        byte = targets < 256  # BPB counts real bytes, not EOS separators
        nll += float(out.nll[byte].sum())
        nll_early += float(out.terms["loss/early"]) * float((targets != IGNORE).sum())
        n_bytes += float(byte.sum())
        n_bound += float(out.boundaries.mask.sum())
        n_pos += out.boundaries.mask.numel()
    model.train(was_training)
    return {"val/bpb": nll / (LN2 * max(n_bytes, 1)), "val/rate": n_bound / max(n_pos, 1),
            "val/early_bpb": nll_early / (LN2 * max(n_pos, 1))}


@torch.no_grad()
def boundary_sample(model: ByteLM, seq: tuple[torch.Tensor, torch.Tensor | None], device: torch.device,
                    n_bytes: int = 240, color: bool | None = None, seed: int = 1234) -> str:
    """A held-out snippet (ids, flags) with the model's evaluation boundaries marked."""
    was_training = model.training
    model.eval()
    seq, flags = seq
    ids = seq[:-1].unsqueeze(0).to(device)
    prescribed = None if flags is None else flags[:-1].unsqueeze(0).to(device)
    out = model(ids, generator=torch.Generator(device).manual_seed(seed), prescribed=prescribed)
    model.train(was_training)
    data = bytes(int(b) for b in seq[1:n_bytes + 1] if b < 256)
    mask = out.boundaries.mask[0, 1:n_bytes + 1].cpu()  # a_t for byte x_t (position 0 is BOS)
    return mark_boundaries(data, mask, color=color)


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def train(cfg: TrainConfig, resume: bool = False, log=print) -> RunResult:
    """Train `cfg` (resuming from cfg.out's latest checkpoint if `resume`) and return the final numbers."""
    check_config(cfg)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    out_dir = Path(cfg.out)
    torch.manual_seed(cfg.seed)

    dc = cfg.data_cfg
    train_docs, val_docs = load_splits(dc)
    log(describe(train_docs, val_docs))
    model = ByteLM(cfg.model, cfg.boundary).to(device)
    strategy = model.boundary
    strategy.prepare(train_docs, val_docs, out_dir)
    annotate = strategy.annotate if type(strategy).annotate is not BoundaryStrategy.annotate else None
    train_seqs = ByteSequences(train_docs, dc.seq_len, dc.pack, name="training data", annotate=annotate)
    val_seqs = ByteSequences(val_docs, dc.seq_len, dc.pack, name="validation data", annotate=annotate)
    del train_docs, val_docs
    micro = cfg.micro_batch_size or cfg.batch_size
    val = val_batches_with_flags(val_seqs, micro, dc.val_bytes)
    batches = BatchIterator(train_seqs, cfg.batch_size, cfg.seed)
    opt = make_optimizer(model, cfg)
    gen = torch.Generator(device).manual_seed(cfg.seed + 1)  # boundary noise in training
    step, bytes_seen, tokens_seen, flops, elapsed = 0, 0, 0, 0.0, 0.0
    ckpt = latest_checkpoint(out_dir) if resume else None
    if resume and ckpt is None:
        raise ValueError(f"--resume {out_dir}: no complete checkpoint found there")
    if ckpt is not None:
        state = load_checkpoint(ckpt, model)
        opt.load_state_dict(state["optimizer"])
        batches.load_state_dict(state["data"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step, bytes_seen, tokens_seen = state["step"], state["bytes_seen"], state["tokens_seen"]
        flops, elapsed = state["flops"], state["elapsed"]
        log(f"resumed from {ckpt} at step {step}")
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", {**to_dict(cfg), "run_info": run_info()})
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters, matrix params (byte, token) = {model.matrix_params()}, "
        f"boundaries={cfg.boundary.boundaries}, device={device}")
    fwd = torch.compile(model) if cfg.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)

    steps = total_steps(cfg)
    bytes_per_step = cfg.batch_size * dc.seq_len
    total_bytes = steps * bytes_per_step
    metrics = open(out_dir / "metrics.jsonl", "a")

    def save() -> None:
        state = {"optimizer": opt.state_dict(), "data": batches.state_dict(), "generator": gen.get_state(),
                 "torch_rng": torch.get_rng_state(), "step": step, "bytes_seen": bytes_seen,
                 "tokens_seen": tokens_seen, "flops": flops, "elapsed": elapsed}
        save_checkpoint(out_dir, step, model, state)

    def emit(rec: dict) -> None:
        metrics.write(json.dumps(rec) + "\n")
        metrics.flush()

    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=step, unit="step", dynamic_ncols=True, file=sys.stderr)
    acc: dict[str, float] = defaultdict(float)
    n_acc, t_log, b_log = 0, time.perf_counter(), bytes_seen
    t_start = time.perf_counter() - elapsed
    accum = cfg.batch_size // micro
    model.train()
    try:
        while step < steps:
            if cfg.time_budget and time.perf_counter() - t_start >= cfg.time_budget:
                log(f"time budget of {cfg.time_budget:.0f} s reached at step {step}")
                break
            lr = lr_at(cfg, bytes_seen, total_bytes)
            for g in opt.param_groups:
                g["lr"] = lr
            batch, flags = batches.next_with_flags()  # (batch_size, seq_len + 1) ids, flags or None
            batch = batch.to(device)
            step_tokens = 0
            for i in range(accum):
                mb = batch[i * micro:(i + 1) * micro]
                fl = None if flags is None else flags[i * micro:(i + 1) * micro, :-1].to(device)
                with autocast:
                    out = fwd(mb[:, :-1], mb[:, 1:], generator=gen, prescribed=fl)
                (out.loss / accum).backward()
                step_tokens += int(out.n_tokens.sum())
                for k, v in out.terms.items():
                    acc[k] += float(v.detach()) / accum
                acc["boundary/rate"] += float(out.boundaries.mask.float().mean()) / accum
                acc["boundary/max_tokens"] = max(acc["boundary/max_tokens"], float(out.n_tokens.max()))
                for k, v in out.boundaries.stats.items():
                    acc[k] += v / accum
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else 1e30)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            bytes_seen += bytes_per_step
            tokens_seen += step_tokens
            flops += model.train_flops(bytes_per_step, step_tokens)
            acc["train/grad_norm"] += float(gnorm)
            n_acc += 1
            if step % cfg.log_every == 0 or step == steps:
                now = time.perf_counter()
                rec = {k: v / n_acc if k != "boundary/max_tokens" else v for k, v in acc.items()}
                rec["train/bpb"] = rec["loss/auto"] / LN2
                rec.update(step=step, bytes=bytes_seen, flops=flops, lr=lr, time=now - t_start,
                           bytes_per_s=(bytes_seen - b_log) / max(now - t_log, 1e-9))
                emit(rec)
                if bar is not None:
                    bar.set_postfix_str(f"{rec['bytes_per_s'] / 1e3:.1f}kB/s loss={rec['loss/auto']:.3f} "
                                        f"bpb={rec['train/bpb']:.3f} rate={rec['boundary/rate']:.3f}")
                acc.clear()
                n_acc, t_log, b_log = 0, now, bytes_seen
            if bar is not None:
                bar.update(1)
            t_pause = time.perf_counter()  # evaluation and checkpoints do not count as training time
            if cfg.eval_every and step % cfg.eval_every == 0 and step < steps:
                ev = evaluate(model, val, device)
                emit({"step": step, "bytes": bytes_seen, "flops": flops, "time": t_pause - t_start, **ev})
                preview = boundary_sample(model, val_seqs_first(val), device, n_bytes=100).replace("\n", " ")
                (bar.write if bar is not None else log)(
                    f"step {step}: val bpb {ev['val/bpb']:.4f}, rate {ev['val/rate']:.3f}  {preview}")
            if cfg.ckpt_every and step % cfg.ckpt_every == 0:
                elapsed = t_pause - t_start
                save()
            paused = time.perf_counter() - t_pause
            t_start += paused
            t_log += paused
    except KeyboardInterrupt:
        log(f"interrupted at step {step}; saving a checkpoint (resume with: learntok train --resume {out_dir})")
        elapsed = time.perf_counter() - t_start
        save()
        raise
    finally:
        if bar is not None:
            bar.close()
        metrics.close()
    elapsed = time.perf_counter() - t_start
    save()
    ev = evaluate(model, val, device)
    with open(out_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "bytes": bytes_seen, "flops": flops, **ev}) + "\n")
    sample = boundary_sample(model, val_seqs_first(val), device, n_bytes=400)
    return RunResult(out=out_dir, steps=step, bytes_seen=bytes_seen, val_bpb=ev["val/bpb"], val_rate=ev["val/rate"],
                     seconds=elapsed, bytes_per_s=bytes_seen / max(elapsed, 1e-9), sample=sample)


def val_seqs_first(val: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fixed held-out snippet shown during training: the first validation sequence (ids, flags)."""
    ids, flags = val[0]
    return ids[0], None if flags is None else flags[0]
