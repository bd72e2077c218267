#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root: BENCHMARKS.md's
# "Pending on the GPU" list of 2026-12-02 (fifth) in one call, each step with
# its own timeout (≈ 4 minutes with the kernels to build, ≈ 2.5 without):
#  1. the engine's GPU tests after the review moved the bit-for-bit ones
#     (TestEngineStore, TestEngineTileN192) onto checkEngineCase;
#  2. the profile issue 14's next step needs before any change to the
#     attention kernels: ncu over the gpt2 shape's FA2 forward, backward dq
#     and backward dk,dv kernels (speed of light, warp stalls, occupancy,
#     memory), the first five launches of BenchmarkAttention's gpt2 bwd row;
#  3. the one cell of the engine below 0.90 of cuBLASLt, qkv's weight
#     gradient, at 100 iterations beside its neighbours.
# Needs build/tensor_cudabackend.test from scripts/build-gpu-artifacts.sh;
# builds the kernels image with nvcc when missing or stale.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/out}/pending
mkdir -p "$OUT"
. scripts/gpu-env.sh # the GPU machine's environment and build/ paths
export PATH=$PATH:/usr/local/nvidia/bin
ROW_FMT='%-60s %-7s %s'
. scripts/mps.sh # rows (no MPS here: one process)
trap 'echo; echo "== summary (logs in $OUT)"; printf "%s\n" "${rows[@]}"' EXIT
B=./build/tensor_cudabackend.test
[ -x "$B" ] || { row "$B" FAIL "missing: scripts/build-gpu-artifacts.sh on the dev machine"; exit 1; }
if kernels_stale; then
  t0=$(date +%s)
  if timeout 200 bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then row "kernels image (nvcc)" ok "$(($(date +%s) - t0)) s"
  else row "kernels image (nvcc)" FAIL "see nvcc.log"; exit 1; fi
fi
# run NAME SECONDS LOG -- CMD...: the command with a timeout, a row for it.
run() {
  local name=$1 secs=$2 log=$3; shift 4
  local t0; t0=$(date +%s)
  if timeout -k 5 "$secs" "$@" > "$OUT/$log" 2>&1; then row "$name" ok "$(($(date +%s) - t0)) s"
  else row "$name" FAIL "see $log"; grep -E -- '--- FAIL|differs|is .* with' "$OUT/$log" | head -5 | cut -c1-200; fi
}
run "engine tests (TestEngine*, TestGroupedEngine*)" 240 engine-tests.log -- \
  "$B" -test.v -test.count=1 -test.run '^(TestEngine|TestGroupedEngine)'
row "  passed" "" "$(grep -c '^--- PASS' "$OUT/engine-tests.log")"
# The attention kernels under ncu: the first launch of each (the benchmark's
# warm-up); --clock-control none keeps the clocks as found.
run "ncu: FA2 attention, gpt2 shape (fwd, bwd dq, bwd dk,dv)" 240 attention-ncu.log -- \
  ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -k 'regex:attn_(fwd|bwd)' -c 5 \
    "$B" -test.run '^$' -test.bench 'BenchmarkAttention/fa2/gpt2/.*/bwd' -test.benchtime 1x
grep -E '^  [a-z_]+attn|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued|Stall|Issue Slots Busy|L1/TEX Hit|Bank' \
  "$OUT/attention-ncu.log" | cut -c1-160 > "$OUT/attention-ncu.txt"
row "  attention profile" "" "$(wc -l < "$OUT/attention-ncu.txt") lines in attention-ncu.txt"
head -60 "$OUT/attention-ncu.txt"
run "engine bench, gpt2 rows, 100 iterations" 120 engine-gpt2.log -- \
  "$B" -test.run '^$' -test.bench 'BenchmarkEngine$/gpt2/' -test.benchtime 100x
grep '^Benchmark' "$OUT/engine-gpt2.log" | awk '{n=$1; sub("BenchmarkEngine/","",n); sub("-[0-9]+$","",n); line=n; for(i=2;i<=NF;i++){ if($(i+1) ~ /^(ratio|tilen|splitk)$/) line=line" "$(i+1)"="$i} print line}'
