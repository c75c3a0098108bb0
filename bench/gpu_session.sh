#!/usr/bin/env bash
# One device session on the lent GPU (docs/PERF.md): set up, then run the named stages, logging
# each to $OUT/<stage>.log (JSON results beside). Stages:
#   env         the GPU, torch/Triton versions, pto info
#   tests       tests/gpu/test_gpu.py (the compiled kernels, both executors)
#   fused       pto bench llama7b, fused layer, both executors, eager and torch.compile ($SEQS)
#   modes       pto bench llama7b --attention split and pair, both executors, eager ($MODE_SEQS)
#   odd         pto bench llama7b, fused, odd lengths ($ODD_SEQS)
#   profile     pto run --profile of the fused layer at 16K, both executors
# e.g.  SEQS=1024,4096 bench/gpu_session.sh env tests fused
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARNING
[ -d /tmp/site/cffi ] || exit 1
export PYTHONPATH=/tmp/site:$PWD PTO_CACHE_DIR=${PTO_CACHE_DIR:-/tmp/ptocache} PYTHONUNBUFFERED=1
BENCH="python3 -m pto.cli bench llama7b --config 7b --dtype bf16 --iterations ${ITER:-20}"
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    env) { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
           python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
           python3 -m pto.cli info; } 2>&1 | tee "$OUT/env.log" ;;
    tests) python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_gpu.py tests/target/test_target.py 2>&1 \
           | tee "$OUT/tests.log" | tail -20 ;;
    fused) $BENCH --seq "${SEQS:-1024,4096,16384}" --executor waves,persistent --json "$OUT/fused.json" 2>&1 \
           | tee "$OUT/fused.log" | tail -12 ;;
    modes) for a in pair split; do
             $BENCH --seq "${MODE_SEQS:-4096,16384}" --attention $a --executor waves,persistent --compare eager \
               --json "$OUT/modes_$a.json" 2>&1 | tee "$OUT/modes_$a.log" | tail -6
           done ;;
    odd) $BENCH --seq "${ODD_SEQS:-777,3000,12345}" --executor waves,persistent --compare eager \
           --json "$OUT/odd.json" 2>&1 | tee "$OUT/odd.log" | tail -8 ;;
    profile) for e in waves persistent; do
               python3 -m pto.cli run llama7b --config 7b --seq ${PROFILE_SEQ:-16384} --executor $e --profile \
                 --json 2>&1 | tee "$OUT/profile_$e.json" | tail -3
             done ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "=== done $(date +%T)"
