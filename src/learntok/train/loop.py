"""The training loop: `train(cfg) -> RunResult`.

One step (docs/architecture.md walks through it): the global batch's rows for this process, their boundary
noise, and for each micro-batch the forward pass (encoder, boundaries, token stack, decoder, both heads), the
estimator's rewards / returns / advantages and all losses, and backward; then clipping, AdamW and the learning
rate for the next step. Every `log_every` steps a line goes to metrics.jsonl with bytes seen and cumulative
training FLOPs (paper accounting), so curves can be drawn against either. Under torchrun every rank runs this
same function; rank 0 alone logs and writes files.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as tdist

from learntok.boundaries.base import BatchSums, repeat_samples
from learntok.boundaries.rates import Rates
from learntok.config import TrainConfig, to_dict
from learntok.data import BatchIterator, ByteSequences, describe, load_splits, val_batches_with_flags
from learntok.data.stream import StreamBatches, open_stream
from learntok.device import autocast, configure_matmul, out_of_memory, resolve_precision, to_device
from learntok.errors import TrainingError
from learntok.model import build_model
from learntok.model.flops import KEYS
from learntok.model.lm import ByteLM
from learntok.nn.attention import FLEX_CPU_TRAINING
from learntok.train.logs import Sinks, StepMetrics
from learntok.train.parallel import (
    Dist,
    GlobalStats,
    all_reduce_max,
    all_reduce_sum,
    boundary_noise,
    init_distributed,
    load_optimizer_state,
    wrap_model,
)
from learntok.train.preempt import StopRequest
from learntok.train.schedule import (
    UNBOUNDED_STEPS,
    Stopwatch,
    busy_cpu_note,
    check_config,
    clip_gradients,
    group_lr,
    lr_at,
    make_optimizer,
    progress,
    total_steps,
)
from learntok.train.state import TrainState, open_run_dir, restore_state, save_state, write_config
from learntok.train.validation import EvalHook, first_row, validate

STREAM_PREPARE_BYTES = 16_000_000
"""With --stream, a strategy prepares itself (e.g. trains its BPE tokenizer) on the stream's first bytes."""


class MicroBatch(NamedTuple):
    ids: torch.Tensor
    """(b, T) input ids, BOS first."""
    targets: torch.Tensor
    """(b, T) the next ids."""
    noise: torch.Tensor
    """(b, T) boundary uniforms."""
    prescribed: torch.Tensor | None
    """(b, T) prescribed boundary flags, for strategies that annotate their data."""
    rates: Rates | None
    """The rows' target rates and strata (a variable-rate strategy, --rate-range), else None."""

    @property
    def extra(self) -> dict:
        """Keyword arguments only some models take (the rates: a U-Net with a variable-rate policy)."""
        return {} if self.rates is None else {"rates": self.rates}


@dataclass
class Run:
    """What every training step of one run shares: built once by `train`, read by `train_step`."""

    cfg: TrainConfig
    d: Dist
    model: ByteLM
    wrapped: torch.nn.Module
    """`model` under DDP / FSDP2, or `model` itself in a single process."""
    opt: torch.optim.Optimizer
    batches: BatchIterator | StreamBatches
    """This process's training batches."""
    micro: int
    """Rows per micro-batch (forward pass) on this process."""
    accum: int
    """Micro-batches per step."""
    precision: str
    """The resolved --precision (the forward pass's autocast)."""
    window: StepMetrics
    stats: GlobalStats


@dataclass
class RunResult:
    out: Path
    steps: int
    bytes_seen: int
    val_bpb: float
    val_rate: float
    seconds: float
    """Training time (evaluation and checkpoints excluded)."""
    bytes_per_s: float
    sample: str
    """A held-out snippet with the final model's boundaries marked, from the `on_eval` hook ("" without one)."""
    stopped: str = ""
    """The signal that stopped the run early with a checkpoint (e.g. "SIGTERM"; then no final evaluation), or ""."""


