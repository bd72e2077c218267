#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root: BENCHMARKS.md's
# "Pending on the GPU" list of 2026-12-02 (eighth) that fits one call
# (≈ 4–5 minutes with the kernels and libasynctp_nvshmem.so to build):
#  0. every tensor/cudabackend test on the final kernels (acc_scale_rows,
#     the emulator-only operand check: PTX byte-identical to the GPU-run
#     tree, so this is a regression run);
#  1. the attention bench, wgmma (and the experimental D = 64 forwards,
#     wgd64 / wgqd64) against FA2, forward and backward;
#  2. compute-sanitizer memcheck over the fused MoE expert path on 2 PEs
#     under MPS (ep_send's warp-per-slot dweights have not run under it).
# The D = 64 forward's lse difference needs a debug run of m and l first
# (BENCHMARKS.md); the acceptance rounds against PyTorch are a call of
# their own:
#   STEPS=20 TORCH_STEPS=10 ROUNDS=2 PRESETS="gpt2-124m llama-1b" \
#     FIRST_MODES=eager,compile TORCH_TIMEOUT=250 bash scripts/gpu-speed.sh
# Needs build/ from scripts/build-gpu-artifacts.sh; builds the kernels
# image with nvcc when missing or stale.
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
for f in "$B" ./build/train; do
  [ -x "$f" ] || { row "$f" FAIL "missing: scripts/build-gpu-artifacts.sh on the dev machine"; exit 1; }
done
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
if [ ! -f "$ASYNCTP_LIBNVSHMEM" ]; then
  t0=$(date +%s)
  if timeout 120 bash cuda/nvshmem/build.sh > "$OUT/nvshmem-build.log" 2>&1; then row "libasynctp_nvshmem.so (nvcc)" ok "$(($(date +%s) - t0)) s"
  else row "libasynctp_nvshmem.so (nvcc)" FAIL "see nvshmem-build.log"; fi
fi
run "tensor/cudabackend, every test" 200 backend-tests.log -- "$B" -test.count=1 -test.timeout=190s
run "attention bench, wg (and D = 64 experiments) against fa2" 120 attention-bench.log -- \
  "$B" -test.run '^$' -test.bench 'BenchmarkAttention/(wg|wgd64|wgqd64|fa2)/.*/.*/(fwd|bwd)$' -test.benchtime 20x
grep '^Benchmark' "$OUT/attention-bench.log" | awk '{print $1, $3, $4, $5, $6}'
run "memcheck over the fused MoE expert path, 2 PEs (MPS)" 200 sanitize.log -- \
  env OUT="$OUT" BUDGET=180 STEPS=moe-fused bash scripts/gpu-sanitize-pes.sh
grep -E '^== moe-fused|rank[0-9]' "$OUT/sanitize.log" | head -6
