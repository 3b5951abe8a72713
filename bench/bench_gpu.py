"""Training-step throughput on a GPU: bytes/s, tokens/s, model FLOPs utilisation and peak memory, for
learned and uniform boundaries, eager and compiled, and the peak memory of one learned runner per micro-batch.

Each runner is one model + fused AdamW + a fixed batch of printable bytes and fixed boundary noise; a step is
forward (both heads, the estimator, all losses), backward, clipping and the optimizer, as in `learntok train`.
A runner takes one step (the optimizer state exists from then on), saves its weights and optimizer state, and
every round after that, untimed warm-up and timed alike, starts from that state and replays the same steps with
the same noise: the same token counts, hence the same token buckets, so the warm-up compiles every graph a
timed round meets. Runners are timed in interleaved rounds with the device synchronised around each round;
medians are reported.

A row is rejected (field `rejected`, shown in the tables) when dynamo built a graph while it was timed
(compilation in the time) or one step made more than one synchronising call (the token bucket's count is the
one a step needs; more is a stall the figure would hide).

MFU by the paper's accounting: 6 x matrix parameters per byte (byte level) and per token (token level), the
FLOPs `learntok train` logs, divided by time and by two ceilings: the device's dense bf16 peak from its data
sheet (H100/H200 SXM: 989 TFLOP/s; --peak-tflops for others) and the bf16 GEMM rate measured in the same
process before the benchmark (what this card reaches today on the step's dominant operation). "+attn" adds
attention's score and value matmuls (forward + backward: 12 T w d per byte-level layer with window w, 6 M^2 d
per token-level layer with M tokens, causal).

    python bench/bench_gpu.py --out bench/results/gpu-h100                     # all configs, eager and compiled
    python bench/bench_gpu.py --configs paper-147m --modes compiled --rounds 0 --micro-batches 8 16
    python bench/bench_gpu.py --device cpu --configs tiny --modes eager --rounds 1 --steps 1   # smoke test

Writes OUT/bench_gpu.json and OUT/bench_gpu.md (after every measurement: a run cut off keeps what it measured),
each with the provenance: GPU, driver, CUDA, torch, triton, clocks, the measured GEMM ceiling, the command.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from learntok.boundaries import boundary_config
from learntok.config import ModelConfig, OptimConfig
from learntok.device import (
    PRECISIONS,
    autocast,
    configure_matmul,
    out_of_memory,
    resolve_device,
    resolve_precision,
)
from learntok.model.lm import ByteLM
from learntok.presets import get_preset
from learntok.train import make_optimizer
from learntok.train.state import run_info
from learntok.vocab import BOS


@dataclass(frozen=True)
class BenchConfig:
    model: ModelConfig
    micro_batch: int
    seq_len: int


def _configs() -> dict[str, BenchConfig]:
    paper = get_preset("paper-147m")
    tiny = get_preset("tiny")
    return {
        "paper-147m": BenchConfig(paper.model, 8, paper.data.seq_len),
        "30m": BenchConfig(replace(paper.model, d_model=512, n_heads=8, n_down=2, n_mid=8, n_up=2), 16, 4096),
        "tiny": BenchConfig(tiny.model, tiny.batch_size, tiny.data.seq_len),
    }


PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}
"""Dense bf16 tensor-core peaks (FLOP/s) by device-name substring (vendor data sheets, SXM where it matters)."""

GEMM_SIZE = 8192
"""Side of the square bf16 matrix product whose measured rate is the GEMM ceiling on CUDA."""


def peak_flops(device: torch.device, override: float) -> float | None:
    if override:
        return override * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def attention_flops(cfg: ModelConfig, n_bytes: float, n_tokens: float, rows: int) -> float:
    """Training FLOPs of attention's QK^T and AV matmuls (not in the 6N count): forward 4 x queries x keys x d,
    backward twice that. Byte level: min(window, T) keys per query; token level: causal, M/2 keys on average."""
    byte_layers = cfg.n_down + cfg.n_up
    T = n_bytes / rows
    byte = 12.0 * n_bytes * min(cfg.byte_window, T) * cfg.d_model * byte_layers
    M = n_tokens / rows
    token = 6.0 * rows * M * M * cfg.d_model * cfg.n_mid
    return byte + token


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_tflops(device: torch.device, n: int, repeats: int = 5, iters: int = 10) -> float:
    """Measured rate (TFLOP/s) of an n x n x n bf16 matrix product on random data, the best of `repeats` timings
    of `iters` products: the ceiling the card reaches today (clocks, power cap, driver) on the training step's
    dominant operation, beside the data sheet's peak."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 * iters / best / 1e12


