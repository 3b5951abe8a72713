"""Does the byte level's sliding-window FlexAttention compute scores it throws away? Block sizes against time.

FlexAttention skips whole blocks of the score matrix that its block mask marks empty and computes every other block
in full. learntok builds its masks with PyTorch's default 128 x 128 blocks (`learntok.nn.attention`); with
paper-147m's byte window of 64, a block of 128 queries needs two blocks of 128 keys, so the kernel computes about 4
scores for each one a query may see (docs/gpu.md, "Not measured yet"). Smaller blocks skip more, but a kernel's tile
must divide its block, and small tiles run slower. Inductor's default tiles on an H100/H200 (128 queries x 128 keys
forward, a backward configuration that needs both block sizes to be multiples of 128) refuse smaller blocks, so
those run under max-autotune, which searches smaller tiles too; 128 x 128 runs both ways, so that the comparison
is not between tuned and untuned kernels. This measures the trade on a GPU: for each variant, the byte level's
attention at paper-147m's shape (micro-batch 8, 12 heads, 4,096 bytes, head size 64, soft-capped, bf16) compiled,
forward and backward timed with CUDA events, output and gradients checked against the first variant. It prints a
table and writes OUT/flex_blocks.json after every variant (a stage cut off keeps what it measured); a variant the
kernel refuses is reported with its error. Without CUDA it prints the scores each block pair computes and exits 2.

    PYTHONPATH=src python bench/bench_flex_blocks.py --out bench/results/gpu-session
    PYTHONPATH=src python bench/bench_flex_blocks.py --variants 128x128 64x64:autotune --window 64 --seq 4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

DEFAULT_VARIANTS = ("128x128", "64x64:autotune", "128x128:autotune", "128x64:autotune", "32x32:autotune")
"""Today's kernel first (the reference), then the most likely gain, then the tuned reference, then the rest."""


def parse_block(text: str) -> tuple[int, int]:
    """'QxK' -> (query block, key block)."""
    try:
        q, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a block pair is QxK, e.g. 128x64, got {text!r}") from None
    if q < 16 or k < 16 or q & (q - 1) or k & (k - 1):
        raise argparse.ArgumentTypeError(f"block sizes must be powers of two >= 16, got {text!r}")
    return q, k


def parse_variant(text: str) -> tuple[tuple[int, int], bool]:
    """'QxK' or 'QxK:autotune' -> (block pair, compiled under max-autotune)."""
    block, _, mode = text.partition(":")
    if mode not in ("", "autotune"):
        raise argparse.ArgumentTypeError(f"a variant is QxK or QxK:autotune, got {text!r}")
    return parse_block(block), mode == "autotune"


def _reason(e: BaseException) -> str:
    """The innermost cause's last non-empty line (compile errors wrap the kernel's own message)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def sliding_mask(T: int, window: int, block: tuple[int, int], device: str):
    """The byte level's causal sliding-window block mask over T positions (learntok's own) in `block` = (query,
    key) blocks."""
    from learntok.nn.attention import _flex_block_mask

    return _flex_block_mask(T, window, torch.device(device), block)


def scores_computed(T: int, window: int, block: tuple[int, int]) -> float:
    """Scores the kernel computes (every block the mask does not skip, in full) per score a query may see."""
    mask = sliding_mask(T, window, block, "cpu")
    blocks = int(mask.kv_num_blocks.sum()) + (int(mask.full_kv_num_blocks.sum())
                                              if mask.full_kv_num_blocks is not None else 0)
    visible = sum(min(t + 1, window) for t in range(T))
    return blocks * block[0] * block[1] / visible


def measure(block, autotune: bool, shape, window: int, cap: float, iters: int, reference=None) -> dict:
    """Time one block pair's forward + backward (median ms of `iters`, after two untimed calls), compiled as
    learntok compiles it or under max-autotune, and compare its output and gradients with `reference` (the first
    variant's (out, grads))."""
    from torch.nn.attention.flex_attention import flex_attention

    from learntok.nn.attention import _flex_compiled, _softcap_mod

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    grad = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    mask = sliding_mask(shape[2], window, block, "cuda")
    flex = (torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs") if autotune
            else _flex_compiled())
    score_mod = _softcap_mod(cap) if cap > 0 else None

    def step():
        q.grad = k.grad = v.grad = None
        out = flex(q, k, v, score_mod=score_mod, block_mask=mask)
        out.backward(grad)
        return out

    out = step()
    step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    result = {"ms": statistics.median(times), "ms_min": min(times)}
    mine = (out.detach(), *(t.grad.detach() for t in (q, k, v)))
    if reference is not None:
        result["max_abs_diff"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(mine, reference))
    return result | {"_tensors": mine}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", type=parse_variant, nargs="+",
                    default=[parse_variant(v) for v in DEFAULT_VARIANTS],
                    help="QxK block pairs, :autotune to compile under max-autotune; the first is the reference "
                         f"(default: {' '.join(DEFAULT_VARIANTS)})")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--cap", type=float, default=50.0, help="attention soft-cap (the models' default)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", help="directory for flex_blocks.json")
    a = ap.parse_args(argv)
    rows = [{"block": f"{q}x{k}", "autotune": tuned, "scores_per_visible": scores_computed(a.seq, a.window, (q, k))}
            for (q, k), tuned in a.variants]
    if not torch.cuda.is_available():
        pairs = dict.fromkeys((r["block"], r["scores_per_visible"]) for r in rows)  # each pair once
        print("\n".join(f"{b}: computes {n:.2f} scores per visible score" for b, n in pairs))
        print("bench_flex_blocks.py: no CUDA device: the timings need a GPU (FlexAttention's fused kernels)",
              file=sys.stderr)
        return 2
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    meta = {"shape": shape, "window": a.window, "cap": a.cap, "iters": a.iters, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(), "command": " ".join(sys.argv)}
    reference = None
    for row, (block, tuned) in zip(rows, a.variants):
        t0 = time.perf_counter()
        try:
            got = measure(block, tuned, shape, a.window, a.cap, a.iters, reference)
        except Exception as e:  # a kernel that refuses the pair is a result, not a crash
            row["error"] = _reason(e)
        else:
            tensors = got.pop("_tensors")
            reference = reference if reference is not None else tensors
            row.update(got)
        row["seconds"] = time.perf_counter() - t0  # compilation (and autotuning) included
        print(json.dumps(row), flush=True)
        if a.out:  # after every variant: a stage cut off by its time limit keeps what it measured
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "flex_blocks.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    base = rows[0].get("ms")
    print(f"\nbyte-level attention, {shape} bf16, window {a.window}, cap {a.cap:g}, forward + backward, "
          f"median of {a.iters}:\n\n| blocks (q x k) | scores per visible | ms | vs {rows[0]['block']} | max |diff| |")
    print("|---|---|---|---|---|")
    for r in rows:
        name = r["block"] + (", autotuned" if r["autotune"] else "")
        if "error" in r:
            print(f"| {name} | {r['scores_per_visible']:.2f} | {r['error']} | | |")
            continue
        ratio = f"{r['ms'] / base:.3f}" if base else ""
        print(f"| {name} | {r['scores_per_visible']:.2f} | {r['ms']:.3f} | {ratio} | "
              f"{r.get('max_abs_diff', 0.0):.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
