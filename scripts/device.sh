#!/usr/bin/env bash
# scripts/device.sh [RESULTS_DIR] — the GPU suite, straight from the work tree (no installs):
# `pytest -m gpu`, then every benchmark, writing logs and CSVs to RESULTS_DIR (default results/).
# Env: OPS="topk sparse_attn moe" picks the benchmarks; TESTS=0 / BENCH=0 skip a part;
# BENCH_ARGS="--quick" is passed to every benchmark; DSV4_COMMIT names the commit in the CSV rows
# when the tree has no .git (a copied work tree).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$out/env.txt"
import subprocess, torch, triton
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
print(subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout)
PY
status=0
if [ "${TESTS:-1}" != 0 ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log"
  status=${PIPESTATUS[0]}
fi
if [ "${BENCH:-1}" != 0 ]; then
  for op in ${OPS:-topk sparse_attn moe}; do
    echo "=== bench $op" | tee -a "$out/bench.log"
    python3 -m dsv4_decode.cli bench "$op" --out "$out" ${BENCH_ARGS:-} 2>&1 | tee -a "$out/bench.log"
  done
fi
exit "$status"
