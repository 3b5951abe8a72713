"""The planted-boundary benchmark: text whose optimal segmentation and best achievable bits per byte are known
(learntok.data.planted), every strategy at equal training FLOPs, seeds, one training at a time.

    python experiments/planted/run.py make --out runs/planted/data-sep                  # separators between words
    python experiments/planted/run.py make --out runs/planted/data-nosep --no-separator
    python experiments/planted/run.py run --data runs/planted/data-sep --out runs/planted/sep --seeds 0 1

Each arm is `learntok train --preset small --target-rate 1/(mean word bytes)` plus its own flags, for the bytes
that give every arm the same training FLOPs by the paper's accounting (6 x matrix parameters per byte at the byte
level, per token at the token level, at the target rate): arms whose strategy has more parameters see fewer
bytes. Evaluation: bits per byte on the first 256 KB of the validation and test splits (one boundary sample, the
paper's protocol), minus the floor (the language's entropy rate plus the first word's entropy, per document,
which the split's own floor in planted.json counts), and precision / recall / F1 of the boundaries
against the planted ones (the last byte of every word). Every finished arm is a record (learntok.records) in
OUT/records.jsonl or `--results FILE`; `run` skips the arms a file already holds, and writes OUT/results.md.

`run` also screens arms on real text (a data directory without planted.json, e.g. enwiki): the floor is then 0
and the reference boundaries are SpaceByte's word boundaries.

    python experiments/planted/run.py run --data DATA/enwiki --out runs/planted/enwiki --bytes 6e6 \
        --arms learned learned-norm learned-D16 learned-D16-norm uniform --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import arms  # noqa: E402  (experiments/arms.py: the arms, FLOPs matching, evaluation, paired statistics)

PLANTED_ARMS = ["learned", "learned-norm", "learned-D16", "learned-D16-norm", "uniform", "uniform-random",
                "whitespace", "hnet", "dynamic"]


def cmd_make(args) -> None:
    from learntok.data.planted import PlantedLanguage, PlantedSpec

    lang = PlantedLanguage(PlantedSpec(separator=args.separator, vocab=args.vocab, seed=args.seed))
    out = lang.write(args.out, train_bytes=args.train_mb * 1e6, val_bytes=5e5, test_bytes=5e5)
    info = json.loads((out / "planted.json").read_text())
    print(f"wrote {out}: entropy rate {info['entropy_rate']:.4f} bits/byte, {info['mean_word_bytes']:.2f} bytes "
          f"per word (planted rate {1 / info['mean_word_bytes']:.3f})")


REAL_TEXT = {"entropy_rate": 0.0, "mean_word_bytes": 5.0, "spec": {"separator": True}, "real_text": True}
"""What `run` assumes of a data directory without planted.json: no floor, target rate 0.2, SpaceByte words."""


def cmd_run(args) -> None:
    data, out = Path(args.data), Path(args.out)
    planted = data / "planted.json"
    info = json.loads(planted.read_text()) if planted.exists() else REAL_TEXT
    if planted.exists():
        from learntok.data.planted import PlantedLanguage

        reference = PlantedLanguage.load(data).boundaries
    else:
        reference = arms.spacebyte
    results = arms.run_arms(out, data, args.arms, args.seeds, study=args.study, rate=1.0 / info["mean_word_bytes"],
                            budget_bytes=args.bytes, reference=reference, results_path=args.results or None,
                            skip=lambda name: name.startswith("whitespace") and not info["spec"]["separator"],
                            extra={"planted": info})
    (out / "results.md").write_text(table(results) + "\n")
    print(table(results))


def table(results: dict, speed: bool = True) -> str:
    """The arms' table; on a planted language BPB is shown minus the windowed floor (the Bayes-optimal loss on the
    very windows scored), with both floors named in the heading."""
    info = results["arms"][0]["planted"]
    if info.get("real_text"):
        head, ref, floor = "Real text (no floor; reference: SpaceByte's word boundaries).", "SpaceByte", None
    else:
        fl = info["floor"]
        head = (f"Planted language: entropy rate {info['entropy_rate']:.4f} bits/byte; stationary floor (each "
                f"document read from its start) test {fl['test']:.4f}, validation {fl['valid']:.4f}")
        floor = {"test": fl["test"], "val": fl["valid"]}
        if "windowed" in fl:
            w = fl["windowed"]
            head += (f"; windowed floor (the Bayes-optimal loss on the scored {w['seq_len']}-byte windows, which start "
                     f"without context) test {w['test']:.4f}, validation {w['valid']:.4f}, subtracted below")
            floor = {"test": w["test"], "val": w["valid"]}
        head += (f"; {info['mean_word_bytes']:.2f} bytes per word, separators {info['spec']['separator']}; BPB on "
                 "256 KB of each split.")
        ref = "planted"
    return head + "\n\n" + arms.table(results, floor=floor, reference_name=ref, speed=speed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write a planted-language data directory")
    mk.add_argument("--out", required=True)
    mk.add_argument("--separator", action=argparse.BooleanOptionalAction, default=True)
    mk.add_argument("--vocab", type=int, default=512)
    mk.add_argument("--train-mb", type=float, default=20.0)
    mk.add_argument("--seed", type=int, default=0)
    rn = sub.add_parser("run", help="train and evaluate the arms (resumable)")
    rn.add_argument("--data", required=True)
    rn.add_argument("--out", required=True)
    rn.add_argument("--seeds", type=int, nargs="+", default=[0])
    rn.add_argument("--arms", nargs="+", default=PLANTED_ARMS, choices=list(arms.ARMS))
    rn.add_argument("--bytes", type=float, default=3e6, help="training bytes of the uniform arm (sets the FLOPs)")
    rn.add_argument("--results", default="", help="the records file (default OUT/records.jsonl): finished arms are "
                    "kept there and skipped; a file under version control outlives the run directories")
    rn.add_argument("--study", default="planted", help="the records' study name (e.g. planted-sep, planted-nosep)")
    args = ap.parse_args()
    {"make": cmd_make, "run": cmd_run}[args.cmd](args)


if __name__ == "__main__":
    main()