def train(cfg: TrainConfig, *, log=print, on_eval: EvalHook | None = None,
          on_log: Callable[[dict], bool | None] | None = None) -> RunResult:
    """Train `cfg` (continuing the run in cfg.resume if set) and return the final numbers. `on_eval` shows a
    held-out sample at each evaluation and at the end (the command line passes `learntok.viz.preview_hook`).
    `on_log` gets every line metrics.jsonl gets (training windows and evaluations, as dicts; on every process);
    returning True stops the run after that step with a checkpoint, like SIGTERM (`RunResult.stopped` is
    "on_log"): early stopping, custom logging.

    SIGTERM / SIGUSR1 stop the run after the current step with a checkpoint (`RunResult.stopped` names the
    signal; no final evaluation); one that arrives during the final checkpoint or evaluation lets them finish.
    Ctrl-C saves one and re-raises. A step with a non-finite loss or gradient norm
    is skipped; `max_bad_steps` of them in a row save a checkpoint and raise TrainingError."""
    check_config(cfg)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    d = init_distributed(cfg.device)
    per_rank, micro, accum = batch_split(cfg, d)
    log = log if d.is_main else (lambda *_a, **_k: None)
    if d.device.type == "cpu" and cfg.threads <= 0 and (note := busy_cpu_note(torch.get_num_threads())):
        log(note)
    out = Path(cfg.resume or cfg.out)
    torch.manual_seed(cfg.seed)
    precision = resolve_precision(cfg.precision, d.device)
    configure_matmul(precision, d.device)
    model = build_model(cfg.model, cfg.boundary).to(d.device)
    if precision == "bf16":
        model.to(torch.bfloat16)
    model.activation_checkpointing = cfg.activation_checkpointing
    k = model.boundary.samples_per_sequence  # rows per sequence; a group must not straddle micro-batches
    if micro % k:
        raise ValueError(f"--policy-samples {k} does not divide the {micro} rows of a micro-batch per process "
                         "(each sequence's samples must sit in one micro-batch)")
    # before the data: --overwrite must clear the old strategy's files before the strategy loads them
    ckpt = open_run_dir(out, bool(cfg.resume), cfg.overwrite, d, log, artifacts=model.boundary.artifacts())
    batches, val_seqs = load_data(cfg, model, out, d, per_rank // k, log)
    val = val_batches_with_flags(val_seqs, micro, cfg.data.val_bytes)
    state, optim_state, saved = restore_state(ckpt, model, batches, d) if ckpt else (TrainState(), None, {})
    used_up = False  # a budget spent: only the final evaluation is left, if it is
    if ckpt is not None:
        used_up = bool(cfg.time_budget and state.elapsed >= cfg.time_budget
                       or cfg.flops_budget and spent(state, cfg) >= cfg.flops_budget)
        if used_up and _evaluated_at(out, state.step):  # else: no step, and a repeated final evaluation
            budget, flag = (f"time budget of {cfg.time_budget:g} s", "--time-budget (time_budget=)") \
                if cfg.time_budget else (f"FLOPs budget of {cfg.flops_budget:.3g} ({cfg.flops_convention})",
                                         "--flops-budget (flops_budget=)")
            raise ValueError(f"--resume {out}: the run's {budget} was used up at step {state.step}; give a larger "
                             f"{flag} to continue it")
        log(f"resumed from {ckpt} at step {state.step}" + (" (its budget is spent: the final evaluation)"
                                                           if used_up else ""))
    sharded = cfg.parallel == "fsdp" and d.active
    if d.active:  # every rank buckets the token level alike (--token-bucket / --compile)
        model.token_count_reduce = lambda count: all_reduce_max(count, d)
    if cfg.compile and sharded:
        model.compile_blocks()  # FSDP2's hooks stay outside the graphs: compile block by block, before sharding
    wrapped = wrap_model(model, cfg.parallel, d, precision)
    # hashed embedding tables with sparse gradients and a lazy Adam in one eager process (DDP / FSDP and compiled
    # graphs keep dense gradients)
    opt = make_optimizer(model, cfg.optim, fused=d.device.type == "cuda" and not sharded,
                         sparse=not d.active and not cfg.compile)
    if optim_state is not None:
        load_optimizer_state(wrapped, opt, optim_state, sharded)
    if d.is_main:
        write_config(out, cfg, d.world, state.step, log)
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, matrix params (byte, token) "
        f"= {model.matrix_params()}, boundaries={cfg.boundary.boundaries}, device={d.device}, processes={d.world}, "
        f"accumulation={accum}")
    if cfg.compile and not sharded:
        model.compile_stages()  # the wrapper's forward calls them: DDP's hooks stay outside the graphs
    evaluates = d.is_main or sharded  # FSDP's forward is collective: every rank evaluates
    steps = state.step if used_up else total_steps(cfg)
    bytes_per_step = cfg.batch_size * cfg.data.seq_len
    wandb = dict(config=to_dict(cfg), project=cfg.wandb_project, entity=cfg.wandb_entity) if cfg.wandb else None
    hooked = [False]  # on_log asked to stop

    def tell(record: dict) -> None:
        if on_log(record):
            hooked[0] = True

    sinks = Sinks(out, d, progress=cfg.progress, tensorboard=cfg.tensorboard, style=cfg.progress_style, wandb=wandb,
                  total=steps if steps < UNBOUNDED_STEPS else None, initial=state.step, log=log,
                  listener=tell if on_log is not None else None)
    clock = Stopwatch(state.elapsed)
    window = StepMetrics((state.elapsed, state.bytes_seen))
    if saved.get("window") is not None:
        window.load_state_dict(saved["window"])
    stats = GlobalStats(d, accum, cfg.batch_stats)
    stats.load_state_dict(saved.get("batch_stats"), d.device)
    run = Run(cfg=cfg, d=d, model=model, wrapped=wrapped, opt=opt, batches=batches, micro=micro, accum=accum,
              precision=precision, window=window, stats=stats)
    saved_at, bad_run = (state.step if ckpt is not None else -1), 0

    def save(barrier: bool = True) -> None:
        nonlocal saved_at
        if saved_at == state.step:  # e.g. the final save right after a periodic one
            return
        agreed = barrier or not d.active  # agreeing on the window is collective: not after Ctrl-C under torchrun
        save_state(out, model, wrapped, opt, batches, state, d, sharded=sharded, barrier=barrier,
                   window=window.state_dict(d) if agreed else None, batch_stats=stats.state_dict())
        saved_at = state.step

    def evaluate(final: bool) -> dict:
        with autocast(precision, d.device):
            ev = validate(model, val, d.device) if evaluates else {"val/bpb": float("nan"), "val/rate": float("nan")}
        sinks.write({"step": state.step, "bytes": state.bytes_seen, **flops_fields(state), "time": state.elapsed,
                     **ev})
        if on_eval is not None and evaluates:
            view = on_eval(model, first_row(val), None if final else state.step, sinks.wants_images)
            ev["sample"] = view.text
            if d.is_main:
                if not final:
                    sinks.note(f"step {state.step}: val bpb {ev['val/bpb']:.4f}, rate {ev['val/rate']:.3f}  "
                               f"{view.text}")
                sinks.image(state.step, view.image)  # the final evaluation's map too
        if d.active:
            tdist.barrier()
        last_eval[:] = [state.step, ev]
        return ev

    last_eval: list = [-1, None]  # the step of the latest evaluation and its figures
    model.train()
    stopped, ev = "", {"val/bpb": float("nan"), "val/rate": float("nan")}
    try:
        with StopRequest() as stop:
            while state.step < steps:
                # All ranks use the slowest rank's clock (they stop at the same step and, with --schedule time,
                # apply the same learning rate) and stop together when any rank received a stop signal.
                now, stop_now = all_reduce_max(torch.tensor([clock.elapsed(), float(stop.requested or hooked[0])],
                                                            dtype=torch.float64), d).tolist()
                if stop_now:
                    state.elapsed = clock.elapsed()
                    save()
                    stopped = stop.signal or ("on_log" if hooked[0] else "a stop signal on another process")
                    sinks.note(f"stopped by {stopped} at step {state.step}: checkpoint {out / f'step_{state.step:06d}'}"
                               f" saved; continue with: learntok train --resume {out}")
                    break
                if cfg.time_budget and now >= cfg.time_budget:
                    log(f"time budget of {cfg.time_budget:.0f} s reached at step {state.step}")
                    break
                if cfg.flops_budget and spent(state, cfg) >= cfg.flops_budget:
                    log(f"FLOPs budget of {cfg.flops_budget:.3g} ({cfg.flops_convention}) reached at step "
                        f"{state.step}")
                    break
                where = (cfg.optim, state.bytes_seen, steps * bytes_per_step, now if cfg.time_budget else 0.0,
                         cfg.time_budget, spent(state, cfg) / cfg.flops_budget if cfg.flops_budget else 0.0)
                lr = lr_at(*where)
                if hasattr(model, "set_progress"):  # a model whose structure follows the schedule (--inner-start)
                    model.set_progress(progress(*where))
                for group in opt.param_groups:
                    group["lr"] = group_lr(group, lr)
                try:
                    counts, bad = train_step(run, state.step)
                except Exception as e:  # an out-of-memory error may come wrapped (by torch.compile, say)
                    if out_of_memory(e):
                        raise TrainingError(out_of_memory_advice(micro, cfg.data.seq_len, d.device, state.step)) from e
                    raise
                state.step += 1
                state.bytes_seen += bytes_per_step
                state.tokens_seen += counts.tokens
                fl = model.flops_conventions(bytes_per_step // cfg.data.seq_len, cfg.data.seq_len,
                                             *counts.flops_counts())
                for convention, key in KEYS.items():
                    setattr(state, key, getattr(state, key) + fl[convention])
                bad_run = bad_run + 1 if bad else 0
                if bad:
                    state.skipped_steps += 1
                    sinks.note(f"step {state.step}: {bad}; update skipped ({bad_run} in a row, "
                               f"the run stops at {cfg.max_bad_steps})")
                if state.step % cfg.log_every == 0 or state.step == steps:
                    t, b = clock.elapsed(), state.bytes_seen
                    sinks.training({**window.window(d, (t, b)), "step": state.step, "bytes": b, **flops_fields(state),
                                    "train/flops_per_byte": state.flops / b, "train/lr": lr, "time": t})
                sinks.stepped()
                state.elapsed = clock.elapsed()
                if bad_run >= cfg.max_bad_steps:
                    save()
                    raise TrainingError(
                        f"{bad_run} steps in a row had a non-finite loss or gradient norm (last: step {state.step},"
                        f" {bad}); stopped. The weights are those of the last finite update (checkpoint step_"
                        f"{state.step:06d} in {out}); try a lower --lr or --grad-clip, then --resume {out}")
                with clock.paused():  # evaluation and checkpoints do not count as training time
                    if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step < steps:
                        evaluate(final=False)
                    if cfg.ckpt_every and state.step % cfg.ckpt_every == 0:
                        save()
            seconds = state.elapsed = clock.elapsed()
            if not stopped:  # still under StopRequest: a stop signal now lets the last save and evaluation finish
                save()
                # a budget reached right after a periodic evaluation: that one is the final one (no second line)
                ev = last_eval[1] if last_eval[0] == state.step else evaluate(final=True)
                if stop.requested:
                    sinks.note(f"{stop.signal} arrived during the final checkpoint or evaluation; both finished")
    except KeyboardInterrupt:
        log(f"interrupted at step {state.step}; saving a checkpoint (resume with: learntok train --resume {out})")
        if not sharded:  # gathering shards is collective, and the other ranks may be gone
            state.elapsed = clock.elapsed()
            save(barrier=False)
        raise
    finally:
        sinks.close()
    return RunResult(out=out, steps=state.step, bytes_seen=state.bytes_seen, val_bpb=ev["val/bpb"],
                     val_rate=ev["val/rate"], seconds=seconds, bytes_per_s=state.bytes_seen / max(seconds, 1e-9),
                     sample=ev.get("sample", ""), stopped=stopped)


