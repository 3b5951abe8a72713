"""Training-step throughput on a GPU (issue 16): bytes/s, tokens/s, model FLOPs utilisation, peak memory, for
learned and uniform boundaries, eager and compiled, and the largest micro-batch that fits.

Each runner is one model + fused AdamW + a fixed batch of printable bytes; a step is forward (both heads, the
estimator, all losses), backward, clipping and the optimizer, as in `learntok train`. Runners are timed in
interleaved rounds after an untimed warm-up (which holds the compilation) with the device synchronised around
each round; medians are reported.

MFU by the paper's accounting: 6 x matrix parameters per byte (byte level) and per token (token level), the
FLOPs `learntok train` logs, divided by time and the device's dense bf16 peak (H100/H200 SXM: 989 TFLOP/s;
--peak-tflops for others). "+attn" adds attention's score and value matmuls (forward + backward: 12 T w d per
byte-level layer with window w, 6 M^2 d per token-level layer with M tokens, causal).

    python bench/bench_gpu.py --out bench/results/gpu-h100          # all configs, ~15 minutes on one H100
    python bench/bench_gpu.py --configs paper-147m --max-batch      # + the largest 4096-byte micro-batch
    python bench/bench_gpu.py --device cpu --configs tiny --modes eager --rounds 1 --steps 1   # smoke test

Writes OUT/bench_gpu.json and OUT/bench_gpu.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from learntok.boundaries import boundary_config
from learntok.config import ModelConfig, OptimConfig
from learntok.device import PRECISIONS, autocast, configure_matmul, resolve_device, resolve_precision
from learntok.model.lm import ByteLM
from learntok.presets import get_preset
from learntok.train import make_optimizer
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


class Runner:
    """One model + optimizer + fixed batch; `step()` is one full training step."""

    def __init__(self, bc: BenchConfig, strategy: str, device: torch.device, precision: str, compile: bool,
                 micro_batch: int | None = None):
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
        self.gen = torch.Generator(device).manual_seed(1)
        self.bytes, self.rows, self.tokens, self.pad = B * T, B, 0.0, None

    def step(self) -> None:
        noise = torch.rand(self.ids.shape, generator=self.gen, device=self.device)  # as training draws them
        with autocast(self.precision, self.device):
            out = self.model(self.ids, self.targets, noise=noise)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.tokens = out.n_tokens.sum()  # a tensor: read once per round, not per step (no sync here)
        self.pad = out.pad_share


def _graphs_compiled() -> int:
    """Graphs dynamo has built so far in this process (all runners)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def host_syncs(runner: Runner) -> tuple[int, list[str]] | None:
    """Synchronising CUDA calls in one step of `runner` (torch.cuda.set_sync_debug_mode): the count and where
    each was made. A step with --token-bucket should make one, the bucket's token count. None off CUDA."""
    if runner.device.type != "cuda":
        return None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            runner.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message).lower()]
    return len(sites), sites


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(name: str, bc: BenchConfig, mode: str, args, device: torch.device, precision: str) -> list[dict]:
    runners = {s: Runner(bc, s, device, precision, mode == "compiled") for s in ("learned", "uniform")}
    warm = {}
    for s, r in runners.items():  # warm-up and compilation, untimed
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            r.step()
        _sync(device)
        warm[s] = time.perf_counter() - t0
    times = {s: [] for s in runners}
    tokens = {s: [] for s in runners}
    pads = {s: [] for s in runners}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    graphs_before = _graphs_compiled()
    for _ in range(args.rounds):
        for s, r in runners.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                r.step()
            _sync(device)
            times[s].append((time.perf_counter() - t0) / args.steps)
            tokens[s].append(float(r.tokens))
            pads[s].append(None if r.pad is None else float(r.pad))
    late = _graphs_compiled() - graphs_before  # a new token bucket met while timing: compile time in a round
    syncs = {s: host_syncs(r) for s, r in runners.items()}
    peak = peak_flops(device, args.peak_tflops)
    rows = []
    for s, r in runners.items():
        dt = statistics.median(times[s])
        n_tok = statistics.median(tokens[s])
        flops = r.model.train_flops(r.bytes, n_tok)
        attn = attention_flops(bc.model, r.bytes, n_tok, r.rows)
        rows.append({
            "config": name, "mode": mode, "strategy": s, "precision": precision, "micro_batch": r.rows,
            "seq_len": bc.seq_len, "params_m": sum(p.numel() for p in r.model.parameters()) / 1e6,
            "step_s": dt, "bytes_per_s": r.bytes / dt, "tokens_per_s": n_tok / dt, "rate": n_tok / r.bytes,
            "tflops": flops / dt / 1e12, "mfu": flops / dt / peak if peak else None,
            "mfu_with_attention": (flops + attn) / dt / peak if peak else None,
            "warmup_s": warm[s], "graphs_compiled_while_timing": late, "learned_over_uniform": None,
            "host_syncs_per_step": None if syncs[s] is None else syncs[s][0],
            "host_sync_sites": None if syncs[s] is None else syncs[s][1],
            "token_pad_share": None if None in pads[s] else statistics.median(pads[s]),
        })
    ratio = statistics.median(a / b for a, b in zip(times["learned"], times["uniform"]))
    rows[0]["learned_over_uniform"] = ratio
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated(device) / 2**30
        for row in rows:
            row["peak_gib_both_runners"] = peak_mem
    del runners
    return rows


