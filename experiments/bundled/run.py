"""The model shipped inside the package (`learntok.from_pretrained("enwiki-small")`): trained and exported by
this script, which anyone can rerun.

    python experiments/bundled/run.py run --data ../shared/data/text/enwiki      # about 35 minutes on 2 cores
    python experiments/bundled/run.py stats --shared ../shared/data               # its statistics by domain

It trains the `small` preset with the headline's learned policy (`learned-w1-vb`: a one-boundary policy window
and a learned value baseline; docs/results.md) on English Wikipedia's train split (2.4e7 bytes), evaluates it
(`learntok eval RUN --tasks none`: held-out BPB on the test split, boundary statistics), exports it into
src/learntok/models/enwiki-small/ (weights, config, model card, the transformers files) and appends a record
to experiments/bundled/records.jsonl. An interrupted run resumes (`--resume`) when started again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from learntok import records
from learntok.viz.curves import load_metrics

RECORDS = Path(__file__).with_name("records.jsonl")
TARGET = Path(__file__).resolve().parents[2] / "src" / "learntok" / "models" / "enwiki-small"
FLAGS = ["--preset", "small", "--policy-window", "1", "--value-baseline", "--seed", "0"]


def learntok(args: list[str]) -> None:
    print("learntok " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "learntok", *args], check=True)


def run(data: Path, out: Path, threads: int | None) -> None:
    more = ["--threads", str(threads)] if threads else []
    if (out / "config.json").exists():
        learntok(["train", "--resume", str(out), "--progress-style", "lines", *more])
    else:
        learntok(["train", *FLAGS, "--data", str(data), "--out", str(out), "--progress-style", "lines", *more])
    learntok(["eval", str(out), "--tasks", "none"])
    if TARGET.exists():
        shutil.rmtree(TARGET)
    learntok(["export", str(out), str(TARGET)])
    card = TARGET / "README.md"  # the card's usage lines name the model as it is loaded: by its bundled name
    card.write_text(card.read_text().replace("USER/NAME", "enwiki-small"))
    val = load_metrics(out).evals[-1]
    ev = json.loads((out / "eval.json").read_text())
    config, prov = records.run_provenance(out)
    rec = records.make("bundled", "enwiki-small", 0, prov=prov, config=config,
                       command=f"learntok train {' '.join(FLAGS)} --data {data} --out {out}",
                       bytes=val["bytes"], train_seconds=val["time"],
                       val={"bpb": val["val/bpb"], "rate": val["val/rate"]},
                       heldout={k: ev["heldout"][k] for k in ("bpb", "bpb_se", "bytes", "data")},
                       boundary_stats={k: ev["boundary_stats"][k] for k in ("rate", "bytes_per_token")},
                       diagnostics=ev["diagnostics"], eval_command=f"learntok eval {out} --tasks none",
                       weights_bytes=(TARGET / "model.safetensors").stat().st_size)
    records.append(RECORDS, rec)
    print(f"val BPB {rec['val']['bpb']:.4f}, held-out {rec['heldout']['bpb']:.4f}, rate {rec['val']['rate']:.3f}; "
          f"exported to {TARGET}")


DOMAINS = {"English prose (enwiki test)": "text/enwiki/test.jsonl.xz",
           "Python code (CPython stdlib test)": "code/cpython_stdlib/test.jsonl.xz"}
STATS_BYTES = 262_144


def stats(shared: Path, model: str = "enwiki-small") -> None:
    """Segmentation statistics of the bundled model by domain (the first STATS_BYTES of each test split):
    bytes per token and its CV, whitespace agreement, and boundary stability (learntok.evaluation.stability),
    with the default sampled boundaries and greedy ones; one record (arm enwiki-small-stats)."""
    from learntok.data import head_documents, iter_documents
    from learntok.evaluation.stability import chunk_stats, stability
    from learntok.tokenizer import LearnedTokenizer

    out = {}
    for name, rel in DOMAINS.items():
        docs = head_documents((doc for _, doc in iter_documents(str(shared / rel), "text")), STATS_BYTES)
        out[name] = {"bytes": sum(map(len, docs)), "file": rel}
        for mode in ("sampled", "greedy"):
            tok = LearnedTokenizer.from_pretrained(model, greedy=mode == "greedy")
            encs = tok.encode_batch(docs)
            out[name][mode] = chunk_stats([n for e in encs for n in e.token_lengths], [e.boundaries for e in encs],
                                          docs)
        out[name]["stability"] = stability(tok.model, docs, tok.window - 1, max_bytes=65_536)
        print(f"{name}: {out[name]['sampled']['bytes_per_token']:.2f} bytes/token", flush=True)
    rec = records.make("bundled", "enwiki-small-stats", 0, prov=records.provenance(),
                       command=f"python experiments/bundled/run.py stats --shared {shared}", domains=out)
    records.append(RECORDS, rec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", type=Path, default=Path("../shared/data/text/enwiki"))
    r.add_argument("--out", type=Path, default=Path("runs/bundled/enwiki-small"))
    r.add_argument("--threads", type=int, default=None)
    st = sub.add_parser("stats")
    st.add_argument("--shared", type=Path, default=Path("../shared/data"))
    args = ap.parse_args()
    if args.cmd == "stats":
        return stats(args.shared)
    run(args.data, args.out, args.threads)


if __name__ == "__main__":
    main()