def out_of_memory_advice(micro: int, seq_len: int, device: torch.device, step: int) -> str:
    """The one line an out-of-memory error in a training step becomes: what ran out, and the two settings
    that fix it (nothing is lost: the last checkpoint stands, and a step that failed made no update)."""
    where = f"{device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    return (f"out of memory on {where} in training step {step + 1} with {micro} sequences of {seq_len} bytes per "
            f"forward pass; lower --micro-batch-size (the batch is then accumulated over more passes, same "
            f"result) or add --activation-checkpointing; bench/estimate_memory.py estimates the peak beforehand")


def batch_split(cfg: TrainConfig, d: Dist) -> tuple[int, int, int]:
    """(sequences per process, per micro-batch, micro-batches per step) of the global batch. A micro-batch size
    larger than the per-process batch (e.g. a preset's on many GPUs) is the whole per-process batch."""
    if cfg.model.attn_backend == "flex" and d.device.type != "cuda":
        raise ValueError(FLEX_CPU_TRAINING)
    if cfg.batch_size % d.world:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the {d.world} processes")
    per_rank = cfg.batch_size // d.world
    micro = min(cfg.micro_batch_size, per_rank) if cfg.micro_batch_size else per_rank
    if per_rank % micro:
        raise ValueError(f"per-process batch {per_rank} is not a multiple of micro_batch_size={micro}")
    return per_rank, micro, per_rank // micro


