#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with build/ carried from the dev
# machine (scripts/build-gpu-artifacts.sh): builds the kernels with nvcc, runs
# every GPU test binary (TEST_RUN: a -test.run filter) and, with BENCH (a
# -test.bench regexp), the benchmarks; with SANITIZE=1 compute-sanitizer's
# memcheck and racecheck over the kernel tests. A summary is printed last.
# Logs go to $OUT (default build/out) so they come back even if a step fails.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}
mkdir -p "$OUT"
ROW_FMT='%-32s %-7s %s'
summary_on_exit "summary (logs in $OUT)"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
if bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then row "kernels (nvcc)" ok "$(($(date +%s)-t0)) s"
else row "kernels (nvcc)" FAIL "see nvcc.log"; tail -40 "$OUT/nvcc.log"; exit 1; fi

bins=(build/*.test)
[ -e "${bins[0]}" ] || need build/tensor_cudabackend.test
for bin in "${bins[@]}"; do
  name=$(basename "$bin" .test)
  t0=$(date +%s)
  if "$bin" -test.v -test.count=1 -test.timeout=300s ${TEST_RUN:+-test.run "$TEST_RUN"} > "$OUT/$name.log" 2>&1; then
    row "$name tests" ok "$(grep -c '^--- PASS' "$OUT/$name.log") passed, $(grep -c '^--- SKIP' "$OUT/$name.log") skipped, $(($(date +%s)-t0)) s"
  else
    row "$name tests" FAIL "$(grep -c '^--- FAIL' "$OUT/$name.log") failed, see $name.log"
    grep -B2 -A12 -E '^--- FAIL|panic:' "$OUT/$name.log" | head -60
  fi
  if [ -n "${BENCH:-}" ]; then
    if ! "$bin" -test.run '^$' -test.bench "$BENCH" -test.benchtime "${BENCHTIME:-20x}" > "$OUT/$name.bench.log" 2>&1; then
      row "$name bench" FAIL "see $name.bench.log"
    fi
    while read -r l; do row "bench" "" "$l"; done < <(grep -E '^Benchmark' "$OUT/$name.bench.log")
  fi
done

# compute-sanitizer over the kernel tests (SANITIZE=1): memory errors and
# shared-memory races in every conformance and attention test.
if [ -n "${SANITIZE:-}" ]; then
  need build/tensor_cudabackend.test
  command -v compute-sanitizer > /dev/null || { row "compute-sanitizer" FAIL "not on PATH (SANITIZE=1 asks for it)"; exit 1; }
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    if compute-sanitizer --tool $tool --error-exitcode 3 build/tensor_cudabackend.test -test.count=1 \
      -test.run "${SANITIZE_RUN:-TestConformance|TestAttentionShapes|TestRoutingPlan}" > "$OUT/sanitize-$tool.log" 2>&1; then st=ok; else st=FAIL; fi
    row "compute-sanitizer $tool" "$st" "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log"), $(($(date +%s)-t0)) s"
  done
fi
