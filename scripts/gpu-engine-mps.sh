#!/usr/bin/env bash
# Runs on the GPU machine (one H200): our GEMM engine when processes share
# the GPU under MPS. Measured (docs/measurements/2026-12-02.md): 0.99 of
# cuBLASLt alone, 0.47–0.49 with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 whether
# one client ran or two, when the device already reported the client's 66
# SMs and the engine applied the 50 % again (grid 33). The engine takes the
# context's SM limit (cuCtxGetExecAffinity) or the device's count;
# BenchmarkEngineGrid sweeps the grid around it.
#   E1 one process, no MPS: the grid sweep
#   E2 one client at 50 %, alone: the grid sweep (where the wave breaks)
#   E3 two clients at 50 %, together: the automatic grid
# Each step has its own timeout (STEP_TIMEOUT, 60 s). Logs go to $OUT.
# Needs build/tensor_cudabackend.test and the kernels image (built if absent).
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
. scripts/mps.sh
OUT=${OUT:-build/out}/engine-mps
mkdir -p "$OUT"
summary_on_exit "summary (logs in $OUT)"
B=build/tensor_cudabackend.test
need "$B"
if [ ! -f "$ASYNCTP_KERNELS" ]; then
  bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1 || { row "kernels image (nvcc)" FAIL "see nvcc.log"; exit 1; }
fi
T=${STEP_TIMEOUT:-60}
# eb NAME LOG REGEXP: the benchmark with a timeout, its rows printed, a
# FAIL row when it fails or times out.
eb() {
  timeout "$T" "$B" -test.v -test.run '^$' -test.bench "$3" -test.benchtime 50x > "$OUT/$2" 2>&1
  local st=$?
  grep -E '^Benchmark|engine grid:' "$OUT/$2" | sed -E 's/^BenchmarkEngineGrid\/?//; s/-[0-9]+ +[0-9]+ +[0-9]+ ns\/op//'
  case $st in
    0) row "$1" ok "" ;;
    124) row "$1" TIMEOUT "after $T s, see $2" ;;
    *) row "$1" FAIL "see $2" ;;
  esac
}
echo "== E1 one process, no MPS"; eb "E1 one process, no MPS" e1.log 'EngineGrid'
mps_start || exit 1
echo "== E2 one client at 50 %, alone"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 eb "E2 one client at 50 %" e2.log 'EngineGrid'
e3() { CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout "$T" "$B" -test.v -test.run '^$' -test.bench 'EngineGrid/grid=auto' -test.benchtime 50x > "$OUT/$1" 2>&1; }
e3 e3a.log & pa=$!
e3 e3b.log & pb=$!
wait $pa; sa=$?
wait $pb; sb=$?
echo "== E3 two clients at 50 %, together"
grep -hE '^Benchmark|engine grid:' "$OUT/e3a.log" "$OUT/e3b.log" | sed -E 's/^BenchmarkEngineGrid\/?//; s/-[0-9]+ +[0-9]+ +[0-9]+ ns\/op//'
[ $sa -eq 0 ] && row "E3 client a, together with b" ok "" || row "E3 client a, together with b" FAIL "exit $sa, see e3a.log"
[ $sb -eq 0 ] && row "E3 client b, together with a" ok "" || row "E3 client b, together with a" FAIL "exit $sb, see e3b.log"