SMI_FIELDS = {"uuid": "uuid", "name": "gpu", "driver_version": "driver", "memory.total": "memory_mib",
              "clocks.current.sm": "sm_clock_mhz", "clocks.current.memory": "mem_clock_mhz",
              "clocks.max.sm": "max_sm_clock_mhz", "clocks.max.memory": "max_mem_clock_mhz",
              "power.limit": "power_limit_w", "temperature.gpu": "temperature_c", "pstate": "pstate"}
"""nvidia-smi's --query-gpu fields and the names they get here."""


def nvidia_smi(device: torch.device) -> dict:
    """nvidia-smi's reading of `device` (SMI_FIELDS, numbers as numbers); {} off CUDA or without nvidia-smi."""
    if device.type != "cuda":
        return {}
    try:
        text = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    gpus = [dict(zip(SMI_FIELDS.values(), (v.strip() for v in line.split(",")))) for line in text.splitlines()]
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    # nvidia-smi numbers GPUs without CUDA_VISIBLE_DEVICES: match by UUID, else the first
    gpu = next((g for g in gpus if uuid and uuid in g["uuid"]), gpus[0] if gpus else {})
    return {k: _number(v) for k, v in gpu.items()}


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def provenance(device: torch.device, precision: str, gemm_size: int, peak: float | None) -> dict:
    """Where and with what the figures were measured: the GPU as nvidia-smi reads it right after the GEMM
    timing (loaded clocks), the software versions, the measured GEMM ceiling, the data sheet's peak, the
    command and the time."""
    gemm = gemm_tflops(device, gemm_size) if gemm_size else None
    smi, info = nvidia_smi(device), run_info()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {**dict.fromkeys(SMI_FIELDS.values()), "gpu": name, **smi,
            "cuda": torch.version.cuda, "torch": info["torch"], "triton": _version("triton"),
            "python": info["python"], "precision": precision, "gemm_size": gemm_size or None,
            "gemm_tflops": gemm, "peak_tflops": peak / 1e12 if peak else None, "git": info["git_sha"],
            "command": " ".join(["python", *sys.argv]),
            "time_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")}


