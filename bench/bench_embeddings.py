"""What hashed embeddings cost a CPU training step: the `small` preset's U-Net with `learned-w1-vb`'s policy on
8 x 512 bytes, without and with hashed byte n-gram embeddings (--ngram-sizes, tables of --ngram-table rows) and
the chunk embedding (--chunk-table), the tables with sparse gradients and a lazy Adam as training gives them in one
eager process (and once with dense gradients and AdamW, what DDP and compiled runs use). Whole training steps
(forward, losses, backward, clip, optimizer), the variants
interleaved round by round so machine noise hits them alike; the median step time over rounds and the median
ratio to the plain model, pair by pair.

    python bench/bench_embeddings.py                   # about 2 minutes on 2 cores
    python bench/bench_embeddings.py --rounds 3 --table 65536
    python bench/bench_embeddings.py --record bench/records-embeddings.jsonl   # the figures bench/README.md shows
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from learntok.config import OptimConfig
from learntok.model.lm import ByteLM
from learntok.presets import SMALL_SCALE_MODEL, SMALL_SCALE_POLICY
from learntok.train.schedule import clip_gradients, make_optimizer
from learntok.vocab import BOS

B, T = 8, 512


def variants(table: int) -> dict[str, dict]:
    ngrams = {"ngram_sizes": (3, 4, 5, 6, 7, 8), "ngram_table": table}
    return {"plain": {}, "ngrams 3-8": ngrams, "ngrams 3-8, dense grads": {**ngrams, "sparse": False},
            "ngrams 2-4": {"ngram_sizes": (2, 3, 4), "ngram_table": table}, "chunks": {"chunk_table": table},
            "ngrams 3-8 + chunks": {**ngrams, "chunk_table": table}}


class Runner:
    def __init__(self, sparse: bool = True, **model_kw):
        torch.manual_seed(0)
        policy = replace(SMALL_SCALE_POLICY, policy_window=1, value_baseline=True)
        self.model = ByteLM(replace(SMALL_SCALE_MODEL, **model_kw), policy).train()
        self.opt = make_optimizer(self.model, OptimConfig(), sparse=sparse)
        g = torch.Generator().manual_seed(0)
        seq = torch.randint(32, 127, (B, T + 1), generator=g)
        seq[:, 0] = BOS
        self.ids, self.targets, self.gen = seq[:, :-1], seq[:, 1:], torch.Generator().manual_seed(1)
        self.params = sum(p.numel() for p in self.model.parameters())

    def step(self) -> None:
        out = self.model(self.ids, self.targets, noise=torch.rand(self.ids.shape, generator=self.gen))
        out.loss.backward()
        clip_gradients(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round and variant")
    ap.add_argument("--table", type=int, default=16384, help="rows per hashed table")
    ap.add_argument("--record", type=Path, default=None, help="append the result as a record (learntok.records)")
    args = ap.parse_args()
    runners = {name: Runner(**kw) for name, kw in variants(args.table).items()}
    for r in runners.values():
        r.step()  # warm-up
    times: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(args.rounds):
        for name, r in runners.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                r.step()
            times[name].append((time.perf_counter() - t0) / args.steps)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {B} x {T} bytes per step, tables of "
          f"{args.table} rows; median over {args.rounds} rounds of {args.steps} steps")
    print(f"{'variant':24s} {'parameters':>11s} {'s / step':>9s} {'vs plain':>9s}")
    result = {}
    for name in runners:
        ratio = statistics.median(a / b for a, b in zip(times[name], times["plain"]))
        result[name] = {"params": runners[name].params, "seconds": statistics.median(times[name]), "ratio": ratio}
        print(f"{name:24s} {runners[name].params:11,d} {statistics.median(times[name]):9.4f} {ratio:9.3f}")
    if args.record:
        from learntok import records

        records.append(args.record, records.make(
            "embeddings-speed", "small", 0, command="python bench/bench_embeddings.py " + " ".join(
                f"--{k} {v}" for k, v in (("rounds", args.rounds), ("steps", args.steps), ("table", args.table))),
            threads=torch.get_num_threads(), batch=[B, T], table=args.table, variants=result))


if __name__ == "__main__":
    main()
