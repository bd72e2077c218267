#!/usr/bin/env bash
# Runs on the GPU machine (one H200 is enough), from the repo root; needs only
# python3 with PyTorch (no build/). PyTorch's references for our fused TP and
# MoE benchmarks, several ranks sharing the one GPU under MPS:
#  1. starts MPS (its own pipe and log folders) and quits it at the end,
#     whatever happens; each rank of a P-rank run gets
#     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/P as in gpu-overlap.sh
#     (MPS_PCT=none: no limit; MPS=0: no MPS at all);
#  2. bench/torch_moe.py --parts gemm (one process): torch._grouped_mm
#     forward, dgrad and wgrad against dense torch.mm;
#  3. bench/torch_symm_mem.py under torchrun for P in PES (1 2 4):
#     symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter against
#     torch.mm, NCCL all_gather / reduce_scatter (+ mm), the comm alone;
#  4. bench/torch_moe.py --parts a2a under torchrun for P in PES:
#     all_to_all_single dispatch/combine at DeepEP's shapes, and a
#     copy-based all-to-all through symmetric memory.
# Each run is limited to RUN_TIMEOUT (90) seconds and the whole script to
# TOTAL (360); a run past its limit is killed and the next one starts.
# Collects every JSON line into $OUT/torch-refs.jsonl (OUT: build/out) and
# prints them, then a short table. NCCL refuses several ranks on one GPU
# ("Duplicate GPU detected"): its rows at P > 1 are {"ok": false, ...}.
# Ranks that share one GPU share its SMs and memory: the times show the
# mechanics of each op, not NVLink speeds.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU);
# the expected NCCL refusals at P > 1 are rows of the JSON, not failures.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
. scripts/mps.sh
OUT=${OUT:-build/out}
LOGS=$OUT/torch-refs
JSONL=$OUT/torch-refs.jsonl
PES=${PES:-1 2 4}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
TOTAL=${TOTAL:-360}
REPS=${REPS:-20}
mkdir -p "$LOGS"
: > "$JSONL"
export TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 # several ranks on one device (symmetric memory's rendezvous check)
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo} TORCH_REFS_TIMEOUT_S=${TORCH_REFS_TIMEOUT_S:-60}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
t_start=$(date +%s)
ROW_FMT='%-20s %-8s %s'
summary_on_exit "summary (logs in $LOGS)"

table() {
  python3 - "$JSONL" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'bench':<15} {'op':<40} {'impl/layout':<24} {'P':>2} {'shape':<56} {'us':>10}  ok")
for r in rows:
    impl = r.get("impl") or r.get("layout") or ""
    us = r.get("us")
    tail = "" if r.get("ok") else (r.get("error") or "")[:70]
    if r.get("tflops"):
        tail = f"{r['tflops']} TFLOP/s " + tail
    if r.get("us_pack") is not None:
        tail = f"with pack {r['us_pack']} us " + tail
    print(f"{r.get('bench', r.get('step', '')):<15} {r.get('op', ''):<40} {impl:<24} {r.get('P', ''):>2} "
          f"{r.get('shape', '')[:56]:<56} {us if us is not None else '-':>10}  {'ok' if r.get('ok') else 'NO'} {tail}")
PY
}
before_summary() {
  echo
  echo "== $JSONL"
  cat "$JSONL"
  echo
  echo "== table"
  table
  echo "total $(($(date +%s) - t_start)) s"
}

# step NAME P CMD...: runs CMD under the time left (at most RUN_TIMEOUT) with
# P ranks' MPS share, appends its JSON lines, and a failure row if it failed.
step() {
  local name=$1 p=$2
  shift 2
  local left=$((TOTAL - ($(date +%s) - t_start)))
  if [ "$left" -lt 20 ]; then
    echo "{\"step\": \"$name\", \"ok\": false, \"error\": \"skipped: the script's ${TOTAL} s are spent\"}" >> "$JSONL"
    row "$name" NOT-RUN "the script's ${TOTAL} s are spent"
    return
  fi
  local lim=$RUN_TIMEOUT
  [ "$left" -lt "$lim" ] && lim=$left
  local pct=""
  if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && [ "${MPS_PCT:-auto}" != none ]; then
    pct=${MPS_PCT:-auto}
    [ "$pct" = auto ] && pct=$((100 / p))
  fi
  local t0 rc
  t0=$(date +%s)
  echo "== $name (limit ${lim} s${pct:+, MPS ${pct} % per rank})"
  if [ -n "$pct" ]; then
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct timeout -k 5 "$lim" "$@" > "$LOGS/$name.log" 2>&1
  else
    timeout -k 5 "$lim" "$@" > "$LOGS/$name.log" 2>&1
  fi
  rc=$?
  grep '^{' "$LOGS/$name.log" >> "$JSONL"
  echo "   rc $rc, $(($(date +%s) - t0)) s, $(grep -c '^{' "$LOGS/$name.log") rows"
  if [ "$rc" -ne 0 ]; then
    local why="exit status $rc"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="killed after ${lim} s"
    echo "{\"step\": \"$name\", \"P\": $p, \"ok\": false, \"error\": \"$why; see $LOGS/$name.log\"}" >> "$JSONL"
    row "$name" FAIL "$why, see $name.log"
    grep -v '^{' "$LOGS/$name.log" | tail -n 12
    if [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then # a killed client can leave the server unusable
      mps_restart
    fi
  else
    row "$name" ok "$(($(date +%s) - t0)) s, $(grep -c '^{' "$LOGS/$name.log") rows"
  fi
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' ||
  { row "python3 with torch" FAIL "python3 cannot import torch"; exit 1; }
if [ "${MPS:-1}" = 1 ]; then mps_start || exit 1; fi
TR=(python3 -m torch.distributed.run --standalone)
step moe-gemm 1 python3 bench/torch_moe.py --parts gemm --reps "$REPS"
for p in $PES; do
  step "symm-mem-P$p" "$p" "${TR[@]}" --nproc-per-node "$p" bench/torch_symm_mem.py --reps "$REPS"
done
for p in $PES; do
  step "moe-a2a-P$p" "$p" "${TR[@]}" --nproc-per-node "$p" bench/torch_moe.py --parts a2a --reps "$REPS"
done