def _evaluated_at(out: Path, step: int) -> bool:
    """Whether metrics.jsonl ends with an evaluation at `step` (a run stopped between its last checkpoint and its
    final evaluation has none)."""
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    try:
        last = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return False
    return "val/bpb" in last and last.get("step") == step


def load_data(cfg: TrainConfig, model: ByteLM, out: Path, d: Dist, per_rank: int,
              log) -> tuple[BatchIterator | StreamBatches, ByteSequences]:
    """This process's training batches and the validation sequences. The strategy is prepared on the documents
    first (e.g. a BPE tokenizer trained and saved in `out` by rank 0, then loaded by the others; from a sample
    of the stream with --stream), and annotates them if it prescribes boundaries."""
    dc = cfg.data
    if dc.stream:
        stream, val_docs = open_stream(dc, rank=d.rank, world_size=d.world, seed=cfg.seed)
        train_docs = stream.sample(STREAM_PREPARE_BYTES)
        log(f"data: train streamed from {dc.source} (shuffle buffer {dc.shuffle_buffer} rows), "
            f"val {len(val_docs):,} docs / {sum(map(len, val_docs)):,} bytes")
    else:
        train_docs, val_docs = load_splits(dc)
        log(describe(train_docs, val_docs))
    strategy = model.boundary
    if d.is_main:
        strategy.prepare(train_docs, val_docs, out)
    if d.active:
        tdist.barrier()
        if not d.is_main:
            strategy.prepare(train_docs, val_docs, out)
    model.files_dir = out  # where its strategy's files are (learntok.save_pretrained copies them from there)
    annotate = strategy.annotator
    val = ByteSequences(val_docs, dc.seq_len, dc.pack, name="validation data", annotate=annotate)
    if dc.stream:
        return StreamBatches(stream, dc.seq_len, per_rank, dc.pack, annotate), val
    train = ByteSequences(train_docs, dc.seq_len, dc.pack, name="training data", annotate=annotate)
    return BatchIterator(train, per_rank, cfg.seed, rank=d.rank, world_size=d.world), val


