#!/usr/bin/env bash
# One device session on the lent GPU (see docs/PERF.md): set up, then run the named stages,
# logging each to $OUT/<stage>.log. Stages: env tests layer modes tune.
#   bench/gpu_session.sh env tests layer
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING; [ -d /tmp/site/cffi ] || exit 1
export PYTHONPATH=/tmp/site:$PWD PTO_CACHE_DIR=/tmp/ptocache PYTHONUNBUFFERED=1
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    env) { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
           python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
           python3 -m pto.cli info; } 2>&1 | tee "$OUT/env.log" ;;
    tests) python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/tests.log" | tail -20 ;;
    triton-tests) TRITON_INTERPRET=1 python3 -m pytest -q -p no:cacheprovider tests/test_triton_backend.py 2>&1 \
           | tee "$OUT/triton_tests.log" | tail -20 ;;
    layer) python3 bench/llama_layer.py --seq "${SEQS:-1024,4096,8192,16384}" --repeat 20 \
           --json "$OUT/layer.json" 2>&1 | tee "$OUT/layer.log" | tail -20 ;;
    modes) python3 bench/llama_layer.py --check-modes --seq "${SEQS:-1024,4096,8192,16384}" \
           --json "$OUT/modes.json" 2>&1 | tee "$OUT/modes.log" | tail -20 ;;
    tune) python3 bench/tune_kernels.py --seq 16384 --only "${TUNE:-matmul,swiglu,flash}" \
           --json "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" | tail -40 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== done $(date +%T)"