def out_of_memory(e: BaseException) -> bool:
    """An out-of-memory error, also when torch.compile wraps it (InductorError, BackendCompilerFailed)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def max_micro_batch(bc: BenchConfig, device: torch.device, precision: str, compile: bool, limit: int) -> int:
    """The largest micro-batch of bc.seq_len-byte sequences whose learned training step fits in memory:
    doubling, then bisection between the last fit and the first failure."""
    def fits(b: int) -> bool:
        try:
            r = Runner(bc, "learned", device, precision, compile, micro_batch=b)
            r.step()
            r.step()
            _sync(device)
            return True
        except Exception as e:
            if not out_of_memory(e):
                raise
            return False
        finally:
            r = None
            if device.type == "cuda":
                torch.cuda.empty_cache()

    lo, hi = 0, 1
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def markdown(rows: list[dict], env: str) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f} %"

    lines = [f"Environment: {env}", "",
             "| config | mode | strategy | micro-batch | bytes/s | tokens/s | TFLOP/s | MFU | MFU +attn | "
             "token padding | learned / uniform | peak GiB | warm-up s | graphs while timing | host syncs |",
             "|" + "---|" * 15]
    for r in rows:
        ratio = "" if r["learned_over_uniform"] is None else f"{r['learned_over_uniform']:.3f}"
        mem = f"{r['peak_gib_both_runners']:.1f}" if "peak_gib_both_runners" in r else "-"
        lines.append(f"| {r['config']} | {r['mode']} | {r['strategy']} | {r['micro_batch']}x{r['seq_len']} | "
                     f"{r['bytes_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {pct(r['mfu'])} | "
                     f"{pct(r['mfu_with_attention'])} | {pct(r.get('token_pad_share'))} | {ratio} | {mem} | "
                     f"{r['warmup_s']:.0f} | {r.get('graphs_compiled_while_timing', '-')} | "
                     f"{'-' if r.get('host_syncs_per_step') is None else r['host_syncs_per_step']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configs = _configs()
    ap.add_argument("--configs", nargs="+", default=["paper-147m", "30m"], choices=list(configs))
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto", choices=PRECISIONS)
    ap.add_argument("--micro-batch", type=int, default=0, help="override each config's micro-batch")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (median reported)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round and runner")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per runner (compilation happens here)")
    ap.add_argument("--token-bucket", type=int, default=0,
                    help="token-level bucket (default: --compile's 64); larger buckets, fewer compiled graphs")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="device peak for MFU (default: by name)")
    ap.add_argument("--max-batch", action="store_true", help="also search the largest micro-batch that fits")
    ap.add_argument("--max-batch-limit", type=int, default=256)
    ap.add_argument("--out", default="bench/results/gpu")
    args = ap.parse_args()
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    configure_matmul(precision, device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    env = f"{gpu}, torch {torch.__version__}, precision {precision}"
    print(env)
    rows, max_batch = [], {}
    out = Path(args.out)

    def write() -> str:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_gpu.json").write_text(json.dumps({"env": env, "rows": rows, "max_micro_batch": max_batch},
                                                       indent=1) + "\n")
        md = markdown(rows, env) + "".join(f"\nLargest micro-batch ({k}): {v}\n" for k, v in max_batch.items())
        (out / "bench_gpu.md").write_text(md)
        return md

    for name in args.configs:
        bc = configs[name]
        if args.micro_batch:
            bc = replace(bc, micro_batch=args.micro_batch)
        if args.token_bucket:
            bc = replace(bc, model=replace(bc.model, token_bucket=args.token_bucket))
        for mode in args.modes:
            got = bench(name, bc, mode, args, device, precision)
            rows += got
            for r in got:
                mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
                print(f"{name:11s} {mode:8s} {r['strategy']:8s} {r['bytes_per_s']:12,.0f} B/s  MFU {mfu}", flush=True)
            write()
        if args.max_batch:
            max_batch[name] = max_micro_batch(bc, device, precision, "compiled" in args.modes,
                                              args.max_batch_limit)
            print(f"{name}: largest micro-batch of {bc.seq_len}-byte sequences that trains: {max_batch[name]}",
                  flush=True)
            write()
    print(write())


if __name__ == "__main__":
    main()