@dataclass(frozen=True)
class StepCounts:
    """What one update processed, over all processes (learntok.model.flops turns it into FLOPs)."""

    tokens: int
    """Real tokens formed."""
    slots: float
    """Token positions of a dense token level: per micro-batch, rows x its longest row (or --token-bucket's)."""
    token_pairs: float
    """Causal query-key pairs at the token level (sum over rows of L (L + 1) / 2)."""
    supers: float = 0.0
    """Super-tokens formed at a second boundary level (--inner-layers; 0 without one)."""
    super_slots: float = 0.0
    """Super-token positions of the second level as computed: rows x its bucket under --token-bucket, else x its
    longest row (per micro-batch)."""
    super_pairs: float = 0.0
    """Causal query-key pairs at the super-token level."""

    def flops_counts(self) -> tuple:
        """Arguments of the model's `flops_conventions` after (rows, seq_len): a two-level model's too."""
        inner = (self.supers, self.super_slots, self.super_pairs) if self.supers else ()
        return self.tokens, self.slots, self.token_pairs, *inner


def spent(state: TrainState, cfg: TrainConfig) -> float:
    """FLOPs spent so far under the run's --flops-convention."""
    return getattr(state, KEYS[cfg.flops_convention])


def flops_fields(state: TrainState) -> dict:
    """The logged FLOPs counters (learntok.model.flops: flops = the paper's 6N, flops_padded, flops_total)."""
    return {key: getattr(state, key) for key in KEYS.values()}


