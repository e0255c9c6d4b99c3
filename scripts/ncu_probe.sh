#!/usr/bin/env bash
# scripts/ncu_probe.sh OUT — Nsight Compute reports of the kernels that bound the benchmarks
# (scripts/ncu_cases.py runs each case): occupancy, issue, warp stall reasons and the SASS lines
# that stall, as text in OUT (scripts/ncu_stalls.py). Clocks are left alone (--clock-control
# none, METHOD.md).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
sections="--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
probe() {  # name kernel-regex skip count case...
  local name=$1 kre=$2 skip=$3 count=$4
  shift 4
  timeout 240 ncu --clock-control none -k "regex:$kre" --launch-skip "$skip" \
    --launch-count "$count" $sections -o "$out/$name" -f python3 scripts/ncu_cases.py "$@" \
    > "$out/$name.run.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page details > "$out/$name.details.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/$name.sass.csv" 2>&1
  rm -f "$out/$name.ncu-rep"
  # the 1 MB source CSV as text (stall reasons, mix, hot lines); the CSV stays if that fails or
  # with KEEP_CSV=1
  if python3 scripts/ncu_stalls.py "$out/$name.sass.csv" && [ "${KEEP_CSV:-0}" != 1 ]; then
    rm -f "$out/$name.sass.csv"
  fi
  tail -3 "$out/$name.run.txt"
}
for c in ${PROBES:-sparse32x6 sparse1x6 moe48 moe6 moe1}; do
  case $c in
    sparse32x6) probe sparse32x6 _sparse_attn_kernel 3 1 sparse_attn 32x6x16 ;;
    sparse32x6w) probe sparse32x6w _wgmma_attn_kernel 3 1 sparse_attn 32x6x16:wgmma ;;
    sparse8x6w) probe sparse8x6w _wgmma_attn_kernel 3 1 sparse_attn 8x6x16:wgmma ;;
    sparse32x6t) probe sparse32x6t _wgmma_attn_kernel 3 1 sparse_attn 32x6x16:tiles2 ;;
    sparse1x6) probe sparse1x6 "_sparse_attn_kernel|_merge_kernel" 6 2 sparse_attn 1x6x16 ;;
    moe48) probe moe48 "_moe_(up|down)_kernel" 6 2 moe 48 ;;
    moe6) probe moe6 "_moe_(up|down)_kernel|_router" 12 4 moe 6 ;;
    moe1) probe moe1 "_moe_(up|down)_kernel|_router" 9 3 moe 1 ;;
    topkrow) probe topkrow _row_kernel 3 1 topk 1x65536xall:row ;;
    topkrow8) probe topkrow8 _row_kernel 3 1 topk 1x65536x1/8:row ;;
    topkcollect) probe topkcollect _collect_kernel 3 1 topk 64x262144xall:chunks ;;
    topkgmax) probe topkgmax _group_max_kernel 3 1 topk 64x1048576xall:chunks ;;
    topkgmax8) probe topkgmax8 _group_max_kernel 3 1 topk 64x1048576x1/8:chunks ;;
    topkgmax256) probe topkgmax256 _group_max_kernel 3 1 topk 64x262144xall:chunks ;;
  esac
done
