#!/usr/bin/env bash
# Runs on the GPU machine (one H200), from the repo root: docs/gpu-pending.md's
# "Open" items that fit one call (≈ 15–20 minutes with the kernels and
# libasynctp_nvshmem.so to build; ONLY and DEADLINE_S split it):
#  0. the kernels image with ptxas's register and spill report of the
#     attention kernels (the dk/dv passes gained the loop over a key/value
#     head's group of query heads);
#  1. every tensor/cudabackend test: grouped-query attention at group sizes
#     1, 2, 4, 8 and D = 64, 128 against the CPU (TestAttentionShapes*,
#     TestConformance), FA2 against wgmma bit for bit (TestAttentionWG),
#     determinism with a grouped-query backward, ClearErr (TestConformance);
#  2. compute-sanitizer memcheck and racecheck over the attention tests;
#  3. the attention bench, wg and fa2, multi-head and grouped-query shapes;
#  4. the tiny CPU-against-GPU curve with --kv-heads, 50 steps, at head dims
#     64 (4 heads, 1 key/value head) and 128 (2 heads, 1 key/value head);
#  5. compute-sanitizer memcheck over the fused MoE expert path on 2 PEs
#     under MPS (ep_send's warp-per-slot dweights have not run under it);
#  6. the 50-step tiny-moe curve at EP 2 against one process with the
#     gradients summed in fp32 (the default) and in bf16, over nvshmem and
#     nccl, with routing-diff's count of flipped token-layers; and a run of
#     micro-batches;
#  7. --recompute none, attention, block on gpt2-124m and llama-1b with
#     --memory-report: the ledger's forward buffers, tokens/s, losses.
#  8. shadow mode on the pipelined and fused strategies, 2 PEs sharing the
#     GPU under MPS: TP 2 with sequence parallelism, and tiny-moe at TP 2 ×
#     EP 2 with the grouped GEMM (the expert path's device step), each run
#     with --shadow-every 10 and without: the same losses bit for bit, every
#     site within bf16's 1e-2 of collective, the expert sites at exactly 0,
#     and the cost in tokens/s; no run's Model.Close (the sites' streams,
#     events and symmetric buffers) fails.
#  9. the moves of code between files: the PTX of the kernels image before and
#     after the expert path's kernels were split by mode (ptx-check.sh
#     09a801d ce54e85), the libraries through the one loader (the cuda and
#     comm/nccl test binaries), the put transfer through the backend's
#     narrow launcher (gpu-fused-put.sh).
# 10. the distributed optimizer at DP 2 (2 PEs under MPS) on gpt2-124m and
#     llama-1b with --memory-report, with and without it: rank 0's optimizer
#     state and the losses; asynchronous saves on gpt2-124m: the time of the
#     steps after a save.
# 11. the hybrid world (--comm nccl+nvshmem) at world size 1 against --comm
#     nccl, on tiny (pipelined) and tiny-moe (fused).
# ONLY picks steps by name (backend sanitize bench gqa moe-memcheck ep
# recompute shadow moves zero saves hybrid; all when unset), DEADLINE_S
# stops starting steps that many seconds after the start (NOT-RUN rows), so
# that the list runs in several device calls of 10 minutes.
# The rounds against PyTorch are a run of their own:
#   STEPS=20 TORCH_STEPS=10 ROUNDS=2 PRESETS="gpt2-124m llama-1b" \
#     FIRST_MODES=eager,compile TORCH_TIMEOUT=250 bash scripts/gpu-speed.sh
# Needs build/ from scripts/build-gpu-artifacts.sh; builds the kernels
# image with nvcc when missing or stale.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}/pending
mkdir -p "$OUT"
ROW_FMT='%-60s %-7s %s'
summary_on_exit "summary (logs in $OUT)"
B=./build/tensor_cudabackend.test
need "$B" ./build/train
# want STEP: true when STEP is in $ONLY (every step when ONLY is unset).
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
# The call's end: past DEADLINE_S seconds from now a step is not started
# (NOT-RUN) and a running one is stopped, so that the summary is printed
# inside the device call's limit.
DEADLINE=$(($(date +%s) + ${DEADLINE_S:-86400}))
# libasynctp_nvshmem.so builds beside the kernels image.
if [ ! -f "$ASYNCTP_LIBNVSHMEM" ]; then
  (t0=$(date +%s)
   if timeout 240 bash cuda/nvshmem/build.sh > "$OUT/nvshmem-build.log" 2>&1; then echo "ok $(($(date +%s) - t0)) s"
   else echo "FAIL see nvshmem-build.log"; fi > "$OUT/nvshmem-build.status") &
  nvshmem_build=$!
