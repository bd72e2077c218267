#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root: BENCHMARKS.md's
# "Pending on the GPU" list of 2026-12-02 (seventh) that fits one call
# (≈ 5–6 minutes with the kernels to build):
#  0. the attention tests (the D = 128 wgmma forward is the default on sm_90);
#  1. the attention bench, forward and backward, wgmma against FA2;
#  2. the step profile per op family after the wgmma forward and the wide
#     AdamW, llama-1b and gpt2-124m (ncu kernel durations, scripts/gpu-profile.sh).
# The acceptance rounds against PyTorch (both presets alternated twice, eager
# included) are a call of their own:
#   STEPS=20 TORCH_STEPS=10 ROUNDS=2 PRESETS="gpt2-124m llama-1b" \
#     FIRST_MODES=eager,compile TORCH_TIMEOUT=250 bash scripts/gpu-speed.sh
# Needs build/tensor_cudabackend.test and build/train from
# scripts/build-gpu-artifacts.sh; builds the kernels image with nvcc when
# missing or stale.
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
run "attention tests (TestAttentionWG, TestAttentionShapes*)" 120 attention-tests.log -- \
  "$B" -test.v -test.count=1 -test.run '^(TestAttentionWG|TestAttentionShapes|TestAttentionShapesFA2|TestDeterminism)$'
run "attention bench, wg against fa2" 120 attention-bench.log -- \
  "$B" -test.run '^$' -test.bench 'BenchmarkAttention/(wg|fa2)/.*/.*/(fwd|bwd)$' -test.benchtime 20x
grep '^Benchmark' "$OUT/attention-bench.log" | awk '{print $1, $3, $4, $5, $6}'
run "step profile, llama-1b" 240 profile-llama.log -- env OUT="$OUT" PRESET=llama-1b BATCH=8 NCU=1 TORCH=0 STEPS=8 bash scripts/gpu-profile.sh
grep -A12 '^ours, one step' "$OUT/profile-llama.log"
run "step profile, gpt2-124m" 200 profile-gpt2.log -- env OUT="$OUT" NCU=1 TORCH=0 STEPS=8 bash scripts/gpu-profile.sh
grep -A12 '^ours, one step' "$OUT/profile-gpt2.log"
