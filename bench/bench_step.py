"""Whole-training-step throughput (bytes/s): forward, both heads, returns, all losses, backward, clip, AdamW.

Configs (the authors' reference implementation measured on the same 2-core CPU: ~12 k B/s for the reference
tiny config with its window-8 policy, ~1.9 k B/s for one 4096-byte sequence):

    ref-tiny 8x512   d 128, 2 heads, 1/2/1 layers, byte window 64, 8 sequences x 512 bytes
    ref-tiny 1x4096  the same model on 1 x 4096 bytes
    mid-256          d 256, 4 heads, 2/6/2, window 32, 16 x 1024 bytes (an earlier `small` preset)

Each with learned and uniform boundaries, interleaved round by round so machine noise hits both alike; the
median over rounds is reported, with the learned/uniform ratio and the share of the learned step spent
sampling boundaries.

    python bench/bench_step.py                 # ~3 minutes on 2 cores
    python bench/bench_step.py --rounds 3 --configs ref-tiny-8x512
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import learntok.boundaries.learned as learned_mod
from learntok.boundaries import boundary_config
from learntok.config import ModelConfig, OptimConfig
from learntok.model.lm import ByteLM
from learntok.train import make_optimizer
from learntok.vocab import BOS

REF = ModelConfig(d_model=128, n_heads=2, n_down=1, n_mid=2, n_up=1, byte_window=64)
CONFIGS = {
    "ref-tiny-8x512": (REF, 8, 512),
    "ref-tiny-1x4096": (REF, 1, 4096),
    "mid-256": (ModelConfig(d_model=256, n_heads=4, n_down=2, n_mid=6, n_up=2, byte_window=32), 16, 1024),
}
AUTHORS = {"ref-tiny-8x512": 12_000, "ref-tiny-1x4096": 1_900}

_sample_time = [0.0]
_real_sample = learned_mod.sample_window_policy


def _timed_sample(*args, **kw):
    t0 = time.perf_counter()
    out = _real_sample(*args, **kw)
    _sample_time[0] += time.perf_counter() - t0
    return out


def time_the_sampler() -> None:
    """Route the learned policy's sampler through a timer (eager runs only: a compiled stage traces it)."""
    learned_mod.sample_window_policy = _timed_sample


class Runner:
    """One model + optimizer + fixed batch; `step()` is one full training step."""

    def __init__(self, mcfg: ModelConfig, strategy: str, B: int, T: int, compile: bool):
        torch.manual_seed(0)
        self.model = ByteLM(mcfg, boundary_config(strategy)).train()
        if compile:  # static token shapes: one compiled graph per bucket (docs/gpu.md)
            self.model.compile_stages()
        self.opt = make_optimizer(self.model, OptimConfig())
        g = torch.Generator().manual_seed(0)
        seq = torch.randint(32, 127, (B, T + 1), generator=g)  # printable ASCII: realistic byte range
        seq[:, 0] = BOS
        self.ids, self.targets, self.gen = seq[:, :-1], seq[:, 1:], torch.Generator().manual_seed(1)
        self.bytes = B * T

    def step(self) -> None:
        noise = torch.rand(self.ids.shape, generator=self.gen)  # boundary uniforms, as training draws them
        out = self.model(self.ids, self.targets, noise=noise)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class OpCounter(TorchDispatchMode):
    """Counts the aten calls (and the elements they return) of whatever runs inside it: a machine-independent
    measure of how much an eager step does, for comparing two versions of the code on a noisy machine."""

    def __init__(self):
        super().__init__()
        self.calls, self.elements = collections.Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls[str(func)] += 1
        self.elements += out.numel() if isinstance(out, torch.Tensor) else 0
        return out


def count_ops(configs: list[str]) -> None:
    """One eager training step per config and strategy (after one warm-up step), counted op by op."""
    print(f"{'config':18s} {'strategy':9s} {'aten calls':>10s} {'elements':>14s}")
    for name in configs:
        mcfg, B, T = CONFIGS[name]
        for s in ("learned", "uniform"):
            r = Runner(mcfg, s, B, T, compile=False)
            r.step()
            with OpCounter() as c:
                r.step()
            print(f"{name:18s} {s:9s} {sum(c.calls.values()):10d} {c.elements:14d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per round and runner")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (warm-up not timed)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per runner (use ~8 with --compile)")
    ap.add_argument("--count-ops", action="store_true",
                    help="instead of timing, count one eager step's aten calls (machine-independent)")
    args = ap.parse_args()
    if args.count_ops:
        return count_ops(args.configs)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, compile={args.compile}")
    if not args.compile:
        time_the_sampler()
    print(f"{'config':18s} {'strategy':9s} {'bytes/s':>9s} {'vs authors':>10s} {'learned/uniform':>16s} "
          f"{'sampling share':>15s}")
    for name in args.configs:
        mcfg, B, T = CONFIGS[name]
        runners = {s: Runner(mcfg, s, B, T, args.compile) for s in ("learned", "uniform")}
        for r in runners.values():  # warm-up (and compilation) outside the timing
            for _ in range(args.warmup):
                r.step()
        times = {s: [] for s in runners}
        sample = []
        for _ in range(args.rounds):
            for s, r in runners.items():
                _sample_time[0] = 0.0
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    r.step()
                dt = time.perf_counter() - t0
                times[s].append(dt / args.steps)
                if s == "learned":
                    sample.append(_sample_time[0] / dt)
        med = {s: statistics.median(t) for s, t in times.items()}
        ratio = statistics.median(a / b for a, b in zip(times["learned"], times["uniform"]))
        for s in runners:
            bps = B * T / med[s]
            ref = f"{bps / AUTHORS[name]:.1f}x" if name in AUTHORS else "-"
            extra = (f"{ratio:16.3f} {100 * statistics.median(sample):14.2f}%" if s == "learned" else "")
            print(f"{name:18s} {s:9s} {bps:9.0f} {ref:>10s} {extra}")


if __name__ == "__main__":
    main()
