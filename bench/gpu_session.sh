#!/usr/bin/env bash
# The GPU runbook of issue 16: what to run when a machine with an NVIDIA GPU is lent for a short while, split
# into stages that each end inside 10 minutes and leave their results under $OUT (bench/results/gpu-session
# when OUT is unset). docs/gpu.md says what each stage shows and what the figures should look like.
#
#   bench/gpu_session.sh wheels       # here, once, with pip and a package index: .whl/ (tyro & co. for Python 3.12)
#   bench/gpu_session.sh check        # on the GPU: tests/test_gpu.py and tests/test_flex.py, ~5 minutes
#   bench/gpu_session.sh bench-147m   # paper-147m, learned vs uniform, eager vs compiled
#   bench/gpu_session.sh bench-30m    # the ~30M config, the same four rows
#   bench/gpu_session.sh max-batch    # the largest 4096-byte micro-batch of paper-147m that trains
#
# The GPU machine needs no network: it runs from the checkout (PYTHONPATH=src) with its own PyTorch, and the
# few pure-Python packages its image lacks come from .whl/ when that folder is there.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:?"usage: bench/gpu_session.sh wheels|check|bench-147m|bench-30m|max-batch"}
out=${OUT:-bench/results/gpu-session}
PY=${PYTHON:-python3}

if [ "$stage" = wheels ]; then
    # What learntok imports that a PyTorch image usually lacks (the versions this project is tested with).
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 zstandard==0.25.0
fi

mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/learntok-site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/learntok-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} | tee "$out/env-$stage.txt"

case $stage in
check)
    # The GPU acceptance tests, then FlexAttention's (its CUDA gradient test); -v prints each outcome as it
    # comes (a stage cut off at its limit keeps them), -s the loss curves. Flex and inductor kernels compile
    # on first use: most of this stage is compilation.
    timeout 540 "$PY" -m pytest -p no:cacheprovider -o addopts= -v -s --durations=10 \
        tests/test_gpu.py tests/test_flex.py 2>&1 | tee "$out/check.log"
    ;;
bench-147m)
    timeout 570 "$PY" bench/bench_gpu.py --configs paper-147m --rounds 3 --steps 5 --warmup 5 --token-bucket 128 \
        --out "$out/147m" 2>&1 | tee "$out/bench-147m.log"
    ;;
bench-30m)
    timeout 570 "$PY" bench/bench_gpu.py --configs 30m --rounds 3 --steps 5 --warmup 5 --token-bucket 128 \
        --out "$out/30m" 2>&1 | tee "$out/bench-30m.log"
    ;;
max-batch)
    timeout 570 "$PY" bench/bench_gpu.py --configs paper-147m --modes compiled --rounds 1 --steps 2 --warmup 3 \
        --token-bucket 128 --max-batch --max-batch-limit 128 --out "$out/max-batch" 2>&1 | tee "$out/max-batch.log"
    ;;
*)
    echo "unknown stage: $stage (wheels, check, bench-147m, bench-30m, max-batch)" >&2
    exit 2
    ;;
esac
