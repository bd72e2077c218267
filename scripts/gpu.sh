#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with build/ carried from the dev
# machine (scripts/build-gpu-artifacts.sh): builds the kernels with nvcc, runs
# every GPU test binary and the benchmarks, and prints a short table last.
# Logs go to $OUT (when set) so they come back even if a step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export ASYNCTP_KERNELS=$PWD/build/asynctp_kernels.fatbin
declare -a rows
row() { rows+=("$(printf '%-28s %-6s %s' "$1" "$2" "$3")"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
if bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then row "kernels (nvcc)" ok "$(($(date +%s)-t0)) s"; else row "kernels (nvcc)" FAIL "see nvcc.log"; tail -40 "$OUT/nvcc.log"; fi

for bin in build/*.test; do
  [ -e "$bin" ] || continue
  name=$(basename "$bin" .test)
  t0=$(date +%s)
  if "$bin" -test.v -test.count=1 -test.timeout=300s ${TEST_RUN:+-test.run "$TEST_RUN"} > "$OUT/$name.log" 2>&1; then
    row "$name tests" ok "$(grep -c '^--- PASS' "$OUT/$name.log") passed, $(grep -c '^--- SKIP' "$OUT/$name.log") skipped, $(($(date +%s)-t0)) s"
  else
    row "$name tests" FAIL "$(grep -c '^--- FAIL' "$OUT/$name.log") failed"
    grep -B2 -A12 -E '^--- FAIL|panic:' "$OUT/$name.log" | head -60
  fi
  if [ -n "${BENCH:-}" ]; then
    "$bin" -test.run '^$' -test.bench "$BENCH" -test.benchtime "${BENCHTIME:-20x}" > "$OUT/$name.bench.log" 2>&1
    while read -r l; do row "bench" "" "$l"; done < <(grep -E '^Benchmark' "$OUT/$name.bench.log")
  fi
done

# compute-sanitizer over the kernel tests (SANITIZE=1): memory errors and
# shared-memory races in every conformance and attention test.
if [ -n "${SANITIZE:-}" ] && [ -x build/tensor_cudabackend.test ] && command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    compute-sanitizer --tool $tool --error-exitcode 3 build/tensor_cudabackend.test -test.count=1 \
      -test.run "${SANITIZE_RUN:-TestConformance|TestAttentionShapes|TestRoutingPlan}" > "$OUT/sanitize-$tool.log" 2>&1
    if [ $? -eq 0 ]; then st=ok; else st=FAIL; fi
    row "compute-sanitizer $tool" "$st" "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log"), $(($(date +%s)-t0)) s"
  done
fi

echo; echo "== summary"; printf '%s\n' "${rows[@]}"
