"""The training loop: `train(cfg) -> RunResult`, plus small helpers.

One training step (docs/architecture.md walks through it): for each micro-batch, forward (encoder, boundary
sampling, token stack, decoder, both heads), the estimator's rewards / returns / advantages and all losses,
backward; then clip, AdamW, and the byte-based learning-rate schedule. Every `log_every` steps a line goes to
metrics.jsonl with bytes seen and cumulative training FLOPs (paper accounting), so curves can be drawn
against either.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist

from learntok import __version__
from learntok.boundaries import BoundaryStrategy
from learntok.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from learntok.config import TrainConfig, to_dict
from learntok.data import BatchIterator, ByteSequences, describe, load_splits, val_batches_with_flags
from learntok.distributed import (
    AllReduceStats,
    Dist,
    RecordStats,
    all_reduce_max,
    all_reduce_sum,
    boundary_noise,
    init_distributed,
)
from learntok.model.lm import ByteLM
from learntok.viz.boundary_map import preview_sample, sequence_map
from learntok.viz.render import render_ansi
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
    if cfg.schedule == "time" and cfg.time_budget <= 0:
        problems.append("--schedule time needs --time-budget SECONDS")
    if cfg.max_steps <= 0 and cfg.max_bytes <= 0 and cfg.schedule != "time":
        problems.append("give a training length: --max-steps N or --max-bytes N")
    if problems:
        raise ValueError("; ".join(problems))


UNBOUNDED_STEPS = 10**12
"""Step count of a time-scheduled run without --max-steps / --max-bytes: its budget ends it first."""


def total_steps(cfg: TrainConfig) -> int:
    """Optimizer steps the run is set up for (a time-scheduled run without a length: until its budget ends)."""
    if cfg.max_steps > 0:
        return cfg.max_steps
    if cfg.max_bytes <= 0 and cfg.schedule == "time":
        return UNBOUNDED_STEPS
    return max(1, math.ceil(cfg.max_bytes / (cfg.batch_size * cfg.data_cfg.seq_len)))


def lr_at(cfg: TrainConfig, bytes_seen: float, total_bytes: float, elapsed: float = 0.0) -> float:
    """Linear warm-up over warmup_bytes, then cosine decay to min_lr_ratio * lr at total_bytes (or, with
    schedule = "time", at elapsed = time_budget seconds)."""
    if bytes_seen < cfg.warmup_bytes:
        return cfg.lr * (bytes_seen + 1) / cfg.warmup_bytes
    if cfg.schedule == "time":
        frac = min(1.0, elapsed / cfg.time_budget)
    else:
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


def boundary_sample(model: ByteLM, seq: tuple[torch.Tensor, torch.Tensor | None], n_bytes: int = 240,
                    color: bool | None = None, seed: int = 1234) -> str:
    """A held-out row (ids, flags) with the model's evaluation boundaries marked (ANSI or `|` markers)."""
    ids, flags = seq
    return render_ansi(sequence_map(model, ids, flags, seed=seed, n_bytes=n_bytes), color=color)


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def wrap_model(model: ByteLM, cfg: TrainConfig, d: Dist) -> torch.nn.Module:
    """DistributedDataParallel (default) or FSDP2 under torchrun; the bare model in a single process."""
    if not d.active:
        return model
    if cfg.parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if d.device.type == "cuda" else MixedPrecisionPolicy()
        for blk in [*model.down, *model.mid, *model.up]:
            fully_shard(blk, mp_policy=mp)
        return fully_shard(model, mp_policy=mp)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def _full_state(model: torch.nn.Module, opt: torch.optim.Optimizer, cfg: TrainConfig, d: Dist) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state dicts; collective under FSDP2, so every rank calls it."""
    if cfg.parallel == "fsdp" and d.active:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    return model.state_dict(), opt.state_dict()


def _load_optimizer_state(model, opt, optim: dict, cfg: TrainConfig, d: Dist) -> None:
    if cfg.parallel == "fsdp" and d.active:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, opt, optim_state_dict=optim, options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(optim)


def train(cfg: TrainConfig, resume: bool = False, log=print) -> RunResult:
    """Train `cfg` (resuming from cfg.out's latest checkpoint if `resume`) and return the final numbers.
    Under torchrun every rank runs this same function; rank 0 alone logs, evaluates and writes files."""
    check_config(cfg)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    d = init_distributed(cfg.device)
    device = d.device
    if cfg.batch_size % d.world:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the {d.world} processes")
    per_rank = cfg.batch_size // d.world
    micro = cfg.micro_batch_size or per_rank
    if per_rank % micro:
        raise ValueError(f"per-process batch {per_rank} is not a multiple of micro_batch_size={micro}")
    accum = per_rank // micro
    log = log if d.is_main else (lambda *_a, **_k: None)
    out_dir = Path(cfg.out)
    torch.manual_seed(cfg.seed)

    dc = cfg.data_cfg
    train_docs, val_docs = load_splits(dc)
    log(describe(train_docs, val_docs))
    model = ByteLM(cfg.model, cfg.boundary).to(device)
    strategy = model.boundary
    if d.is_main:  # e.g. trains a BPE tokenizer and saves it in out_dir; the other ranks then load it
        strategy.prepare(train_docs, val_docs, out_dir)
    if d.active:
        tdist.barrier()
        if not d.is_main:
            strategy.prepare(train_docs, val_docs, out_dir)
    annotate = strategy.annotate if type(strategy).annotate is not BoundaryStrategy.annotate else None
    train_seqs = ByteSequences(train_docs, dc.seq_len, dc.pack, name="training data", annotate=annotate)
    val_seqs = ByteSequences(val_docs, dc.seq_len, dc.pack, name="validation data", annotate=annotate)
    del train_docs, val_docs
    val = val_batches_with_flags(val_seqs, micro, dc.val_bytes)
    batches = BatchIterator(train_seqs, per_rank, cfg.seed, rank=d.rank, world_size=d.world)
    step, bytes_seen, tokens_seen, flops, elapsed = 0, 0, 0, 0.0, 0.0
    if not resume and (out_dir / "metrics.jsonl").exists():
        if not cfg.overwrite:
            raise ValueError(f"{out_dir} already holds a run; continue it with --resume {out_dir}, replace it with "
                             "--overwrite, or choose another --out")
        if d.is_main:
            for p in [*out_dir.glob("step_*"), out_dir / "latest", out_dir / "metrics.jsonl"]:
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        if d.active:
            tdist.barrier()
    ckpt = latest_checkpoint(out_dir) if resume else None
    if resume and ckpt is None:
        raise ValueError(f"--resume {out_dir}: no complete checkpoint found there")
    state = None
    if ckpt is not None:
        state = load_checkpoint(ckpt, model)  # full weights on every rank, before any sharding
        batches.load_state_dict(state["data"])
        torch.set_rng_state(state["torch_rng"])
        step, bytes_seen, tokens_seen = state["step"], state["bytes_seen"], state["tokens_seen"]
        flops, elapsed = state["flops"], state["elapsed"]
        log(f"resumed from {ckpt} at step {step}")
    wrapped = wrap_model(model, cfg, d)
    opt = make_optimizer(model, cfg)
    if state is not None:
        _load_optimizer_state(wrapped, opt, state["optimizer"], cfg, d)
    if d.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_json(out_dir / "config.json", {**to_dict(cfg), "run_info": {**run_info(), "world_size": d.world}})
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f}M parameters, matrix params (byte, token) = {model.matrix_params()}, "
        f"boundaries={cfg.boundary.boundaries}, device={device}, processes={d.world}, accumulation={accum}")
    fwd = torch.compile(wrapped) if cfg.compile else wrapped
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)
    # The estimator's batch statistics must be the global batch's (see learntok.distributed).
    needs_stats = strategy.uses_rewards and (d.active or accum > 1)
    evaluate_here = d.is_main or cfg.parallel == "fsdp"  # FSDP's forward is collective

    steps = total_steps(cfg)
    bytes_per_step = cfg.batch_size * dc.seq_len
    total_bytes = steps * bytes_per_step
    metrics = open(out_dir / "metrics.jsonl", "a") if d.is_main else None

    def save() -> None:
        tensors, optim = _full_state(wrapped if cfg.parallel == "fsdp" else model, opt, cfg, d)
        if d.is_main:
            st = {"optimizer": optim, "data": batches.state_dict(), "torch_rng": torch.get_rng_state(),
                  "step": step, "bytes_seen": bytes_seen, "tokens_seen": tokens_seen, "flops": flops,
                  "elapsed": elapsed, "world_size": d.world}
            save_checkpoint(out_dir, step, tensors, st)
        if d.active:
            tdist.barrier()

    tb = None
    if cfg.tensorboard and d.is_main:
        from learntok.viz.tb import TensorBoardLogger

        tb = TensorBoardLogger(out_dir)

    def emit(rec: dict) -> None:
        if metrics is not None:
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
        if tb is not None and "loss/auto" in rec:
            tb.scalars(rec["step"], rec)

    bar = None
    if cfg.progress and d.is_main:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps if steps < UNBOUNDED_STEPS else None, initial=step, unit="step", dynamic_ncols=True,
                   file=sys.stderr)
    acc: dict[str, float] = defaultdict(float)
    n_acc, t_log, b_log = 0, time.perf_counter(), bytes_seen
    t_start = time.perf_counter() - elapsed
    model.train()
    try:
        while step < steps:
            # Every rank uses the slowest rank's clock: all stop at the same step and, with --schedule time,
            # all apply the same learning rate (DDP/FSDP replicas must take identical steps).
            now = float(all_reduce_max(torch.tensor(time.perf_counter() - t_start), d)) if cfg.time_budget else 0.0
            if cfg.time_budget and now >= cfg.time_budget:
                log(f"time budget of {cfg.time_budget:.0f} s reached at step {step}")
                break
            lr = lr_at(cfg, bytes_seen, total_bytes, now)
            for g in opt.param_groups:
                g["lr"] = lr
            batch, flags = batches.next_with_flags()  # (per_rank, seq_len + 1) ids, flags or None
            batch = batch.to(device)
            rows = d.rank * per_rank + np.arange(per_rank)  # global row indices of this rank's sequences
            noise = boundary_noise(cfg.seed, step, rows, dc.seq_len, device)  # (per_rank, T)

            mbs = _micro_batches(batch, flags, noise, micro, device)  # [(ids, targets, noise, prescribed)]
            reducer = None
            if needs_stats and accum == 1:
                reducer = AllReduceStats(d)
            elif needs_stats:  # pre-pass: global statistics over all micro-batches of all ranks
                rec = RecordStats()
                with torch.no_grad(), autocast:
                    for ids, tg, nz, fl in mbs:
                        model(ids, tg, noise=nz, prescribed=fl, batch_stats=rec)
                reducer = rec.global_stats(d)
            step_tokens = 0
            for i, (ids, tg, nz, fl) in enumerate(mbs):
                sync = contextlib.nullcontext()
                if d.active and cfg.parallel == "ddp" and i < accum - 1:
                    sync = wrapped.no_sync()  # gradients are all-reduced once, after the last micro-step
                with sync:  # one context for forward and backward (a no_sync context is entered once)
                    with autocast:
                        out = fwd(ids, tg, noise=nz, prescribed=fl, batch_stats=reducer)
                    (out.loss / accum).backward()
                step_tokens += int(out.n_tokens.sum())
                for k, v in out.terms.items():
                    acc[k] += float(v.detach()) / accum
                acc["boundary/rate"] += float(out.boundaries.mask.float().mean()) / accum
                acc["boundary/max_tokens"] = max(acc["boundary/max_tokens"], float(out.n_tokens.max()))
                for k, v in out.boundaries.stats.items():
                    acc[k] += float(v) / accum
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else 1e30)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_tokens = int(all_reduce_sum(torch.tensor(step_tokens, dtype=torch.float64), d))
            step += 1
            bytes_seen += bytes_per_step
            tokens_seen += step_tokens
            flops += model.train_flops(bytes_per_step, step_tokens)
            acc["train/grad_norm"] += float(gnorm)
            n_acc += 1
            if step % cfg.log_every == 0 or step == steps:
                now = time.perf_counter()
                rec_ = _reduce_logs({k: v / n_acc if k != "boundary/max_tokens" else v for k, v in acc.items()}, d)
                rec_["train/bpb"] = rec_["loss/auto"] / LN2
                rec_.update(step=step, bytes=bytes_seen, flops=flops, flops_per_byte=flops / bytes_seen, lr=lr,
                            time=now - t_start, bytes_per_s=(bytes_seen - b_log) / max(now - t_log, 1e-9))
                emit(rec_)
                if bar is not None:
                    bar.set_postfix_str(f"{rec_['bytes_per_s'] / 1e3:.1f}kB/s loss={rec_['loss/auto']:.3f} "
                                        f"bpb={rec_['train/bpb']:.3f} rate={rec_['boundary/rate']:.3f}")
                acc.clear()
                n_acc, t_log, b_log = 0, now, bytes_seen
            if bar is not None:
                bar.update(1)
            t_pause = time.perf_counter()  # evaluation and checkpoints do not count as training time
            if cfg.eval_every and step % cfg.eval_every == 0 and step < steps:
                if evaluate_here:
                    ev = evaluate(model, val, device)
                    emit({"step": step, "bytes": bytes_seen, "flops": flops, "time": t_pause - t_start, **ev})
                    seq, fl = val_seqs_first(val)
                    if d.is_main:
                        preview = preview_sample(model, seq, fl, width=80, color=sys.stderr.isatty())
                        (bar.write if bar is not None else log)(
                            f"step {step}: val bpb {ev['val/bpb']:.4f}, rate {ev['val/rate']:.3f}  {preview}")
                        if tb is not None:
                            tb.scalars(step, ev)
                            m = sequence_map(model, seq, fl, n_bytes=400)
                            tb.boundary_image(step, m.ids, m.probs, m.mask)
                if d.active:
                    tdist.barrier()
            if cfg.ckpt_every and step % cfg.ckpt_every == 0:
                elapsed = t_pause - t_start
                save()
            paused = time.perf_counter() - t_pause
            t_start += paused
            t_log += paused
    except KeyboardInterrupt:
        log(f"interrupted at step {step}; saving a checkpoint (resume with: learntok train --resume {out_dir})")
        elapsed = time.perf_counter() - t_start
        if d.is_main and (not d.active or cfg.parallel != "fsdp"):  # no collectives: other ranks may be gone
            save_checkpoint(out_dir, step, model.state_dict(), {
                "optimizer": opt.state_dict(), "data": batches.state_dict(), "torch_rng": torch.get_rng_state(),
                "step": step, "bytes_seen": bytes_seen, "tokens_seen": tokens_seen, "flops": flops,
                "elapsed": elapsed, "world_size": d.world})
        raise
    finally:
        if bar is not None:
            bar.close()
        if metrics is not None:
            metrics.close()
        if tb is not None:
            tb.close()
    elapsed = time.perf_counter() - t_start
    save()
    ev, sample = {"val/bpb": float("nan"), "val/rate": float("nan")}, ""
    if evaluate_here:
        ev = evaluate(model, val, device)
        sample = boundary_sample(model, val_seqs_first(val), n_bytes=400)
    if d.is_main:
        with open(out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "bytes": bytes_seen, "flops": flops, "time": elapsed, **ev}) + "\n")
    if d.active:
        tdist.barrier()
    return RunResult(out=out_dir, steps=step, bytes_seen=bytes_seen, val_bpb=ev["val/bpb"], val_rate=ev["val/rate"],
                     seconds=elapsed, bytes_per_s=bytes_seen / max(elapsed, 1e-9), sample=sample)


def _micro_batches(batch: torch.Tensor, flags: torch.Tensor | None, noise: torch.Tensor, micro: int,
                   device: torch.device) -> list[tuple]:
    """Split a (B, T+1) batch into micro-batches of (ids, targets, noise, prescribed flags or None)."""
    out = []
    for i in range(0, batch.shape[0], micro):
        sl = slice(i, i + micro)
        fl = None if flags is None else flags[sl, :-1].to(device)
        out.append((batch[sl, :-1], batch[sl, 1:], noise[sl], fl))
    return out


def _reduce_logs(rec: dict[str, float], d: Dist) -> dict[str, float]:
    """Average logged scalars over ranks (max for the max-token count)."""
    if not d.active:
        return rec
    keys = sorted(k for k in rec if k != "boundary/max_tokens")
    vals = all_reduce_sum(torch.tensor([rec[k] for k in keys], dtype=torch.float64), d) / d.world
    out = dict(zip(keys, vals.tolist()))
    if "boundary/max_tokens" in rec:
        out["boundary/max_tokens"] = float(all_reduce_max(torch.tensor(rec["boundary/max_tokens"]), d))
    return out


def val_seqs_first(val: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fixed held-out snippet shown during training: the first validation sequence (ids, flags)."""
    ids, flags = val[0]
    return ids[0], None if flags is None else flags[0]
