#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root: BENCHMARKS.md's
# "Pending on the GPU" list of 2026-12-02 (third) in one call, each step with
# its own timeout (the whole ≈ 5 minutes with the kernels built):
#  1. the fused TP strategy beside peercopy.Pipelined, 2 and 4 PEs, then 4
#     PEs twice more (the four-PE stall stays gone?);
#  2. the MoE layer with 8 and 16 local experts, grouped on and off (the
#     GroupedAutoMinExperts threshold, measured at 4 and 32 only), and the
#     fused path beside the pipelined one at the shape where it is 1.12 ×,
#     both with their time per phase (ASYNCTP_MOEBENCH_PHASES=1);
#  3. PyTorch's reference ops at 4 ranks (scripts/gpu-torch-refs.sh).
# Needs build/ from scripts/build-gpu-artifacts.sh (overlap_peercopy.test,
# parallel_ep_peerep.test); builds the kernels image and
# libasynctp_nvshmem.so with nvcc when missing. PEs share the GPU under MPS:
# the times show mechanics, not NVLink speed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/out}/pending
mkdir -p "$OUT"
. scripts/gpu-env.sh # the GPU machine's environment and build/ paths
ROW_FMT='%-60s %-7s %s'
. scripts/mps.sh # rows and MPS (this script runs from the repository root)
mps_summary_on_exit "summary (logs in $OUT)"
[ -f "$ASYNCTP_KERNELS" ] || { timeout 150 bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1 && row "kernels image (nvcc)" ok "" || { row "kernels image (nvcc)" FAIL "see nvcc.log"; exit 1; }; }
[ -f "$ASYNCTP_LIBNVSHMEM" ] || { timeout 150 bash cuda/nvshmem/build.sh > "$OUT/nvshmem.log" 2>&1 && row "libasynctp_nvshmem.so (nvcc)" ok "" || { row "libasynctp_nvshmem.so (nvcc)" FAIL "see nvshmem.log"; exit 1; }; }
mps_start || exit 1
# run NAME SECONDS LOG ENV... -- CMD...: the command with a timeout; rows for its bench lines.
run() {
  local name=$1 secs=$2 log=$3; shift 3
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local t0; t0=$(date +%s)
  if env "${envs[@]}" timeout -k 5 "$secs" "$@" > "$OUT/$log" 2>&1; then row "$name" ok "$(($(date +%s) - t0)) s"
  else row "$name" FAIL "see $log"; grep -E 'not ready|never|--- FAIL' "$OUT/$log" | sort -u | head -4 | cut -c1-200; mps_restart; fi
  while read -r l; do row "  $l" "" ""; done < <(grep -o '^bench: .*' "$OUT/$log" | grep -v alone | sed 's/^bench: //' | sort -u)
}
TP=(ASYNCTP_OVERLAP_BENCH=1 ASYNCTP_OVERLAP_TIMEOUT=55s ASYNCTP_OVERLAP_STRATEGIES=peercopy-pipelined,fused-pull,fused-put)
run "TP bench, PEs 2,4: pipelined by peer copies, fused pull, put" 60 tp24.log "${TP[@]}" ASYNCTP_OVERLAP_PES=2,4 -- \
  ./build/overlap_peercopy.test -test.v -test.count=1 -test.timeout=60s -test.run '^TestBenchGPU$'
for i in 2 3; do
  run "TP bench, PEs 4, run $i" 45 tp4-$i.log "${TP[@]}" ASYNCTP_OVERLAP_PES=4 -- \
    ./build/overlap_peercopy.test -test.v -test.count=1 -test.timeout=45s -test.run '^TestBenchGPU$'
done
run "MoE layer, 8 and 16 local experts, grouped on/off, PEs 2" 120 moe.log ASYNCTP_OVERLAP_BENCH=1 ASYNCTP_OVERLAP_PES=2 ASYNCTP_MOEBENCH_PHASES=1 \
  ASYNCTP_OVERLAP_TIMEOUT=115s ASYNCTP_MOEBENCH_GROUPED=on,off "ASYNCTP_MOEBENCH_SHAPES=16,2,2048,1024;32,4,2048,512" -- \
  ./build/parallel_ep_peerep.test -test.v -test.count=1 -test.timeout=120s -test.run '^TestMoEBenchGPU$'
run "MoE layer, fused vs pipelined with phases, PEs 2" 60 moe-fused.log ASYNCTP_OVERLAP_BENCH=1 ASYNCTP_OVERLAP_PES=2 \
  ASYNCTP_MOEBENCH_PHASES=1 ASYNCTP_OVERLAP_TIMEOUT=55s ASYNCTP_MOEBENCH_GROUPED=on ASYNCTP_MOEBENCH_SHAPES=8,2,2048,1024 \
  ASYNCTP_MOEBENCH_TOKENS=2048 -- ./build/parallel_ep_peerep.test -test.v -test.count=1 -test.timeout=60s -test.run '^TestMoEBenchGPU$'
grep -h '^bench-phase:' "$OUT/moe.log" "$OUT/moe-fused.log" | sed 's/^bench-phase: //' > "$OUT/moe-phases.txt"
row "MoE phases (µs per step, rank 0's stream)" "" "$(wc -l < "$OUT/moe-phases.txt") lines in moe-phases.txt"
mps_quit
if OUT=$OUT PES=4 TOTAL=150 timeout 170 bash scripts/gpu-torch-refs.sh > "$OUT/torch-refs.log" 2>&1; then row "PyTorch reference ops, 4 ranks" ok "see torch-refs.log"
else row "PyTorch reference ops, 4 ranks" FAIL "see torch-refs.log"; fi
tail -15 "$OUT/torch-refs.log"