fi
if kernels_stale; then
  t0=$(date +%s)
  if NVCC_FLAGS="-Xptxas -v" timeout 240 bash cuda/kernels/build.sh > "$OUT/nvcc.log" 2>&1; then row "kernels image (nvcc -Xptxas -v)" ok "$(($(date +%s) - t0)) s"
  else row "kernels image (nvcc)" FAIL "see nvcc.log"; exit 1; fi
  # ptxas: "Compiling entry function 'NAME'", then its spill and "Used N registers" lines.
  grep -A3 -E "entry function '(attn_|rope_qkv)" "$OUT/nvcc.log" | grep -E "entry function|spill|Used" > "$OUT/attention-registers.txt"
  grep -B2 -E "[1-9][0-9]* bytes spill" "$OUT/attention-registers.txt" | head -20
  row "attention kernels: registers in attention-registers.txt" "" "$(grep -c -E '[1-9][0-9]* bytes spill' "$OUT/attention-registers.txt") lines with spills"
fi
# run NAME SECONDS LOG -- CMD...: the command with a timeout, a row for it.
run() {
  local name=$1 secs=$2 log=$3; shift 4
  local t0; t0=$(date +%s)
  if [ $((DEADLINE - t0)) -lt 15 ]; then row "$name" NOT-RUN "past the call's deadline (DEADLINE_S)"; return; fi
  [ $((DEADLINE - t0)) -lt "$secs" ] && secs=$((DEADLINE - t0))
  if timeout -k 5 "$secs" "$@" > "$OUT/$log" 2>&1; then row "$name" ok "$(($(date +%s) - t0)) s"
  else row "$name" FAIL "see $log"; grep -E -- '--- FAIL|differs|is .* with|ERROR SUMMARY: [1-9]|hazard' "$OUT/$log" | head -5 | cut -c1-200; fi
}
# loss_diff REF RUN [TOL WHAT]: RUN's loss curve (metrics.jsonl) against
# REF's, step by step: the largest relative difference and the final
# losses; with TOL (WHAT's tolerance) it fails above it.
loss_diff() {
  python3 - "$@" 2>&1 <<'PY'
import json, sys
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl"))}
try:
    a, b = losses(sys.argv[1]), losses(sys.argv[2])
except OSError as e:
    sys.exit(f"no curve: {e}")
worst = max(abs(b[s] - a[s]) / abs(a[s]) for s in a)
note = f" ({sys.argv[4]} tolerance {sys.argv[3]})" if len(sys.argv) > 4 else ""
print(f"max relative loss difference {worst:.3e}{note}, final {b[max(b)]:.6f} against {a[max(a)]:.6f}")
sys.exit(0 if len(sys.argv) < 4 or worst <= float(sys.argv[3]) else 1)
PY
}
if [ -n "${nvshmem_build:-}" ]; then
  wait "$nvshmem_build"
  read -r st detail < "$OUT/nvshmem-build.status"
  row "libasynctp_nvshmem.so (nvcc)" "$st" "$detail"
fi
if want backend; then
run "tensor/cudabackend, every test (GQA shapes included)" 200 backend-tests.log -- "$B" -test.count=1 -test.timeout=190s
fi
if want sanitize; then
ATT='TestAttentionShapes$|TestAttentionShapesFA2$|TestAttentionWG$|TestConformance/bf16/(Attention|Packed)$'
for tool in memcheck racecheck; do
  run "compute-sanitizer $tool over the attention tests" 150 "sanitize-attention-$tool.log" -- \
    compute-sanitizer --tool "$tool" --error-exitcode 3 "$B" -test.count=1 -test.run "$ATT"
  grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-attention-$tool.log"