def train_step(run: Run, step: int) -> tuple[StepCounts, str]:
    """Optimizer update `step` on this process's rows of the next global batch. Returns what the whole update
    processed (all processes) and "" or, when the update was skipped because a loss or the gradient norm was
    not finite on some process, what was wrong. `run.stats` gives the estimator the global batch's statistics."""
    cfg, d, model, micro = run.cfg, run.d, run.model, run.micro
    batch, flags = run.batches.next_with_flags()  # (per_rank / K, seq_len + 1) ids, flags or None
    k = model.boundary.samples_per_sequence  # K boundary samples per sequence (their noise differs by global row)
    batch = repeat_samples(batch, k)
    flags = None if flags is None else repeat_samples(flags, k)
    batch = to_device(batch, d.device)
    rows = d.rank * batch.shape[0] + np.arange(batch.shape[0])  # global row indices of this rank's sequences
    noise = boundary_noise(cfg.seed, step, rows, cfg.data.seq_len, d.device)  # (per_rank, T)
    # Target rates keyed on (seed, step) and each row's place in the global batch, like the noise
    rates = model.boundary.training_rates(cfg.seed, step, rows, d.world * batch.shape[0], d.device)
    parts = [MicroBatch(batch[i:i + micro, :-1], batch[i:i + micro, 1:], noise[i:i + micro],
                        None if flags is None else to_device(flags[i:i + micro, :-1], d.device),
                        None if rates is None else Rates(rates.value[i:i + micro], rates.group[i:i + micro]))
             for i in range(0, batch.shape[0], micro)]
    mixed = autocast(run.precision, d.device)

    def pre_pass() -> list[BatchSums]:  # the micro-batches once without gradients: their local statistics
        with torch.no_grad(), mixed:
            return [model(mb.ids, mb.targets, noise=mb.noise, prescribed=mb.prescribed, **mb.extra).batch_stats
                    for mb in parts]

    reducer = run.stats.reducer(pre_pass) if model.boundary.uses_rewards else None
    tokens, slots, pairs, losses, local = [], [], [], [], []
    supers = []  # a second level's (super-tokens, slots, pairs) per micro-batch
    for i, mb in enumerate(parts):
        sync = contextlib.nullcontext()
        if d.active and cfg.parallel == "ddp" and i < run.accum - 1:
            sync = run.wrapped.no_sync()  # gradients are all-reduced once, after the last micro-step
        with sync:  # one context for forward and backward (a no_sync context is entered once)
            with mixed:
                out = run.wrapped(mb.ids, mb.targets, noise=mb.noise, prescribed=mb.prescribed, batch_stats=reducer,
                                  **mb.extra)
            (out.loss / run.accum).backward()
        n = out.n_tokens  # (B,) real tokens per row
        tokens.append(n.sum())
        slots.append(n.numel() * (out.token_slots or n.max()))  # a dense token level: rows x the longest row
        pairs.append((n * (n + 1)).sum() // 2)  # causal token attention's query-key pairs
        if out.n_super is not None:
            s = out.n_super
            width = s.max() if out.super_slots is None else s.new_tensor(out.super_slots)  # padded: the bucket
            supers.append(torch.stack([s.sum(), s.numel() * width, (s * (s + 1)).sum() // 2]))
        losses.append(out.loss.detach())
        if out.batch_stats is not None:
            local.append(out.batch_stats)
        run.window.add_micro(out, run.accum)  # on the device: read at log intervals
    if hasattr(model, "idle_parameters"):  # their gradients are 0; None keeps AdamW off them (--inner-start)
        for p in model.idle_parameters():
            p.grad = None
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    norm = clip_gradients(model.parameters(), clip)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor over the shards
        norm = norm.full_tensor()
    # The step's one read from the device (besides --token-bucket's count): skip a non-finite update.
    counts = [sum(tokens), sum(slots), sum(pairs), *(sum(supers).unbind() if supers else [0, 0, 0])]
    grad_norm, *losses, n_tokens, n_slots, n_pairs, n_sup, n_sup_slots, n_sup_pairs = torch.stack(
        [torch.as_tensor(t, device=norm.device).double() for t in (norm, *losses, *counts)]).tolist()
    finite = math.isfinite(grad_norm) and all(map(math.isfinite, losses))
    if d.active:  # skip on every rank or on none
        finite = not bool(all_reduce_max(torch.tensor(float(not finite)), d))
    if finite:
        run.opt.step()
        run.stats.observe(local)  # (a skipped step's statistics may be NaN: the lag stays the last finite step's)
    run.opt.zero_grad(set_to_none=True)
    run.window.end_step(grad_norm, applied=finite)
    bad = "" if finite else f"loss {', '.join(f'{v:g}' for v in losses)}, gradient norm {grad_norm:g}"
    total = all_reduce_sum(torch.tensor([n_tokens, n_slots, n_pairs, n_sup, n_sup_slots, n_sup_pairs],
                                        dtype=torch.float64), d).tolist()
    return StepCounts(int(total[0]), *total[1:]), bad
