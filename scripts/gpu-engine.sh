#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repository root: the GEMM
# engine's correctness and speed in one process (no MPS).
#   1. the kernels image with nvcc when missing or older than a kernel source;
#   2. the engine's and the grouped engine's GPU tests (conformance against
#      the CPU backend on every layout and dtype, tile order, wait/signal
#      hooks, timeouts, refusals, bad offsets);
#   3. BenchmarkEngine (NT/NN/TN on the TP and gpt2-124m shapes, cuBLASLt in
#      the same sub-benchmark), BenchmarkEngineHooks (the cost of fusion) and
#      BenchmarkGroupedEngine, BENCHTIME iterations each (default 50x);
#      BENCHES picks them (default "Engine EngineHooks GroupedEngine");
#      ASYNCTP_BENCH_SPLITS="2,4,8" adds BenchmarkEngine's rows at those
#      split-K slice counts (to fit the engine's wave model).
# TEST_TIMEOUT (240 s) bounds step 2; each step has its own timeout. The
# benchmark rows and a summary are printed last.
# Needs build/tensor_cudabackend.test (scripts/build-gpu-artifacts.sh).
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}/engine
mkdir -p "$OUT"
summary_on_exit "summary (logs in $OUT)"
B=build/tensor_cudabackend.test
need "$B"
BT=${BENCHTIME:-50x}
if kernels_stale; then
  t0=$(date +%s)
  if timeout 200 bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then row "kernels image (nvcc)" ok "$(($(date +%s) - t0)) s"
  else row "kernels image (nvcc)" FAIL "see nvcc.log"; tail -30 "$OUT/nvcc.log"; exit 1; fi
fi
t0=$(date +%s)
if timeout "${TEST_TIMEOUT:-240}" "$B" -test.v -test.count=1 -test.run '^(TestEngine|TestGroupedEngine)' > "$OUT/tests.log" 2>&1; then
  row "engine tests" ok "$(($(date +%s) - t0)) s, $(grep -c '^--- PASS' "$OUT/tests.log") passed, $(grep -c -- '--- SKIP' "$OUT/tests.log") skipped"
else
  row "engine tests" FAIL "see tests.log"; grep -E -- '--- FAIL|Error|error' "$OUT/tests.log" | head -20
fi
for b in ${BENCHES:-Engine EngineHooks GroupedEngine}; do
  if ! timeout 240 "$B" -test.run '^$' -test.bench "^Benchmark$b\$" -test.benchtime "$BT" > "$OUT/bench-$b.log" 2>&1; then
    row "Benchmark$b" FAIL "failed or timed out, see bench-$b.log"
  fi
  grep -E '^Benchmark' "$OUT/bench-$b.log" | sed -E 's/-[0-9]+ +[0-9]+ +[0-9]+ ns\/op//; s/ +/ /g'
done