done
fi
if want bench; then
run "attention bench, wg and fa2, MHA and GQA" 120 attention-bench.log -- \
  "$B" -test.run '^$' -test.bench 'BenchmarkAttention/(wg|fa2)/.*/(fwd|bwd)$' -test.benchtime 20x
grep '^Benchmark' "$OUT/attention-bench.log" | awk '{print $1, $3, $4, $5, $6}'
fi
if want gqa; then
for shape in "d64:--dim 256 --heads 4 --kv-heads 1" "d128:--dim 256 --heads 2 --kv-heads 1"; do
  name=${shape%%:*}; args=${shape#*:}
  for dev in cpu cuda; do
    # shellcheck disable=SC2086
    run "tiny --kv-heads, $name, 50 steps on $dev" 120 "gqa-$name-$dev.log" -- ./build/train --model tiny $args \
      --device "$dev" --steps 50 --log-every 25 --checkpoint-every 0 --out "$OUT/gqa-$name-$dev"
  done
  res=$(python3 - "$OUT" "$name" 2>&1 <<'PY'
import json, sys
out, name = sys.argv[1], sys.argv[2]
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/gqa-{name}-{d}/metrics.jsonl"))}
try:
    c, g = losses("cpu"), losses("cuda")
except OSError as e:
    sys.exit(f"no curve: {e}")
worst = max(abs(g[s] - c[s]) / abs(c[s]) for s in c)
print(f"loss {c[1]:.4f} -> {c[max(c)]:.4f} (cpu), {g[1]:.4f} -> {g[max(g)]:.4f} (gpu); "
      f"max relative difference {worst:.2e} (bf16 tolerance 1e-2)")
sys.exit(0 if worst <= 1e-2 else 1)
PY
  ) && row "tiny --kv-heads $name: cpu against gpu" ok "$res" || row "tiny --kv-heads $name: cpu against gpu" FAIL "$res"
done
fi
if want moe-memcheck; then
run "memcheck over the fused MoE expert path, 2 PEs (MPS)" 200 sanitize.log -- \
  env OUT="$OUT" BUDGET=180 STEPS=moe-fused bash scripts/gpu-sanitize-pes.sh
grep -E 'moe-fused-memcheck' "$OUT/sanitize.log" | head -2
fi
if want ep; then
EPO="$OUT/ep"
EP_ARGS=(--device cuda --model tiny-moe --grouped-gemm on --steps 50 --log-every 25 --checkpoint-every 0)
run "tiny-moe, one process, 50 steps" 150 ep-one.log -- ./build/train "${EP_ARGS[@]}" --dump-routing "$EPO/one-r" --out "$EPO/one"
for c in nvshmem nccl; do
  for d in fp32 bf16; do
    run "tiny-moe --ep 2 --comm $c --grad-reduce-dtype $d" 200 "ep-$c-$d.log" -- ./build/train "${EP_ARGS[@]}" \
      --nproc 2 --comm "$c" --ep 2 --grad-reduce-dtype "$d" --dump-routing "$EPO/$c-$d-r" --out "$EPO/$c-$d"
    flips=$(./build/train routing-diff --quiet "$EPO/one-r" "$EPO/$c-$d-r" 2>&1 | tail -1 | cut -c1-120)
    res=$(loss_diff "$EPO/one" "$EPO/$c-$d") && row "EP 2 $c $d against one process" ok "$res; $flips" || row "EP 2 $c $d against one process" FAIL "$res"
  done
done
run "tiny-moe --ep 2 --comm nccl --micro-batch 2" 200 ep-micro.log -- ./build/train "${EP_ARGS[@]}" \
  --nproc 2 --comm nccl --ep 2 --micro-batch 2 --out "$EPO/micro"
fi
if want recompute; then
for preset in gpt2-124m llama-1b; do
  for m in none attention block; do
    run "$preset --recompute $m --memory-report, 20 steps" 300 "rc-$preset-$m.log" -- ./build/train --device cuda --model "$preset" \
      --steps 20 --log-every 5 --checkpoint-every 0 --val-fraction 0 --memory-report --recompute "$m" --out "$OUT/rc/$preset-$m"
    grep -E "^step 20|layers' forward buffers|memory ledger" "$OUT/rc-$preset-$m.log" | head -3
  done
done
fi
. scripts/mps.sh
if want shadow; then
if mps_start; then
  SHO="$OUT/shadow"
  SH_ARGS=(--device cuda --nproc 2 --comm nvshmem --steps 50 --log-every 25 --checkpoint-every 0)
  for o in pipelined fused; do
    for m in "tp:--model tiny --tp 2 --sequence-parallel" "moe:--model tiny-moe --tp 2 --ep 2 --sequence-parallel --grouped-gemm on"; do
      name=${m%%:*}; args=${m#*:}
      # shellcheck disable=SC2086
      run "shadow: $name --overlap $o, unshadowed" 240 "shadow-$name-$o-plain.log" -- ./build/train "${SH_ARGS[@]}" $args \
        --overlap "$o" --out "$SHO/$name-$o-plain"
      # shellcheck disable=SC2086
      run "shadow: $name --overlap $o --shadow-every 10" 240 "shadow-$name-$o.log" -- ./build/train "${SH_ARGS[@]}" $args \
        --overlap "$o" --shadow-every 10 --out "$SHO/$name-$o"
      grep -A14 'each site.s strategy against collective' "$OUT/shadow-$name-$o.log" | cut -c1-160
      res=$(python3 - "$SHO/$name-$o-plain" "$SHO/$name-$o" 2>&1 <<'PY'
import json, statistics, sys
def recs(d):
    return [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
try:
    a, b = recs(sys.argv[1]), recs(sys.argv[2])
except OSError as e:
    sys.exit(f"no run: {e}")
bad = []
if [r["loss"] for r in a] != [r["loss"] for r in b]:
    bad.append("losses differ from the unshadowed run's")
worst = 0.0
for r in b:
    sh = r.get("shadow")
    if (sh is not None) != (r["step"] % 10 == 0):
        bad.append(f"step {r['step']}: shadow field {sh is not None}")
    for site, slots in (sh or {}).get("sites", {}).items():
        for slot, d in slots.items():
            worst = max(worst, d["rel"])
            if d["rel"] > 1e-2 or ("moe" in site and (d["rel"] != 0 or d["ulp"] != 0)):
                bad.append(f"step {r['step']} {site} {slot}: rel {d['rel']:.3g}, {d['ulp']:.0f} ULP")
tps = lambda rs: statistics.median(r["tokens_per_s"] for r in rs[5:])
print(f"worst relative difference {worst:.3g}; tokens/s {tps(b):.0f} shadowed, {tps(a):.0f} not ({tps(b) / tps(a):.3f})"
      + ("; " + "; ".join(bad[:3]) if bad else ""))
sys.exit(1 if bad else 0)
PY
      ) && row "shadow: $name $o against collective" ok "$res" || row "shadow: $name $o against collective" FAIL "$res"
    done
  done
  # Model.Close at each rank's end closes the sites: the peer-copy and fused
  # sites' side streams, events and symmetric buffers, the expert path's
  # dispatch engine (a failure names the block or the LM head).
  bad=$(grep -l -E "closing its (entry|exit) site|closing its expert path|model: (block [0-9]+|LM head|gradient reduction|waiting for the device before closing)" "$OUT"/shadow-*.log 2>/dev/null)
  [ -z "$bad" ] && row "shadow: Model.Close of the sites, every run" ok "no error from Close" || row "shadow: Model.Close of the sites, every run" FAIL "$bad"
  mps_quit
fi
fi
if want moves; then
# 9. the moves of code between files.
if command -v "${NVCC:-nvcc}" > /dev/null && git rev-parse -q --verify 09a801d^{commit} > /dev/null 2>&1; then
  run "PTX before and after the ep_*.cu split (ptx-check.sh)" 300 ptx-check.log -- bash scripts/ptx-check.sh 09a801d ce54e85
  tail -3 "$OUT/ptx-check.log"
else
  row "PTX before and after the ep_*.cu split (ptx-check.sh)" skipped "needs nvcc and a clone with 09a801d"
fi
[ -x ./build/cuda.test ] && run "cuda: libcuda and cuBLASLt through internal/dynlib" 120 loader-cuda.log -- \
  ./build/cuda.test -test.count=1 -test.timeout=110s
[ -x ./build/comm_nccl.test ] && run "comm/nccl: NCCL through internal/dynlib" 120 loader-nccl.log -- \
  ./build/comm_nccl.test -test.count=1 -test.timeout=110s -test.run 'TestWorldOfOne|TestAbortOfOne|TestMissingLibrary|TestLoadFromEnv'
run "put transfer through the narrow launcher (gpu-fused-put.sh)" 300 fused-put.log -- env OUT="$OUT/fused-put" bash scripts/gpu-fused-put.sh
fi
if want zero; then
# 10. the distributed optimizer and asynchronous saves.
if mps_start; then
  for preset in gpt2-124m llama-1b; do
    for z in on off; do
      flag=(--distributed-optimizer); [ "$z" = off ] && flag=()
      run "$preset --dp 2 distributed optimizer $z, --memory-report" 400 "zero-$preset-$z.log" -- ./build/train --device cuda \
        --nproc 2 --comm nvshmem --dp 2 --model "$preset" --steps 20 --log-every 5 --checkpoint-every 0 --val-fraction 0 \
        --memory-report "${flag[@]}" --out "$OUT/zero/$preset-$z"
      grep -E "^step 20|optimizer state" "$OUT/zero-$preset-$z.log" | head -2
    done
  done
  mps_quit
fi
fi
if want saves; then
for c in 10 0; do
  run "gpt2-124m, 41 steps, --checkpoint-every $c" 300 "ckpt-$c.log" -- ./build/train --device cuda --model gpt2-124m \
    --steps 41 --log-every 1 --checkpoint-every "$c" --val-fraction 0 --out "$OUT/ckpt/every-$c"
done
res=$(python3 - "$OUT/ckpt/every-10" 2>&1 <<'PY'
import json, statistics, sys
try:
    recs = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
except OSError as e:
    sys.exit(f"no run: {e}")
tps = {r["step"]: r["tokens_per_s"] for r in recs}
med = statistics.median(tps[s] for s in tps if s > 2)
print("steps after a save at " + ", ".join(f"{tps[s] / med:.2f}" for s in (11, 21, 31)) + " of the median step's tokens/s")
PY
) && row "asynchronous saves: the steps after a save" ok "$res" || row "asynchronous saves: the steps after a save" FAIL "$res"
fi

# 11. the hybrid world (--comm nccl+nvshmem) at world size 1: it opens both
#     libraries, says what carries each site kind, and trains as --comm nccl
#     with the collective strategy does (bf16's 1e-2), on tiny with the
#     pipelined strategy and on tiny-moe with the fused one.
if want hybrid; then
  HYO="$OUT/hybrid"
  H_ARGS=(--device cuda --nproc 1 --steps 50 --log-every 25 --checkpoint-every 0)
  for m in "tiny-pipelined:--model tiny --overlap pipelined" "moe-fused:--model tiny-moe --grouped-gemm on --overlap fused"; do
    name=${m%%:*}; args=${m#*:}; ref=${args/--overlap pipelined/--overlap collective}; ref=${ref/--overlap fused/--overlap collective}
    # shellcheck disable=SC2086
    run "hybrid world 1: $name over nccl+nvshmem" 150 "hybrid-$name.log" -- ./build/train "${H_ARGS[@]}" $args \
      --comm nccl+nvshmem --out "$HYO/$name"
    grep -E '^(device|overlap|comm)' "$OUT/hybrid-$name.log" | head -6 | cut -c1-200
    # shellcheck disable=SC2086
    run "hybrid world 1: $name's reference, nccl collective" 150 "hybrid-$name-ref.log" -- ./build/train "${H_ARGS[@]}" $ref \
      --comm nccl --out "$HYO/$name-ref"
    res=$(loss_diff "$HYO/$name-ref" "$HYO/$name" 1e-2 bf16) && row "hybrid world 1: $name against nccl collective" ok "$res" || row "hybrid world 1: $name against nccl collective" FAIL "$res"
  done
fi
