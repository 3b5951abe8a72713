"""Peak GPU memory of a training step before renting a GPU: fake tensors through the real step
(learntok.train.estimate), in seconds on a laptop CPU, per micro-batch size.

    python bench/estimate_memory.py                                  # paper-147m, micro-batches 1 8 16 32
    python bench/estimate_memory.py --preset paper-147m --micro-batch 8 16 --seq-len 8192
    python bench/estimate_memory.py --preset small --micro-batch 8 --gpu-gib 24
    python bench/estimate_memory.py --micro-batch 8 --ops             # + kernels and bytes moved per step

It traces the eager step in the CUDA configuration (bf16-mixed, FlexAttention, token level bucketed at the
target rate + 25 %) and prints the live tensor bytes at their peak, which grow linearly with the micro-batch:
the slope is the activations per sequence, and `--gpu-gib` turns it into the largest micro-batch that leaves
`--headroom-gib` free for what fake tensors cannot see (CUDA context, allocator fragmentation, workspaces). A
compiled step keeps fewer activations (inductor fuses elementwise chains), so this is an eager upper bound.
Activation checkpointing is not estimated (learntok.train.estimate says why).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from learntok.presets import get_preset
from learntok.train.estimate import OpCensus, trace_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="paper-147m")
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[1, 8, 16, 32])
    ap.add_argument("--seq-len", type=int, default=0, help="override the preset's sequence length")
    ap.add_argument("--rate", type=float, default=None, help="boundary rate to size the token level for")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16-mixed", "bf16", "fp32"])
    ap.add_argument("--residual-dtype", default="fp32", choices=["fp32", "autocast"])
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="GPU memory to fit (H100: 80)")
    ap.add_argument("--headroom-gib", type=float, default=6.0, help="left free for what fake tensors miss")
    ap.add_argument("--ops", action="store_true",
                    help="also count the eager step's kernels, bytes moved and host reads (learntok.train.estimate."
                         "OpCensus) at the first micro-batch size: a machine-independent before/after measure")
    args = ap.parse_args()
    cfg = get_preset(args.preset)
    cfg = replace(cfg, precision=args.precision, model=replace(cfg.model, residual_dtype=args.residual_dtype))
    if args.seq_len:
        cfg = replace(cfg, data=replace(cfg.data, seq_len=args.seq_len))
    print(f"{args.preset}: {cfg.data.seq_len}-byte sequences, precision {args.precision} (auto = bf16-mixed), "
          f"residual stream {args.residual_dtype}")
    print("| micro-batch | token slots | weights + AdamW GiB | peak GiB | trace s |")
    print("|---|---|---|---|---|")
    rows, sizes = [], sorted(args.micro_batch)
    for b in sizes:
        t0 = time.perf_counter()
        r = trace_step(cfg, b, rate=args.rate)
        rows.append((b, r.peak_gib))
        print(f"| {b} | {r.token_slots} | {r.steady_gib:.2f} | {r.peak_gib:.2f} | {time.perf_counter() - t0:.1f} |",
              flush=True)
    if args.ops:
        census = OpCensus()
        trace_step(cfg, sizes[0], rate=args.rate, census=census)
        print(f"\none eager step's forward + backward at micro-batch {sizes[0]}: "
              f"{sum(census.kernels.values())} kernels, {sum(census.bytes.values()) / 1e9:.1f} GB read + written, "
              f"host reads {census.host_reads or 'none'}")
        print("| kind | kernels | GB |\n|---|---|---|")
        for kind in sorted(census.kernels):
            print(f"| {kind} | {census.kernels[kind]} | {census.bytes[kind] / 1e9:.1f} |")
    if len(rows) >= 2:
        (b0, p0), (b1, p1) = rows[0], rows[-1]
        per_seq = (p1 - p0) / (b1 - b0)
        fixed = p0 - per_seq * b0
        fits = int((args.gpu_gib - args.headroom_gib - fixed) // per_seq)
        print(f"\nper sequence {per_seq:.2f} GiB, fixed {fixed:.2f} GiB: the largest micro-batch that leaves "
              f"{args.headroom_gib:g} GiB of {args.gpu_gib:g} free is {max(fits, 0)} (estimate)")


if __name__ == "__main__":
    main()
