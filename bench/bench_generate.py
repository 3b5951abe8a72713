"""Generation speed (bytes/s) on CPU: batch 1 and 8, at 1k and 4k bytes of context, cached vs recomputing
the full forward pass for every byte.

    python bench/bench_generate.py [--checkpoint RUN_OR_MODEL_DIR] [--new 64]

Without a checkpoint a freshly initialised `tiny`-shaped model is used (speed does not depend on the
weights, only the boundary rate, which the learned policy starts at its target). The prompt is fed through
the cache before timing starts; the timed part is decoding `--new` bytes per row with the cache, and
max(4, new // 8) bytes per row without it (recomputing is slow).
"""

from __future__ import annotations

import argparse
import time

import torch

from learntok.model.lm import ByteLM
from learntok.presets import tiny
from learntok.vocab import BOS


def decode_speed(model, B: int, context: int, new: int, cached: bool) -> float:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(32, 127, (B, context + new), generator=g)
    ids[:, 0] = BOS
    noise = torch.rand(B, context + new, generator=g)
    with torch.no_grad():
        if cached:
            state = model.init_state(B, noise)
            for t in range(context):
                model.step(ids[:, t], state)
            t0 = time.perf_counter()
            for t in range(context, context + new):
                model.step(ids[:, t], state)
        else:
            t0 = time.perf_counter()
            for t in range(context, context + new):
                model(ids[:, : t + 1], noise=noise[:, : t + 1])
    return B * new / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint")
    ap.add_argument("--new", type=int, default=64, help="bytes decoded per measurement")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    if args.checkpoint:
        from learntok.pretrained import from_pretrained
        model = from_pretrained(args.checkpoint)
    else:
        torch.manual_seed(0)
        model = ByteLM(tiny().model, tiny().boundary).eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; decoding {args.new} bytes per row "
          f"(recompute: {max(4, args.new // 8)})")
    print(f"{'batch':>5s} {'context':>7s} {'cached B/s':>11s} {'recompute B/s':>14s} {'speed-up':>9s}")
    for B in args.batches:
        for ctx in args.contexts:
            c = decode_speed(model, B, ctx, args.new, cached=True)
            r = decode_speed(model, B, ctx, max(4, args.new // 8), cached=False)
            print(f"{B:5d} {ctx:7d} {c:11.0f} {r:14.0f} {c / r:8.1f}x")


if __name__ == "__main__":
    main()