class Runner:
    """One model + optimizer + fixed batch + `steps` fixed boundary-noise tensors; `step(i)` is one full training
    step with the i-th. `snapshot()` saves the weights and optimizer state (to host memory: the device's peak
    stays the step's own) and `restore()` puts them back, so that rounds replay the same steps."""

    def __init__(self, bc: BenchConfig, strategy: str, device: torch.device, precision: str, compile: bool,
                 micro_batch: int | None = None, steps: int = 1):
        torch.manual_seed(0)
        self.device, self.precision = device, precision
        self.model = ByteLM(bc.model, boundary_config(strategy)).to(device).train()
        if precision == "bf16":
            self.model.to(torch.bfloat16)
        if compile:  # static token shapes: one compiled graph per bucket (docs/gpu.md)
            self.model.compile_stages()
        self.opt = make_optimizer(self.model, OptimConfig(), fused=device.type == "cuda")
        B, T = micro_batch or bc.micro_batch, bc.seq_len
        g = torch.Generator().manual_seed(0)
        seq = torch.randint(32, 127, (B, T + 1), generator=g)  # printable ASCII: a realistic byte range
        seq[:, 0] = BOS
        self.ids, self.targets = seq[:, :-1].to(device), seq[:, 1:].to(device)
        self.noise = [torch.rand(B, T, generator=g).to(device) for _ in range(steps)]
        self.bytes, self.rows = B * T, B
        self.saved: list[torch.Tensor] = []

    def step(self, i: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One training step with noise i; returns its token count and padding share as device tensors (no
        read here: a read is a synchronisation)."""
        with autocast(self.precision, self.device):
            out = self.model(self.ids, self.targets, noise=self.noise[i])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return out.n_tokens.sum(), out.pad_share

    def _state(self) -> list[torch.Tensor]:
        opt = [v for s in self.opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        return [*self.model.state_dict().values(), *opt]

    def snapshot(self) -> None:
        pin = self.device.type == "cuda"
        self.saved = [torch.empty_like(t, device="cpu", pin_memory=pin).copy_(t) for t in self._state()]

    def restore(self) -> None:
        for t, s in zip(self._state(), self.saved, strict=True):
            t.copy_(s, non_blocking=True)


def replay(r: Runner) -> tuple[float, float, float | None]:
    """One round: restore the saved state, then every step of the runner, timed with the device synchronised
    around it. Returns seconds per step, tokens per step and the token level's padding share."""
    r.restore()
    _sync(r.device)
    t0 = time.perf_counter()
    outs = [r.step(i) for i in range(len(r.noise))]
    _sync(r.device)
    dt = (time.perf_counter() - t0) / len(outs)
    tokens = float(sum(n for n, _ in outs)) / len(outs)
    pads = [p for _, p in outs if p is not None]
    return dt, tokens, float(sum(pads)) / len(pads) if pads else None


def _graphs_compiled() -> int:
    """Graphs dynamo has built so far in this process (all runners)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def host_syncs(runner: Runner) -> tuple[int, list[str]] | None:
    """Synchronising CUDA calls in one step of `runner` (torch.cuda.set_sync_debug_mode): the count and where
    each was made. A step with --token-bucket should make one, the bucket's token count. None off CUDA."""
    if runner.device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            runner.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sync_sites(caught)


SYNC_WARNING = "called a synchronizing CUDA operation"
"""What torch's sync debug mode says at each synchronising call. Setting the mode also warns, once per process,
that it "is a prototype feature" (the word synchronization in it): the first GPU run counted that notice as a
second sync (2026-11-28), so only this text counts."""


def sync_sites(caught: list[warnings.WarningMessage]) -> tuple[int, list[str]]:
    """The synchronising calls among recorded warnings: their count and where each was made."""
    sites = [f"{w.filename}:{w.lineno}" for w in caught if SYNC_WARNING in str(w.message)]
    return len(sites), sites


def top_kernels(runner: Runner, n: int) -> tuple[float, list[dict]]:
    """The n kernels with the most device time in one step (torch.profiler; on a CPU: operators by self CPU
    time), each with its calls, milliseconds and share of all kernel time; and that total in milliseconds (the
    step's busy time on the device, to set beside its wall time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = runner.device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        runner.step()
        _sync(runner.device)
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    events = [(e.key, e.count, e.self_device_time_total if cuda else e.self_cpu_time_total)
              for e in prof.key_averages() if e.device_type == kind]
    events.sort(key=lambda e: -e[2])
    total = sum(us for *_, us in events)
    return total / 1e3, [{"name": k, "calls": c, "ms": us / 1e3, "share": us / total if total else 0.0}
                         for k, c, us in events[:n]]


def rejection(row: dict) -> str | None:
    """Why a row's timing cannot be used, or None: graphs compiled while it was timed (compilation inside the
    time), or more than one synchronising call per step (a stall a real step would not have)."""
    why = []
    if row["graphs_compiled_while_timing"]:
        why.append(f"{row['graphs_compiled_while_timing']} graph(s) compiled while timing")
    if (row["host_syncs_per_step"] or 0) > 1:
        why.append(f"{row['host_syncs_per_step']} host syncs per step")
    return "; ".join(why) or None


def bench(name: str, bc: BenchConfig, mode: str, strategies: list[str], args, device: torch.device,
          precision: str, ceiling: dict, rounds: int, profile: int = 0) -> list[dict]:
    """Warm up each strategy's runner (one step, the snapshot, `args.warmup` replayed rounds), then time them in
    `rounds` interleaved rounds; one row per strategy. ceiling: the data sheet's peak and the measured GEMM
    rate in FLOP/s (None where unknown). peak_gib: the most device memory the timed rounds held beyond what was
    allocated before the runners were built (all runners' weights and optimizer state, one step's gradients
    and activations)."""
    what = f"[bench_gpu] {name} {mode} {'/'.join(strategies)} micro-batch {bc.micro_batch}"
    print(f"{what}: warm-up", flush=True)  # the markers put the recompile log's lines in or out of the timing
    gc.collect()
    # Memory is counted from here: whatever earlier runners left (say, held by dynamo's caches) is not theirs.
    base_mem = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    graphs = _graphs_compiled()
    runners, warm, warm_graphs = {}, {}, {}
    for s in strategies:  # warm-up and compilation, untimed
        t0 = time.perf_counter()
        r = runners[s] = Runner(bc, s, device, precision, mode == "compiled", steps=args.steps)
        r.step()  # creates the optimizer state, which the snapshot holds
        r.snapshot()
        for _ in range(args.warmup):
            replay(r)
        warm[s], warm_graphs[s] = time.perf_counter() - t0, _graphs_compiled() - graphs
        graphs += warm_graphs[s]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed = {s: [] for s in runners}
    late = dict.fromkeys(runners, 0)
    print(f"{what}: timing", flush=True)
    for _ in range(rounds):
        for s, r in runners.items():
            g = _graphs_compiled()
            timed[s].append(replay(r))
            late[s] += _graphs_compiled() - g  # a graph first met while timing: compile time inside a round
    print(f"{what}: timed", flush=True)
    peak_mem = (torch.cuda.max_memory_allocated(device) - base_mem) / 2**30 if device.type == "cuda" else None
    clocks = nvidia_smi(device)  # right after timing: the clocks the rounds ran at
    rows = []
    for s, r in runners.items():
        r.restore()
        syncs = host_syncs(r)
        times = [t for t, _, _ in timed[s]]
        dt = statistics.median(times)
        n_tok = statistics.median(n for _, n, _ in timed[s])
        pads = [p for _, _, p in timed[s] if p is not None]
        flops = r.model.train_flops(r.bytes, n_tok)
        attn = attention_flops(bc.model, r.bytes, n_tok, r.rows)
        row = {
            "config": name, "mode": mode, "strategy": s, "precision": precision, "micro_batch": r.rows,
            "seq_len": bc.seq_len, "params_m": sum(p.numel() for p in r.model.parameters()) / 1e6,
            "step_s": dt, "step_s_rounds": times, "bytes_per_s": r.bytes / dt, "tokens_per_s": n_tok / dt,
            "rate": n_tok / r.bytes, "tflops": flops / dt / 1e12,
            "mfu": flops / dt / ceiling["peak"] if ceiling["peak"] else None,
            "mfu_vs_gemm": flops / dt / ceiling["gemm"] if ceiling["gemm"] else None,
            "mfu_with_attention": (flops + attn) / dt / ceiling["peak"] if ceiling["peak"] else None,
            "token_pad_share": statistics.median(pads) if pads else None,
            "peak_gib": peak_mem, "runners_in_memory": len(runners), "sm_clock_mhz": clocks.get("sm_clock_mhz"),
            "warmup_s": warm[s], "graphs_compiled_warmup": warm_graphs[s],
            "graphs_compiled_while_timing": late[s],
            "host_syncs_per_step": None if syncs is None else syncs[0],
            "host_sync_sites": None if syncs is None else syncs[1],
        }
        row["rejected"] = rejection(row)
        if profile:
            r.restore()
            row["kernel_ms"], row["top_kernels"] = top_kernels(r, profile)
        rows.append(row)
    if {"learned", "uniform"} <= set(runners):
        learned, uniform = (next(x for x in rows if x["strategy"] == s) for s in ("learned", "uniform"))
        learned["learned_over_uniform"] = statistics.median(
            a[0] / b[0] for a, b in zip(timed["learned"], timed["uniform"]))
        learned["ratio_rejected"] = "; ".join(f"{x['strategy']}: {x['rejected']}" for x in (learned, uniform)
                                              if x["rejected"]) or None
    return rows


def memory_probe(name: str, bc: BenchConfig, mode: str, micro_batch: int, args, device: torch.device,
                 precision: str, ceiling: dict) -> dict:
    """One learned runner alone at `micro_batch`: a timed round of its steps, its host syncs and the peak memory
    of its steps (weights, gradients, optimizer state, activations); out of memory is a result too."""
    try:
        return bench(name, replace(bc, micro_batch=micro_batch), mode, ["learned"], args, device, precision,
                     ceiling, rounds=1)[0]
    except Exception as e:
        if not out_of_memory(e):
            raise
        return {"config": name, "mode": mode, "strategy": "learned", "micro_batch": micro_batch,
                "seq_len": bc.seq_len, "out_of_memory": True, "rejected": "out of memory"}
    finally:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _fmt(x, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def provenance_markdown(p: dict) -> str:
    """The provenance block every Markdown report starts with."""
    clocks = (f"SM {_fmt(p.get('sm_clock_mhz'), '.0f')} MHz (max {_fmt(p.get('max_sm_clock_mhz'), '.0f')}), "
              f"memory {_fmt(p.get('mem_clock_mhz'), '.0f')} MHz (max {_fmt(p.get('max_mem_clock_mhz'), '.0f')}), "
              f"power limit {_fmt(p.get('power_limit_w'), '.0f')} W, {_fmt(p.get('temperature_c'), '.0f')} °C, "
              f"{p.get('pstate') or '-'}")
    gemm = "not measured" if p["gemm_tflops"] is None else (
        f"{p['gemm_tflops']:.1f} TFLOP/s ({p['gemm_size']}³ bf16, best of 5 x 10)"
        + ("" if p.get("gemm_tflops_after") is None else f"; {p['gemm_tflops_after']:.1f} after the benchmark"))
    return "\n".join([
        f"- device: {p['gpu']}, driver {p.get('driver') or '-'}, {_fmt(p.get('memory_mib'), '.0f')} MiB",
        f"- software: torch {p['torch']}, CUDA {p['cuda'] or '-'}, triton {p['triton'] or '-'}, "
        f"Python {p['python']}, learntok {p['git'] or '(no git)'}; precision {p['precision']}",
        f"- clocks after the GEMM: {clocks}",
        f"- measured GEMM ceiling: {gemm}; data-sheet peak {_fmt(p['peak_tflops'], '.0f')} TFLOP/s",
        f"- run: {p['time_utc']}, `{p['command']}`",
    ]) + "\n"


def markdown(result: dict) -> str:
    """The report: provenance, the interleaved comparison, the per-micro-batch probes, the kernel tables."""
    lines = ["# bench_gpu.py", "", provenance_markdown(result["provenance"])]
    if result["rows"]:
        lines += ["## Interleaved rounds (medians)", "",
                  "| config | mode | strategy | micro-batch | bytes/s | tokens/s | TFLOP/s | MFU (data sheet) | "
                  "MFU (GEMM) | MFU +attn | token padding | learned / uniform | peak GiB (runners) | warm-up s "
                  "(graphs) | graphs while timing | host syncs | rejected |",
                  "|" + "---|" * 17]
        for r in result["rows"]:
            ratio = ""
            if r.get("learned_over_uniform") is not None:
                ratio = f"{r['learned_over_uniform']:.3f}" + (" (rejected)" if r["ratio_rejected"] else "")
            lines.append(
                f"| {r['config']} | {r['mode']} | {r['strategy']} | {r['micro_batch']}x{r['seq_len']} | "
                f"{r['bytes_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {_pct(r['mfu'])} | "
                f"{_pct(r['mfu_vs_gemm'])} | {_pct(r['mfu_with_attention'])} | {_pct(r['token_pad_share'])} | "
                f"{ratio} | {_fmt(r['peak_gib'], '.1f')} ({r['runners_in_memory']}) | "
                f"{r['warmup_s']:.0f} ({r['graphs_compiled_warmup']}) | {r['graphs_compiled_while_timing']} | "
                f"{_fmt(r['host_syncs_per_step'], 'd')} | {r['rejected'] or ''} |")
        lines.append("")
    if result["memory"]:
        lines += ["## One learned runner per micro-batch", "",
                  "| config | mode | micro-batch | step ms | bytes/s | MFU (data sheet) | MFU (GEMM) | peak GiB | "
                  "warm-up s (graphs) | graphs while timing | host syncs | rejected |",
                  "|" + "---|" * 12]
        for r in result["memory"]:
            head = f"| {r['config']} | {r['mode']} | {r['micro_batch']}x{r['seq_len']} |"
            if r.get("out_of_memory"):
                lines.append(head + " - | - | - | - | out of memory | - | - | - | rejected: out of memory |")
                continue
            lines.append(
                f"{head} {1e3 * r['step_s']:.1f} | {r['bytes_per_s']:,.0f} | {_pct(r['mfu'])} | "
                f"{_pct(r['mfu_vs_gemm'])} | {_fmt(r['peak_gib'], '.2f')} | {r['warmup_s']:.0f} "
                f"({r['graphs_compiled_warmup']}) | {r['graphs_compiled_while_timing']} | "
                f"{_fmt(r['host_syncs_per_step'], 'd')} | {r['rejected'] or ''} |")
        lines.append("")
    for r in result["rows"]:
        if r.get("top_kernels"):
            lines += [f"## Top kernels of one step: {r['config']}, {r['mode']}, {r['strategy']}", "",
                      f"Kernel time {r['kernel_ms']:.1f} ms of a {1e3 * r['step_s']:.1f} ms step.", "",
                      "| kernel | calls | ms | share |", "|---|---|---|---|"]
            lines += [f"| `{k['name'][:100].replace('|', '/')}` | {k['calls']} | {k['ms']:.2f} | {_pct(k['share'])} |"
                      for k in r["top_kernels"]]
            lines.append("")
    return "\n".join(lines)


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a stage's time limit may kill the process at any moment."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configs = _configs()
    ap.add_argument("--configs", nargs="+", default=["paper-147m", "30m"], choices=list(configs))
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    ap.add_argument("--strategies", nargs="+", default=["learned", "uniform"],
                    help="runners timed against each other (learned / uniform ratio when both)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto", choices=PRECISIONS)
    ap.add_argument("--micro-batch", type=int, default=0, help="override each config's micro-batch")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=[],
                    help="also measure one learned runner alone at each of these micro-batches (peak memory)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved timing rounds (median reported); 0: no comparison, only --micro-batches")
    ap.add_argument("--steps", type=int, default=5, help="steps per round and runner")
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed rounds per runner, each the timed rounds' steps (compilation happens here)")
    ap.add_argument("--token-bucket", type=int, default=0,
                    help="token-level bucket (default: --compile's 64); larger buckets, fewer compiled graphs")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="device peak for MFU (default: by name)")
    ap.add_argument("--gemm-size", type=int, default=None,
                    help=f"side of the bf16 GEMM timed as the ceiling (default {GEMM_SIZE} on CUDA, none on CPU)")
    ap.add_argument("--profile", type=int, default=0, help="top-N kernel table of one step per compared runner")
    ap.add_argument("--out", default="bench/results/gpu")
    args = ap.parse_args()
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    configure_matmul(precision, device)
    gemm_size = args.gemm_size if args.gemm_size is not None else GEMM_SIZE * (device.type == "cuda")
    peak = peak_flops(device, args.peak_tflops)
    prov = provenance(device, precision, gemm_size, peak)
    ceiling = {"peak": peak, "gemm": None if prov["gemm_tflops"] is None else prov["gemm_tflops"] * 1e12}
    print(provenance_markdown(prov), flush=True)
    result = {"provenance": prov, "rows": [], "memory": []}
    out = Path(args.out)

    def write() -> str:
        out.mkdir(parents=True, exist_ok=True)
        _write(out / "bench_gpu.json", json.dumps(result, indent=1) + "\n")
        md = markdown(result)
        _write(out / "bench_gpu.md", md)
        return md

    for name in args.configs:
        bc = configs[name]
        if args.micro_batch:
            bc = replace(bc, micro_batch=args.micro_batch)
        if args.token_bucket:
            bc = replace(bc, model=replace(bc.model, token_bucket=args.token_bucket))
        for mode in args.modes:
            if args.rounds:
                got = bench(name, bc, mode, args.strategies, args, device, precision, ceiling, args.rounds,
                            args.profile)
                result["rows"] += got
                for r in got:
                    print(f"{name:11s} {mode:8s} {r['strategy']:8s} {r['bytes_per_s']:12,.0f} B/s  MFU "
                          f"{_pct(r['mfu'])}  {r['rejected'] or ''}", flush=True)
                write()
            for b in args.micro_batches:
                r = memory_probe(name, bc, mode, b, args, device, precision, ceiling)
                result["memory"].append(r)
                print(f"{name:11s} {mode:8s} micro-batch {b}: peak {_fmt(r.get('peak_gib'), '.2f')} GiB  "
                      f"{r['rejected'] or ''}", flush=True)
                write()
    if gemm_size:  # the ceiling again: clocks or power that sagged during the run show here
        prov["gemm_tflops_after"] = gemm_tflops(device, gemm_size)
    print(write())


if __name__ == "__main__":
    main()
