#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root, with build/
# carried from the dev machine (bash scripts/build-gpu-artifacts.sh): the
# fused all-gather∘matmul by puts (peercopy.Engine{Transfer: "put"}, kernel
# peer_put of cuda/kernels/peerput.cu) against the copy-engine pulls, on 2
# NVSHMEM PEs sharing the GPU under MPS.
#  0. rebuilds the kernels image with nvcc when it is missing or older than
#     a kernel source (the put kernel is new), and libasynctp_nvshmem.so
#     when missing — before the test budget, with its own timeout;
#  1. starts MPS (its own pipe and log folders) and quits it at the end,
#     whatever happens;
#  2. the site suite of the fused strategy with both transfers (bf16; f32
#     is a refusal check), the determinism test (both transfers), the put
#     deadline test, and the bench rows of both transfers beside the GEMM
#     and the collective alone — each step with a timeout, the steps
#     together within BUDGET seconds (default 120);
#  3. a summary: each step's status and time, the deadline lines and the
#     bench rows.
# PEs that share one GPU share its SMs and memory: the times show the
# mechanics of the two transfers, not NVLink speeds.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
. scripts/mps.sh
OUT=${OUT:-build/out}/fused-put
BUDGET=${BUDGET:-120}      # seconds for step 2 in all
PES=${PES:-2}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-300}
mkdir -p "$OUT"
TEST=./build/overlap_peercopy.test
ROW_FMT='%-58s %-8s %s'
summary_on_exit "summary (logs in $OUT)"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
need "$TEST"

# 0. the images.
if kernels_stale; then
  t0=$(date +%s)
  if OUT_DIR=$(dirname "$ASYNCTP_KERNELS") timeout "$BUILD_TIMEOUT" bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then
    row "kernels image (nvcc)" ok "$(($(date +%s)-t0)) s"
  else
    row "kernels image (nvcc)" FAIL "see nvcc.log"; grep -E 'error|peerput|signals' "$OUT/nvcc.log" | head -30; exit 1
  fi
fi
if [ ! -f "$ASYNCTP_LIBNVSHMEM" ]; then
  t0=$(date +%s)
  if timeout "$BUILD_TIMEOUT" bash cuda/nvshmem/build.sh > "$OUT/nvshmem-build.log" 2>&1; then
    row "libasynctp_nvshmem.so (nvcc)" ok "$(($(date +%s)-t0)) s"
  else
    row "libasynctp_nvshmem.so (nvcc)" FAIL "see nvshmem-build.log"; tail -20 "$OUT/nvshmem-build.log"; exit 1
  fi
fi

# 1. MPS.
mps_start || exit 1

# 2. the steps: name, seconds at most, log, test regexp, extra environment.
end=$(( $(date +%s) + BUDGET ))
step() {
  local name=$1 limit=$2 log=$3 re=$4; shift 4
  local left=$(( end - $(date +%s) ))
  if [ $left -le 5 ]; then row "$name" NOT-RUN "no time left of the ${BUDGET} s budget"; return 1; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0; t0=$(date +%s)
  # The test's own per-world limit a little under the step's, so that it
  # reports its PEs' output instead of being killed.
  if env ASYNCTP_OVERLAP_PES="$PES" ASYNCTP_OVERLAP_TIMEOUT="$(( limit > 10 ? limit - 5 : limit ))s" "$@" \
      timeout -k 5 "$limit" "$TEST" -test.v -test.count=1 -test.timeout="${limit}s" -test.run "$re" > "$OUT/$log" 2>&1; then
    row "$name" ok "$(($(date +%s)-t0)) s (limit $limit s)"
    return 0
  fi
  row "$name" FAIL "$(($(date +%s)-t0)) s, see $log"
  grep -E -- '--- FAIL|FAIL:|rank [0-9]+: |panic|timed out' "$OUT/$log" | head -20
  mps_restart
  return 1
}
step "suite: fused pull + put, $PES PEs (bf16; f32 refused)" 40 suite.log '^TestSuiteGPU$' \
  ASYNCTP_OVERLAP_STRATEGIES=fused-pull,fused-put
grep -oE 'suite: rank 0: .*' "$OUT/suite.log" | sed 's/^suite: //' | sort -u > "$OUT/suite.txt"
while read -r l; do row "  $l" "" ""; done < "$OUT/suite.txt"
step "determinism: fused pull + put, $PES PEs, 10 runs" 20 determinism.log '^TestFusedDeterminismGPU$'
step "deadline: fused put, $PES PEs, one PE never puts" 20 deadline-put.log '^TestFusedPutDeadlineGPU$'
grep -oE 'deadline: put: rank [0-9]+ (failed after [0-9.]+m?s|stays silent|: FAIL.*)' "$OUT/deadline-put.log" | sort -u > "$OUT/deadline-put.txt"
while read -r l; do row "  $l" "" ""; done < "$OUT/deadline-put.txt"
step "bench: fused pull vs put, $PES PEs (rows 8192, K 4096)" 40 bench.log '^TestBenchGPU$' \
  ASYNCTP_OVERLAP_BENCH=1 ASYNCTP_OVERLAP_STRATEGIES=fused-pull,fused-put
grep '^bench:' "$OUT/bench.log" | sed 's/^bench: //' > "$OUT/bench.txt"
while read -r l; do row "  $l" "" ""; done < "$OUT/bench.txt"
