#!/usr/bin/env bash
# One command on the GPU machine, from the repository root, after building the
# test binary on the dev machine (no CUDA needed there; the name is the one
# scripts/build-gpu-artifacts.sh gives it, with every other GPU test binary):
#
#   go test -c -o build/tensor_cudabackend.test ./tensor/cudabackend   # dev machine
#   bash cuda/kernels/gpu_check.sh                                      # GPU machine
#
# It builds build/asynctp_kernels.fatbin with nvcc, runs every test of the
# CUDA backend (conformance in bf16 and f32, tensor-core and CUDA-core
# attention against the CPU reference, MoE ops, routing plan, a tiny GPT,
# determinism), then, with SANITIZE=1, the attention and conformance tests
# under compute-sanitizer (memcheck, and racecheck for shared memory), and,
# with BENCH=1, the benchmarks. Logs go to $OUT (default build/out); a short
# summary is printed last. BIN overrides the test binary's path.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}
mkdir -p "$OUT"
bin=${BIN:-build/tensor_cudabackend.test}
ROW_FMT='%-34s %-5s %s'
summary_on_exit "summary (logs in $OUT)"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
t0=$(date +%s)
if bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then
  row "kernels image (nvcc)" ok "$(($(date +%s) - t0)) s, $(stat -c %s build/asynctp_kernels.fatbin) bytes"
else
  row "kernels image (nvcc)" FAIL "see $OUT/nvcc.log"
  tail -30 "$OUT/nvcc.log"
  exit 1
fi
export ASYNCTP_KERNELS=$PWD/build/asynctp_kernels.fatbin

if [ ! -x "$bin" ]; then
  row "tests" FAIL "$bin missing: go test -c -o $bin ./tensor/cudabackend on the dev machine"
else
  t0=$(date +%s)
  "$bin" -test.v -test.count=1 -test.timeout=600s ${TEST_RUN:+-test.run "$TEST_RUN"} > "$OUT/cudabackend.log" 2>&1
  rc=$?
  pass=$(grep -c -- '--- PASS' "$OUT/cudabackend.log")
  fail=$(grep -c -- '--- FAIL' "$OUT/cudabackend.log")
  skip=$(grep -c -- '--- SKIP' "$OUT/cudabackend.log")
  if [ $rc -eq 0 ]; then st=ok; else st=FAIL; fi
  row "tests" "$st" "$pass passed, $fail failed, $skip skipped, $(($(date +%s) - t0)) s"
  grep -E -- '--- (FAIL|SKIP)|panic:|\.go:[0-9]+: ' "$OUT/cudabackend.log" | head -60

  if [ -n "${SANITIZE:-}" ] && ! command -v compute-sanitizer > /dev/null; then
    row "compute-sanitizer" FAIL "not on PATH (SANITIZE=1 asks for it)"
  elif [ -n "${SANITIZE:-}" ]; then
    for tool in memcheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 3 "$bin" -test.count=1 \
        -test.run 'TestAttentionShapes|TestConformance/bf16/(RMSNorm|CrossEntropy|Embedding|Attention)' \
        > "$OUT/sanitize-$tool.log" 2>&1
      rc=$?
      if [ $rc -eq 0 ]; then st=ok; else st=FAIL; fi
      row "compute-sanitizer $tool" "$st" "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log")"
    done
  fi

  if [ -n "${BENCH:-}" ]; then
    "$bin" -test.run '^$' -test.bench "${BENCH_RUN:-.}" -test.benchtime "${BENCHTIME:-10x}" > "$OUT/bench.log" 2>&1 ||
      row "benchmarks" FAIL "see $OUT/bench.log"
    while read -r l; do row "bench" "" "$l"; done < <(grep -E '^Benchmark' "$OUT/bench.log" | awk '{$2=""; print}')
  fi
fi

