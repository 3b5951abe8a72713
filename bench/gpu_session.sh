#!/usr/bin/env bash
# The GPU runbook: what to run when a machine with an NVIDIA GPU is lent for a short while (here 15
# minutes of machine time, start-up included, at most 10 minutes a command). Five stages of at most 8 minutes,
# every part of them under its own `timeout`, each compiling and measuring in one process and leaving a few files
# under $OUT (bench/results/gpu-session when OUT is unset); bench/README.md lists them, docs/gpu.md says what
# the figures mean.
#
#   bench/gpu_session.sh wheels   # here, once, where pip reaches PyPI: .whl/ (tyro & co. for Python 3.12)
#   bench/gpu_session.sh smoke    # the core checks of tests/test_gpu.py (one host sync, compiled training, ...)
#   bench/gpu_session.sh bench    # compiled paper-147m, learned vs uniform: bytes/s, MFU, ratio, kernels, recompiles
#   bench/gpu_session.sh memory   # one compiled paper-147m learned step at micro-batch 8 and 16: time, peak memory
#   bench/gpu_session.sh eager    # eager paper-147m rows and peak memory at 8 and 16; the remaining CUDA tests
#   bench/gpu_session.sh flex     # the byte level's FlexAttention at other block sizes: time, agreement
#
# Sizes from the GPU runs (H200, torch 2.11, 2026-11-28 to -30): inductor takes 40-80 s per paper-147m graph,
# and each replayed step of a learned runner lands in its own token bucket (the policy's rate moves fast in the
# first updates), so a stage affords about one graph per minute: --steps 1 in memory, 2 in bench. A fresh machine
# started in about 30 s; smoke took 86 s, bench 350-400 s, eager 226 s, so a 15-minute loan runs smoke and bench (the checks
# and speed that change with the code), then memory or eager if time is left; run them back to back (the
# machine stays warm 30 s after a call). The machine needs no network: the script runs from the
# checkout (PYTHONPATH=src) with the machine's own PyTorch (torch 2.11 on Python 3.12 there, not this project's
# pin), and the pure-Python packages its image lacks come from .whl/ when that folder is there.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?"usage: bench/gpu_session.sh wheels|smoke|bench|memory|eager|flex"}
out=${OUT:-bench/results/gpu-session}
PY=${PYTHON:-python3}

if [ "$stage" = wheels ]; then
    # What learntok imports that a PyTorch image usually lacks (the versions this project is tested with).
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 zstandard==0.25.0
fi
case $stage in
smoke | bench | memory | eager | flex) ;;
*) echo "unknown stage: $stage (wheels, smoke, bench, memory, eager, flex)" >&2; exit 2 ;;
esac

mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/learntok-site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/learntok-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# The checks of tests/test_gpu.py that smoke runs (pytest -k), with RMSNorm's gradients under torch.compile
# from tests/test_model.py (torch 2.11 once gave zeros there); eager runs the others and tests/test_flex.py.
CORE="waits_for_the_device_once or flex_backend_trains or no_graph_break or sampling_and_segmenting"
CORE="$CORE or rmsnorm_gradients_are_the_same_under_torch_compile"
CORE="$CORE or two_level_model_trains"
# Each test's own limit comes with --timeout (pytest-timeout) and 4 workers (pytest-xdist), both in the GPU
# image (KINDS.md of the device tool; carry them as wheels elsewhere); compilation is CPU-bound; -v prints each outcome as
# it comes (a part cut off keeps them), -rA the output of passing tests too (loss curves, sync sites).
PYTEST=("$PY" -m pytest -p no:cacheprovider -o addopts= -n 4 -v -rA --durations=10)
# The benchmarks run with TORCH_LOGS=recompiles,graph_breaks: dynamo says why it recompiles and where a graph
# breaks; the stage's log keeps it, and $stage-recompiles.log those lines alone between bench_gpu.py's markers of
# warm-up and timing.

provenance() {
    nvidia-smi --format=csv --query-gpu=name,driver_version,memory.total,power.limit,\
clocks.current.sm,clocks.current.memory,clocks.max.sm,clocks.max.memory
    "$PY" -c 'import platform, torch; from importlib.metadata import version
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", version("triton"), "cuda available", torch.cuda.is_available())'
}

case $stage in
smoke)
    (
        provenance
        timeout -k 10 120 "${PYTEST[@]}" --timeout=100 --junitxml="$out/smoke-tests.xml" \
            tests/test_gpu.py tests/test_model.py -k "$CORE"
    ) 2>&1 | tee "$out/smoke.log"
    ;;
memory)
    (
        provenance
        TORCH_LOGS=recompiles,graph_breaks timeout -k 10 320 "$PY" bench/bench_gpu.py --configs paper-147m \
            --token-bucket 128 --modes compiled --rounds 0 --steps 1 --warmup 1 --micro-batches 8 16 \
            --out "$out/memory"
    ) 2>&1 | tee "$out/memory.log"
    ;;
bench)
    (
        provenance
        TORCH_LOGS=recompiles,graph_breaks timeout -k 10 450 "$PY" bench/bench_gpu.py --configs paper-147m \
            --token-bucket 128 --modes compiled --rounds 10 --steps 2 --warmup 2 --profile 30 --out "$out/bench"
    ) 2>&1 | tee "$out/bench.log"
    ;;
eager)
    (
        rc=0
        provenance
        TORCH_LOGS=recompiles,graph_breaks timeout -k 10 230 "$PY" bench/bench_gpu.py --configs paper-147m \
            --token-bucket 128 --modes eager --rounds 5 --steps 3 --warmup 1 --micro-batches 8 16 --profile 30 \
            --out "$out/eager" || rc=$?
        timeout -k 10 210 "${PYTEST[@]}" --timeout=180 --junitxml="$out/eager-tests.xml" \
            tests/test_gpu.py tests/test_flex.py -k "not ($CORE)" || rc=$?
        exit $rc
    ) 2>&1 | tee "$out/eager.log"
    ;;
flex)
    (
        provenance
        TORCH_LOGS=recompiles timeout -k 10 430 "$PY" bench/bench_flex_blocks.py --out "$out/flex"
    ) 2>&1 | tee "$out/flex.log"
    ;;
esac
status=$?  # non-zero when any part of the stage failed or hit its limit
grep -E "__recompiles|__graph_breaks|recompile_limit|^\[bench_gpu\]" "$out/$stage.log" >"$out/$stage-recompiles.log"
exit $status
