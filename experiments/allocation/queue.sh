#!/bin/bash
# Issue 30's study from where it stands to its end, in the order it runs: one training at a time, each step
# skipping what is done (records and run directories) and resuming an interrupted run, so after an interruption,
# or on a new machine, run it again. Sweep cells are collected and final runs scored after each step, so the
# committed records lose at most the run under way. Clock steps (sweep --clock, final --clock) time themselves:
# run nothing else on the machine meanwhile. An interrupted clock cell or run trains again from step 0 (resumed in
# another sitting, its seconds would span two machine speeds), so start the queue early in a sitting when a clock
# step is next: a clock sweep takes about an hour on 2 cores.
#
#   bash experiments/allocation/queue.sh DATA/enwiki [OUT]        # PYTHON=... to pick the interpreter
set -euo pipefail
DATA=${1:?usage: queue.sh DATA/enwiki [OUT]}
OUT=${2:-runs/alloc}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")" && pwd)
run() { "$PY" "$HERE/run.py" "$@"; }
final() { run final --data "$DATA" --out "$OUT" "$@"; run evaluate --out "$OUT"; }

run restore --out "$OUT"
# 1. stage 2 with the n-gram tables (window x rate) for the methods that have it
for m in learned uniform whitespace; do
  run sweep --data "$DATA" --out "$OUT" --stage 2 --ngrams --methods "$m"
  run collect --out "$OUT"
done
run retire --out "$OUT"
# 2. the n-gram arms at matched total FLOPs (flat-ngrams and bpe-lm-ngrams have their 5 seeds)
for arm in learned-ngrams uniform-ngrams; do
  for s in 0 1 2 3 4; do final --ngrams --arms "$arm" --seeds "$s"; done
done
final --ngrams --arms whitespace-ngrams --seeds 0 1 2
# the chunk embedding's lever: learned-ngrams with the chunk table, at its allocation, paired by seed
final --ngrams --arms learned-ngrams-chunks --seeds 0 1 2
# 3. the clock sweep at stage 2's new choice, then the clock series x: each method at its wall-clock allocation,
#    a seed's arms beside each other
for m in learned uniform whitespace; do
  run sweep --data "$DATA" --out "$OUT" --clock --methods "$m"
  run collect --out "$OUT"
done
run best --out "$OUT"
for s in 0 1 2 3 4; do
  arms=(learned-ngrams flat-ngrams uniform-ngrams)
  [ "$s" -lt 3 ] && arms+=(whitespace-ngrams)
  final --ngrams --clock --series x --allocation clock --methods learned flat uniform whitespace \
    --arms "${arms[@]}" --seeds "$s"
done
# 3b. half the budget at matched total FLOPs: the arms of 4x (step 6) and whitespace, each at its x1 allocation, 3
#     seeds, a seed's five arms together. Whether learned's lead over each grows with compute: series x's clock
#     runs met this CPU at about half series w's speed, so they trained on about 0.55x the FLOPs budget, and there
#     whitespace led (docs/results.md §8)
for s in 0 1 2; do
  final --ngrams --scale 0.5 --methods learned flat bpe-lm uniform whitespace \
    --arms learned-ngrams flat-ngrams bpe-lm-ngrams uniform-ngrams whitespace-ngrams --seeds "$s"
done
# 3c. the BPE transformer on the clock at today's allocations: its clock sweep (stage 1 at matched seconds, with the
#     n-gram tables), then clock series y, learned-ngrams beside bpe-lm-ngrams, each at its wall-clock allocation,
#     5 seeds (series c, the last clock pair of these two, trained learned at a retired allocation and BPE at its
#     FLOPs one). Clock steps: run nothing else on the machine meanwhile
run sweep --data "$DATA" --out "$OUT" --clock --methods bpe-lm
run collect --out "$OUT"
for s in 0 1 2 3 4; do
  final --ngrams --clock --series y --allocation clock --methods learned bpe-lm \
    --arms learned-ngrams bpe-lm-ngrams --seeds "$s"
done
# 4. the headline's confound controls (docs/results.md §2), records in experiments/leaderboard/
"$PY" "$HERE/../leaderboard/run.py" run --data "$DATA" --out "$OUT/../leaderboard" \
  --results "$HERE/../leaderboard/records.jsonl" --bytes 2.4e7 --seeds 10 11 12 13 14 15 16 17 18 --arms uniform-ee
"$PY" "$HERE/../leaderboard/run.py" run --data "$DATA" --out "$OUT/../leaderboard" \
  --results "$HERE/../leaderboard/records.jsonl" --bytes 2.4e7 --seeds 14 15 16 17 18 --arms learned-w1-vb-padded
# 5. the other methods' n-gram arms; the accounting lever's control (matched 6N); the arms without n-grams
for s in 0 1 2; do final --ngrams --methods bpe entropy hnet --arms bpe-ngrams entropy-ngrams hnet-ngrams --seeds "$s"; done
for s in 0 1 2 3 4; do final --ngrams --convention 6n --arms learned-ngrams flat-ngrams --seeds "$s"; done
for s in 0 1 2 3 4; do
  arms=(learned uniform flat bpe-lm)
  [ "$s" -lt 3 ] && arms+=(whitespace)
  final --arms "${arms[@]}" --seeds "$s"
done
# 5b. the other strategies without n-grams (the issue's "with and without n-gram embeddings where they apply"), 3
#     seeds, at uniform's allocation like their n-gram arms; added after step 5's plain arms had begun
for s in 0 1 2; do final --arms bpe entropy hnet --seeds "$s"; done
# 6. 4x the budget at matched total FLOPs: the n-gram arms of the first three targets and whitespace, 3 seeds (the
#    scope in docs/results.md §8; whitespace added after series x, before any 4x run). One arm at a time, its record
#    collected as soon as it finishes: a run still training when a sitting ends is lost if its machine is. Seed 0 at
#    each arm's x1 allocation, then the width check: seed 0 again one width step wider, and seeds 1 and 2 at
#    whichever of the two validation preferred. The check was dropped for time before any 4x run and revived after
#    seed 0's x1 runs, whose gains from 4x ordered by the bytes each x1 shape reads per FLOP (results §8)
x4=(--ngrams --scale 4 --methods learned flat bpe-lm uniform whitespace)
x4arms=(learned-ngrams flat-ngrams bpe-lm-ngrams whitespace-ngrams uniform-ngrams)
for arm in "${x4arms[@]}"; do final "${x4[@]}" --arms "$arm" --seeds 0; done
for arm in "${x4arms[@]}"; do final "${x4[@]}" --arms "$arm" --seeds 0 --allocation wider; done
for s in 1 2; do
  for arm in "${x4arms[@]}"; do final "${x4[@]}" --arms "$arm" --seeds "$s" --allocation chosen; done
done
