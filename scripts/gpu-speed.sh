#!/usr/bin/env bash
# Runs on the GPU machine: one-GPU training speed of
# asynctp against PyTorch (eager once, torch.compile every round), ROUNDS
# rounds alternating ours and PyTorch, on gpt2-124m (batch 16 × 1024) and
# llama-1b (batch 8 × 2048). Prints one JSON line per measurement: tokens/s,
# MFU (989 TFLOP/s dense bf16, the same FLOP count per token in both), step
# time and peak memory. Needs build/train and the kernels image.
# Environment: ROUNDS (2), PRESETS ("gpt2-124m llama-1b"), STEPS (ours, 30),
# TORCH_STEPS (20), OUT (build/out), EXTRA (more cmd/train flags), FIRST_ROUND (1:
# a later value numbers the rounds on from an earlier run's), FIRST_MODES (PyTorch's modes
# in round 1: eager,compile; later rounds run compile only), TORCH_TIMEOUT (400 s).
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}/speed
mkdir -p "$OUT"
summary_on_exit "summary (logs in $OUT)"
need build/train "$ASYNCTP_KERNELS"
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-30}
ours() { # preset batch round
  local dir="$OUT/$1-$3"
  ./build/train --model "$1" --device cuda --batch "$2" --steps "$STEPS" --checkpoint-every 0 --log-every 10 \
    --val-fraction 0 ${EXTRA:-} --out "$dir" > "$dir.log" 2>&1 || { row "asynctp $1, round $3" FAIL "see $dir.log"; tail -15 "$dir.log"; return; }
  python3 - "$dir" "$1" "$3" <<'PY' || row "asynctp $1, round $3" FAIL "metrics unreadable, see $dir.log"
import json, re, sys, statistics
d, preset, rnd = sys.argv[1:]
log = open(d + ".log").read()
b, t = map(int, re.search(r"batch (\d+) x (\d+)", log).groups())
recs = [json.loads(l) for l in open(d + "/metrics.jsonl")][5:]
tps = statistics.median(r["tokens_per_s"] for r in recs)
fps = statistics.median(r.get("flops_per_s", 0) for r in recs)
mem = re.search(r"memory: peak ([0-9.]+) GiB", log)
print(json.dumps({"impl": "asynctp", "preset": preset, "round": int(rnd), "tokens_per_s": round(tps),
                  "mfu": round(fps / 989e12, 4), "step_ms": round(1e3 * b * t / tps, 2),
                  "peak_reserved_gib": float(mem.group(1)) if mem else None,
                  "queue_ms": round(statistics.median(r.get("queue_ms", 0) for r in recs), 2)}), flush=True)
PY
  rm -rf "$dir" # the final checkpoint (15 GB at llama-1b); the log stays
}
torch() { # preset batch modes
  local args=""
  [ "$1" = llama-1b ] && args="--layers 20 --dim 2048 --heads 16 --vocab 32000 --seq 2048 --ffn 5632"
  # shellcheck disable=SC2086
  local log="$OUT/torch-$1-$3.log"
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-400}" python3 bench/torch_gpt.py $args --batch "$2" --steps "${TORCH_STEPS:-20}" --modes "$3" > "$log" 2>&1 ||
    row "PyTorch $1 ($3)" FAIL "see $log"
  grep '^{' "$log" | sed "s/^{/{\"preset\": \"$1\", /"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for r in $(seq "${FIRST_ROUND:-1}" "$ROUNDS"); do
  for p in ${PRESETS:-gpt2-124m llama-1b}; do
    b=16; [ "$p" = llama-1b ] && b=8
    ours "$p" "$b" "$r"
    modes=compile; [ "$r" = 1 ] && modes=${FIRST_MODES:-eager,compile}
    torch "$p" "$b" "$modes"
  done
done
