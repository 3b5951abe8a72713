"""Segmenting speed on CPU: learntok's learned tokenizer against a Hugging Face `tokenizers` byte-level BPE (Rust)
on the same text.

    python bench/bench_segment.py [--model enwiki-small] [--mb 10] [--batch-size 64] [--threads 2]

The text is the first --mb MB of English Wikipedia's train split (../shared/data/text/enwiki, documents whole);
the BPE (4,096 tokens, as the `bpe-lm` baseline) is trained on the 5 MB after it, outside the timing. Each side
encodes the whole text as a batch of documents (`LearnedTokenizer.encode_batch`, windows of all documents run
--batch-size at a time through the encoder and the policy; `Tokenizer.encode_batch`, parallel over documents),
best of --repeat runs. Prints bytes/s of each and their ratio; both use --threads cores. --record FILE appends the
result as a record (bench/records-segment.jsonl holds the figures docs/tokenizer.md shows).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "text" / "enwiki" / "train.jsonl.xz"


def documents(path: Path, skip: int, n: int) -> list[str]:
    """Whole documents after the first `skip` bytes, until at least n bytes."""
    out, seen, total = [], 0, 0
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            size = len(text.encode())
            seen += size
            if seen <= skip:
                continue
            out.append(text)
            total += size
            if total >= n:
                break
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="enwiki-small", help="any model learntok loads (default: the bundled one)")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="the learned tokenizer under bfloat16 autocast")
    ap.add_argument("--record", type=Path, default=None, help="append the result as a record (learntok.records)")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its thread pool
    import torch
    from tokenizers import ByteLevelBPETokenizer

    from learntok.tokenizer import LearnedTokenizer

    torch.set_num_threads(args.threads)
    n = int(args.mb * 1e6)
    docs = documents(args.data, 0, n)
    nbytes = sum(len(d.encode()) for d in docs)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(documents(args.data, nbytes, 5_000_000), vocab_size=4096, show_progress=False)
    tok = LearnedTokenizer.from_pretrained(args.model, greedy=args.greedy, batch_size=args.batch_size,
                                           precision="bf16" if args.bf16 else "fp32")
    t_bpe = best(lambda: bpe.encode_batch(docs), args.repeat)
    t_learned = best(lambda: tok.encode_batch(docs), args.repeat)
    n_bpe = sum(len(e.ids) for e in bpe.encode_batch(docs))
    n_learned = sum(len(e) for e in tok.encode_batch(docs))
    print(f"text: {nbytes / 1e6:.2f} MB, {len(docs)} documents; {args.threads} thread(s); torch "
          f"{torch.__version__}; best of {args.repeat}")
    print(f"tokenizers byte-level BPE (4096):  {nbytes / t_bpe / 1e6:8.2f} MB/s  ({nbytes / n_bpe:.2f} bytes/token)")
    print(f"learntok {args.model} ({'greedy' if args.greedy else 'sampled'}, batch {args.batch_size}, "
          f"{tok.precision}): "
          f"{nbytes / t_learned / 1e6:8.2f} MB/s  ({nbytes / n_learned:.2f} bytes/token)")
    print(f"ratio (BPE / learned time): {t_learned / t_bpe:.1f}x")
    if args.record:
        import sys

        from learntok import records

        rec = records.make("segment-speed", args.model, 0, prov=records.provenance(),
                           command="python bench/bench_segment.py " + " ".join(sys.argv[1:]),
                           bytes=nbytes, documents=len(docs), threads=args.threads, batch_size=args.batch_size,
                           greedy=args.greedy, repeat=args.repeat, precision=tok.precision,
                           bpe={"seconds": t_bpe, "tokens": n_bpe}, learned={"seconds": t_learned, "tokens": n_learned})
        records.append(args.record, rec)


if __name__ == "__main__":
    main()
