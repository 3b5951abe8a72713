"""Data at scale: `learntok prepare` throughput, batches per second from prepared shards, and peak memory of a
short training run on a 1 GB prepared corpus against a 10 MB one (and against reading the sources into memory).

    python bench/bench_data.py --enwiki DATA/enwiki                 # ~4 minutes on 2 cores, ~3 GB of disk in --work

The 1 GB corpus is English Wikipedia's training split repeated (each copy's documents get a copy number so no
two documents are identical); it is built in --work (default: a temporary directory) and deleted afterwards.
Every training run is a fresh process: `learntok train --preset tiny --max-steps 50 --eval-every 0
--ckpt-every 0`, and its peak resident memory is the operating system's (getrusage of the child).
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from learntok.config import DataConfig
from learntok.data import BatchIterator, ByteSequences, Prepared, iter_documents, prepare


def write_corpus(enwiki: Path, out: Path, target_bytes: float) -> int:
    """A train/valid JSONL directory of ~target_bytes: enwiki's train documents, repeated with a copy number."""
    out.mkdir(parents=True)
    docs = [d.decode() for _, d in iter_documents(str(enwiki / "train.jsonl.xz"))]
    total, copy = 0, 0
    with open(out / "train.jsonl", "w") as f:
        while total < target_bytes:
            for d in docs:
                text = f"[{copy}] {d}"
                f.write(json.dumps({"text": text}) + "\n")
                total += len(text.encode())
                if total >= target_bytes:
                    break
            copy += 1
    shutil.copy(enwiki / "valid.jsonl.xz", out / "valid.jsonl.xz")
    return total


_MEASURE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_mb(cmd: list[str]) -> tuple[float, float]:
    """(peak resident memory in MB of `cmd`'s process, wall seconds), measured by a fresh parent process so that
    each command's peak is its own."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--enwiki", required=True, help="directory with enwiki train.jsonl.xz and valid.jsonl.xz")
    ap.add_argument("--work", default=None, help="scratch directory (default: a new temporary one)")
    ap.add_argument("--big", type=float, default=1e9, help="bytes of the large corpus")
    ap.add_argument("--small", type=float, default=1e7, help="bytes of the small corpus")
    ap.add_argument("--batches", type=int, default=300, help="batches timed per batch-throughput row")
    args = ap.parse_args()
    enwiki = Path(args.enwiki)
    work = Path(args.work or tempfile.mkdtemp(prefix="learntok-bench-data-"))
    learntok = [sys.executable, "-m", "learntok"]
    results: dict = {}
    try:
        # 1. prepare throughput on the real 50 MB training split, against the xz decoder alone
        src = enwiki / "train.jsonl.xz"
        t0, raw = time.perf_counter(), 0
        with lzma.open(src, "rb") as f:
            while chunk := f.read(1 << 20):
                raw += len(chunk)
        xz_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepare(DataConfig(source=str(enwiki)), work / "enwiki", progress=False, log=lambda _s: None)
        prep_s = time.perf_counter() - t0
        text = Prepared.open(work / "enwiki").manifest["splits"]
        text_bytes = sum(s["bytes"] for s in text.values())
        results["prepare"] = {"jsonl_bytes": raw, "text_bytes": text_bytes, "seconds": prep_s, "xz_seconds": xz_s}
        print(f"prepare enwiki (train {raw / 1e6:.1f} MB of JSONL, all splits {text_bytes / 1e6:.1f} MB of text): "
              f"{prep_s:.2f} s = {raw / 1e6 / prep_s:.1f} MB/s of JSONL; the xz decoder alone: "
              f"{raw / 1e6 / xz_s:.1f} MB/s ({xz_s:.2f} s)")

        # 2. batches from prepared shards
        train = Prepared.open(work / "enwiki").split("train")
        print(f"{'seq_len':>7s} {'batch':>5s} {'MB/s':>8s}")
        for seq_len, batch in ((512, 8), (4096, 16), (4096, 128)):
            it = BatchIterator(ByteSequences(train, seq_len), batch, seed=0)
            it.next_with_flags()
            t0 = time.perf_counter()
            for _ in range(args.batches):
                it.next_with_flags()
            mbs = args.batches * batch * seq_len / 1e6 / (time.perf_counter() - t0)
            results[f"batches_{seq_len}x{batch}"] = mbs
            print(f"{seq_len:7d} {batch:5d} {mbs:8.1f}")

        # 3. peak memory of 50 training steps: 10 MB vs 1 GB, prepared vs read into memory
        small, big = work / "small_src", work / "big_src"
        write_corpus(enwiki, small, args.small)
        write_corpus(enwiki, big, args.big)
        for name in ("small", "big"):
            prepare(DataConfig(source=str(work / f"{name}_src")), work / f"{name}_prep", progress=False,
                    log=lambda _s: None)
        train = [*learntok, "train", "--preset", "tiny", "--max-steps", "50", "--eval-every", "0", "--ckpt-every",
                 "0", "--no-progress", "--overwrite"]
        print(f"{'corpus':26s} {'peak RSS MB':>12s} {'wall s':>7s}")
        for label, data in (("10 MB prepared", "small_prep"), ("1 GB prepared", "big_prep"),
                            ("10 MB read into memory", "small_src"), ("1 GB read into memory", "big_src")):
            rss, wall = peak_rss_mb([*train, "--data", str(work / data), "--out", str(work / f"run_{data}")])
            results[f"rss_{data}"] = {"peak_mb": rss, "wall_s": wall}
            print(f"{label:26s} {rss:12.0f} {wall:7.1f}")
        ratio = results["rss_big_prep"]["peak_mb"] / results["rss_small_prep"]["peak_mb"]
        print(f"peak RSS, 1 GB / 10 MB prepared: {ratio:.3f}")
        (work / "results.json").write_text(json.dumps(results, indent=1))
        print(json.dumps({k: v for k, v in results.items()}, default=float))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
