#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root: BENCHMARKS.md's
# "Pending on the GPU" list of 2026-12-02 (sixth) in one call, each step with
# its own timeout (≈ 6–7 minutes with the kernels to build):
#  0. the engine's and the attention kernels' GPU tests after the review
#     (the engine's wgmma instructions moved to wgmma.cuh; the backward
#     kernels share their delta, P/dS and lse/delta code; PTX unchanged or
#     reordered, never run there);
#  1. the attention backward, wgmma (the default on sm_90) against FA2's
#     mma.sync kernels, in one bench run (the rows of call 5 were both the
#     wgmma backward: the bench's rename had not reached its binary);
#  2. gpt2-124m with each (ASYNCTP_ATTENTION=fa2 is new);
#  3. the step profile per op family after the wgmma backward, gpt2-124m and
#     llama-1b (ncu kernel durations, scripts/gpu-profile.sh).
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
run "engine tests after the wgmma move (TestEngine*, TestGroupedEngine*)" 240 engine-tests.log -- \
  "$B" -test.v -test.count=1 -test.run '^(TestEngine|TestGroupedEngine)'
row "  passed" "" "$(grep -c '^--- PASS' "$OUT/engine-tests.log")"
run "attention tests (TestAttentionWG, TestAttentionShapes*)" 120 attention-tests.log -- \
  "$B" -test.v -test.count=1 -test.run '^(TestAttentionWG|TestAttentionShapes|TestAttentionShapesFA2)$'
run "attention backward bench, wg against fa2" 120 attention-bench.log -- \
  "$B" -test.run '^$' -test.bench 'BenchmarkAttention/(wg|fa2)$/.*/.*/bwd' -test.benchtime 20x
grep '^Benchmark' "$OUT/attention-bench.log" | awk '{print $1, $3, $4, $5, $6}'
for a in "" fa2 "" fa2; do
  tag=${a:-default}
  run "gpt2-124m, 20 steps, attention $tag" 120 "gpt2-$tag.log" -- \
    env ASYNCTP_ATTENTION="$a" ./build/train --model gpt2-124m --device cuda --batch 16 --steps 20 --checkpoint-every 0 --log-every 10 \
    --val-fraction 0 --out "$OUT/gpt2-$tag"
  python3 -c 'import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])][5:]; print(sys.argv[2], round(statistics.median(x["tokens_per_s"] for x in r)), "tokens/s")' \
    "$OUT/gpt2-$tag/metrics.jsonl" "$tag" 2>/dev/null
  rm -rf "$OUT/gpt2-$tag"
done
run "step profile, gpt2-124m" 200 profile-gpt2.log -- env OUT="$OUT" NCU=1 TORCH=0 STEPS=8 bash scripts/gpu-profile.sh
grep -A12 '^ours, one step' "$OUT/profile-gpt2.log"
run "step profile, llama-1b" 240 profile-llama.log -- env OUT="$OUT" PRESET=llama-1b BATCH=8 NCU=1 TORCH=0 STEPS=8 bash scripts/gpu-profile.sh
grep -A12 '^ours, one step' "$OUT/profile-llama.log"
