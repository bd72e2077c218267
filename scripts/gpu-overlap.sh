#!/usr/bin/env bash
# Runs on the GPU machine (one H200 is enough), from the repo root, with
# build/ carried from the dev machine (bash scripts/build-gpu-artifacts.sh):
# the overlap layer on NVSHMEM PEs that share the GPU under MPS.
#  0. builds the kernels image and libasynctp_nvshmem.so with nvcc unless
#     they are in build/ already;
#  1. starts MPS (its own pipe and log folders; each PE gets
#     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/N, NVSHMEM's full MPG mode) and
#     quits it at the end, whatever happens;
#  2. the site conformance suite on 2 and 4 PEs (collective, pipelined over
#     the transport, pipelined by peer copies; bf16 and f32) and, with
#     BENCH=1, the per-op times at TP-shaped sizes;
#  3. cmd/train --overlap pipelined against --overlap collective on 2 PEs
#     (tp 2, with and without sequence parallelism) and 4 PEs (tp 4, sp),
#     STEPS steps each: the largest relative loss difference and tokens/s.
# PEs that share one GPU share its SMs and memory: the times show the
# mechanics of the overlap, not NVLink speeds.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
. scripts/mps.sh
OUT=${OUT:-build/out}/overlap
STEPS=${STEPS:-50}
TOL=${TOL:-0.02} # bf16 over 50 steps
SUITE_PES=${SUITE_PES:-2,4}       # world sizes of the site suite (none: skip it)
SUITE_TIMEOUT=${SUITE_TIMEOUT:-4m} # per world size
BENCH_PES=${BENCH_PES:-2,4}
RUNS=${RUNS:-tp2 tp2-sp tp4-sp}   # the training comparisons (below; also tp4, moe-tp2-ep2, moe-ep2, moe-ep4)
RUN_TIMEOUT=${RUN_TIMEOUT:-240}   # seconds per training run
OVS=${OVS:-pipelined}             # the strategies each run compares with collective (e.g. "pipelined fused")
mkdir -p "$OUT"
ROW_FMT='%-52s %-6s %s'
summary_on_exit "summary (logs in $OUT)"
need build/train build/overlap_peercopy.test

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ ! -f "$ASYNCTP_KERNELS" ]; then
  t0=$(date +%s)
  if bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then row "kernels (nvcc)" ok "$(($(date +%s)-t0)) s"; else row "kernels (nvcc)" FAIL "see nvcc.log"; tail -20 "$OUT/nvcc.log"; fi
fi
if [ ! -f "$ASYNCTP_LIBNVSHMEM" ]; then
  t0=$(date +%s)
  if bash cuda/nvshmem/build.sh > "$OUT/nvshmem-build.log" 2>&1; then row "libasynctp_nvshmem.so (nvcc)" ok "$(($(date +%s)-t0)) s"; else row "libasynctp_nvshmem.so (nvcc)" FAIL "see nvshmem-build.log"; tail -20 "$OUT/nvshmem-build.log"; fi
fi

# 1. MPS.
mps_start || exit 1

# 2. the suite on SUITE_PES PEs, then (BENCH=1) the per-op times on BENCH_PES.
t0=$(date +%s)
if [ "$SUITE_PES" = none ]; then
  row "site suite" skipped "SUITE_PES=none"
elif ASYNCTP_OVERLAP_PES=$SUITE_PES ASYNCTP_OVERLAP_TIMEOUT=$SUITE_TIMEOUT ./build/overlap_peercopy.test -test.v -test.count=1 \
    -test.timeout=540s -test.run '^TestSuiteGPU$' > "$OUT/suite.log" 2>&1; then
  row "site suite, PEs $SUITE_PES (3 strategies × bf16, f32)" ok "$(grep -c 'suite: rank' "$OUT/suite.log") rank-runs passed, $(($(date +%s)-t0)) s"
else
  row "site suite, PEs $SUITE_PES" FAIL "see suite.log"; grep -E 'FAIL|rank [0-9]: |panic' "$OUT/suite.log" | head -40
  mps_restart
fi
if [ "${BENCH:-0}" = 1 ]; then
  ASYNCTP_OVERLAP_BENCH=1 ASYNCTP_OVERLAP_PES=$BENCH_PES ./build/overlap_peercopy.test -test.v -test.count=1 -test.timeout=300s \
    -test.run '^TestBenchGPU$' > "$OUT/bench.log" 2>&1 || { row "bench, PEs $BENCH_PES" FAIL "see bench.log"; tail -20 "$OUT/bench.log"; }
  grep '^bench:' "$OUT/bench.log" | sed 's/^bench: //' > "$OUT/bench.txt"
  while read -r l; do row "  $l" "" ""; done < "$OUT/bench.txt"
fi

# 3. training curves.
compare() {
  python3 - "$OUT/$1/metrics.jsonl" "$OUT/$2/metrics.jsonl" "$3" <<'PY'
import json, statistics, sys
def recs(p):
    return {r["step"]: r for r in map(json.loads, open(p))}
a, b, tol = recs(sys.argv[1]), recs(sys.argv[2]), float(sys.argv[3])
if set(a) != set(b):
    print(f"FAIL steps differ: {len(a)} vs {len(b)}"); sys.exit(1)
worst = max(abs(b[s]["loss"] - a[s]["loss"]) / abs(a[s]["loss"]) for s in a)
tps = lambda r: statistics.median([v.get("tokens_per_s", 0) for k, v in r.items() if k > 5] or [0])
print(f"{'ok' if worst <= tol else 'FAIL'} max rel loss diff {worst:.2e} over {len(a)} steps; tokens/s {tps(b):.0f} vs collective {tps(a):.0f}")
sys.exit(0 if worst <= tol else 1)
PY
}
COMMON=(--device cuda --comm nvshmem --steps "$STEPS" --log-every 10 --checkpoint-every 0)
declare -A runargs=([tp2]="--model tiny --nproc 2 --tp 2" [tp2-sp]="--model tiny --nproc 2 --tp 2 --sequence-parallel" [tp4-sp]="--model tiny --nproc 4 --tp 4 --sequence-parallel"
  [tp4]="--model tiny --nproc 4 --tp 4" [moe-tp2-ep2]="--model tiny-moe --nproc 2 --tp 2 --ep 2"
  [moe-ep2]="--model tiny-moe --nproc 2 --ep 2 --grouped-gemm on" [moe-ep4]="--model tiny-moe --nproc 4 --ep 4 --grouped-gemm on")
for name in $RUNS; do
  spec="$name|${runargs[$name]}"
  IFS='|' read -r name args <<< "$spec"
  ok=1
  for ov in collective $OVS; do
    # shellcheck disable=SC2086
    if ! timeout "$RUN_TIMEOUT" ./build/train "${COMMON[@]}" $args --overlap $ov --out "$OUT/$name-$ov" > "$OUT/$name-$ov.log" 2>&1; then
      row "$args --overlap $ov" FAIL "see $name-$ov.log"; tail -15 "$OUT/$name-$ov.log"; ok=0; mps_restart
    fi
  done
  [ $ok -eq 1 ] || continue
  for ov in $OVS; do
    res=$(compare "$name-collective" "$name-$ov" "$TOL"); st=$?
    row "$args: $ov vs collective" "$([ $st -eq 0 ] && echo ok || echo FAIL)" "$res"
    while read -r l; do row "  $l" "" ""; done < <(grep '^overlap: ' "$OUT/$name-$ov.log")
  done
done
