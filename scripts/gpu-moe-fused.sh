#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root, with build/ carried
# from the dev machine (bash scripts/build-gpu-artifacts.sh: build/train and
# build/parallel_ep_peerep.test): the fused MoE expert path (parallel/ep/peerep's
# Fused) on NVSHMEM PEs that share the GPU under MPS.
#  0. builds the kernels image (the fused path changed the ep_*.cu kernels and
#     grouped_sm90.cu) and libasynctp_nvshmem.so with nvcc unless they are
#     in build/ and newer than the kernel sources;
#  1. starts MPS as scripts/gpu-overlap.sh does (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
#     = 100/N per PE is set by the tests' launcher) and quits it at the end;
#  1b. TestGroupedEngineHooks (tensor/cudabackend): the grouped engine's
#     per-block wait and signal alone;
#  2. TestFusedGPU on PES (default 2,4): the MoE device step fused vs
#     pipelined (identical bits) and vs collective (≤ 1e-2), uneven tokens,
#     empty experts, capacity drops, top-k 1/2/8, ten identical runs (the
#     conformance suite on the fused Path too with SUITE=1: slower);
#  3. TestFusedDeadlineGPU on 2 PEs: a silent PE is named within 2 s;
#  4. TestMoEBenchGPU with the grouped GEMM on, PEs 2, one small shape
#     (BENCH_SHAPES, BENCH_TOKENS): collective, pipelined and fused rows.
# Build the kernels image beforehand (bash cuda/kernels/build.sh) to leave
# the whole budget to the tests. Every step has its own timeout, and none may run past the BUDGET (150 s)
# counted from the start. PEs sharing one GPU show mechanics, not NVLink.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
. scripts/mps.sh
OUT=${OUT:-build/out}/moe-fused
BUDGET=${BUDGET:-150}
PES=${PES:-2,4}
SUITE=${SUITE:-0}
BENCH_SHAPES=${BENCH_SHAPES:-"8,2,2048,1024"}
BENCH_TOKENS=${BENCH_TOKENS:-2048}
T=./build/parallel_ep_peerep.test
mkdir -p "$OUT"
start=$(date +%s)
ROW_FMT='%-58s %-7s %s'
# left N: the seconds a step may take, at most N and what the budget has left.
left() { local r=$((BUDGET - ($(date +%s) - start))); [ "$r" -lt "$1" ] && echo "$r" || echo "$1"; }
summary_on_exit "summary (logs in $OUT; budget $BUDGET s)"
# step NAME SECONDS LOG CMD...: runs CMD with a timeout, records the row.
step() {
  local name=$1 secs log=$3; secs=$(left "$2"); shift 3
  if [ "$secs" -le 5 ]; then row "$name" NOT-RUN "budget spent"; return 1; fi
  local t0; t0=$(date +%s)
  timeout -k 5 "$secs" "$@" > "$OUT/$log" 2>&1; local st=$?
  if [ $st -eq 0 ]; then row "$name" ok "$(($(date +%s) - t0)) s"; return 0; fi
  [ $st -eq 124 ] && row "$name" TIMEOUT "after $secs s, see $log" || row "$name" FAIL "see $log"
  grep -E -- '--- FAIL|rank [0-9]+: |panic|error' "$OUT/$log" | head -20
  return 1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
need "$T"
if kernels_stale; then
  step "kernels image (nvcc)" 90 nvcc.log bash cuda/kernels/build.sh || { tail -30 "$OUT/nvcc.log"; exit 1; }
fi
if [ ! -f "$ASYNCTP_LIBNVSHMEM" ]; then
  step "libasynctp_nvshmem.so (nvcc)" 60 nvshmem-build.log bash cuda/nvshmem/build.sh || exit 1
fi

# 1. MPS.
mps_start || exit 1

# 1b. the grouped engine's hooks alone (one process, no MPS needed, but harmless).
if [ -x ./build/tensor_cudabackend.test ]; then
  step "grouped engine hooks (wait, signal, timeout)" 20 hooks.log \
    ./build/tensor_cudabackend.test -test.v -test.count=1 -test.timeout=20s -test.run '^TestGroupedEngineHooks$' || true
fi

# 2. the fused path against pipelined and collective.
if step "fused vs pipelined/collective, PEs $PES" 70 fused.log \
    env ASYNCTP_OVERLAP_PES="$PES" ASYNCTP_OVERLAP_TIMEOUT=65s ASYNCTP_FUSED_SUITE="$SUITE" \
    "$T" -test.v -test.count=1 -test.timeout=70s -test.run '^TestFusedGPU$'; then
  row "  rank-cases passed" "" "$(grep -c 'bit for bit' "$OUT/fused.log")"
else
  mps_restart
fi
while read -r l; do row "  $l" "" ""; done < <(grep -o 'fused: rank 0: .*' "$OUT/fused.log" | sed 's/^fused: rank 0: //')

# 3. the deadline.
if ! step "fused deadline (silent PE), PEs 2" 25 deadline.log \
    env ASYNCTP_OVERLAP_PES=2 ASYNCTP_OVERLAP_TIMEOUT=20s "$T" -test.v -test.count=1 -test.timeout=25s \
    -test.run '^TestFusedDeadlineGPU$'; then
  mps_restart
fi
while read -r l; do row "  $l" "" ""; done < <(grep -o 'rank [0-9]* failed after.*' "$OUT/deadline.log" | head -2 | cut -c1-160)

# 4. the layer bench with fused rows.
if step "moe bench (grouped on), PEs 2" 40 bench.log \
    env ASYNCTP_OVERLAP_BENCH=1 ASYNCTP_OVERLAP_PES=2 ASYNCTP_OVERLAP_TIMEOUT=35s ASYNCTP_MOEBENCH_GROUPED=on \
    ASYNCTP_MOEBENCH_SHAPES="$BENCH_SHAPES" ASYNCTP_MOEBENCH_TOKENS="$BENCH_TOKENS" \
    "$T" -test.v -test.count=1 -test.timeout=40s -test.run '^TestMoEBenchGPU$'; then
  while read -r l; do row "  $l" "" ""; done < <(grep -o 'bench: .*' "$OUT/bench.log" | sed 's/^bench: //')
fi
