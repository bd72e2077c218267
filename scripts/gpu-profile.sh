#!/usr/bin/env bash
# Runs on the GPU machine: where a training step's time goes, ours and
# PyTorch's, on one preset, in one run.
#  1. cmd/train on the preset, STEPS steps: tokens/s (median after 5 steps)
#     and the allocator's peak memory;
#  2. the same run under ncu (kernel durations only, --clock-control none,
#     3 steps): the last full step's GPU time per op family
#     (scripts/kernel_families.py); the gap to the step's wall time is host
#     time between kernels (launch overhead, syncs);
#  3. bench/torch_gpt.py --profile, eager and torch.compile: tokens/s, peak
#     memory and their GPU time per family (torch.profiler).
# Needs build/train (scripts/build-gpu-artifacts.sh) and the kernels image.
# Environment: PRESET (gpt2-124m), BATCH (16), STEPS (30), TORCH (1), NCU (1),
# OUT (build/out), EXTRA (more cmd/train flags), TORCH_ARGS (the model for
# bench/torch_gpt.py; set for gpt2-124m and llama-1b), TORCH_STEPS (20).
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}/profile
PRESET=${PRESET:-gpt2-124m}
BATCH=${BATCH:-16}
STEPS=${STEPS:-30}
mkdir -p "$OUT"
summary_on_exit "summary (logs in $OUT)"
need build/train "$ASYNCTP_KERNELS"
case "$PRESET" in
  llama-1b) TORCH_ARGS=${TORCH_ARGS:-"--layers 20 --dim 2048 --heads 16 --vocab 32000 --seq 2048 --ffn 5632"} ;;
  *) TORCH_ARGS=${TORCH_ARGS:-} ;;
esac
TRAIN=(./build/train --model "$PRESET" --device cuda --batch "$BATCH" --checkpoint-every 0 --log-every 10 ${EXTRA:-})

rm -rf "$OUT/run"
if "${TRAIN[@]}" --steps "$STEPS" --val-fraction 0 --out "$OUT/run" > "$OUT/run.log" 2>&1; then
  row "$PRESET, $STEPS steps" ok ""
else
  row "$PRESET, $STEPS steps" FAIL "see run.log"; tail -20 "$OUT/run.log"; exit 1
fi
grep -E '^(model|memory|done)' "$OUT/run.log"
python3 - "$OUT/run/metrics.jsonl" "$PRESET" "$OUT/run.log" <<'PY' || row "tokens/s of the run" FAIL "metrics.jsonl unreadable"
import json, re, sys
m = re.search(r"batch (\d+) x (\d+)", open(sys.argv[3]).read())
tok = int(m.group(1)) * int(m.group(2)) if m else 0
recs = [json.loads(l) for l in open(sys.argv[1])][5:]
tps = sorted(r["tokens_per_s"] for r in recs)[len(recs) // 2]
fps = sorted(r.get("flops_per_s", 0) for r in recs)[len(recs) // 2]
print(json.dumps({"impl": "asynctp", "preset": sys.argv[2], "tokens_per_s": round(tps), "mfu": round(fps / 989e12, 4),
                  "step_ms": round(1e3 * tok / tps, 2), "queue_ms": sorted(r.get("queue_ms", 0) for r in recs)[len(recs) // 2]}))
PY
rm -rf "$OUT/run" # its final checkpoint (15 GB at llama-1b); metrics were read above
if [ "${NCU:-1}" = 1 ]; then
  t0=$(date +%s)
  rm -rf "$OUT/ncu-run"
  if timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --log-file "$OUT/ncu.csv" \
      "${TRAIN[@]}" --steps 3 --val-fraction 0 --out "$OUT/ncu-run" > "$OUT/ncu-run.log" 2>&1; then
    row "ncu, 3 steps" ok "$(($(date +%s)-t0)) s"
  else
    row "ncu, 3 steps" FAIL "see ncu-run.log and ncu.csv"; tail -5 "$OUT/ncu-run.log"; tail -5 "$OUT/ncu.csv"
  fi
  rm -rf "$OUT/ncu-run"
  python3 scripts/kernel_families.py ncu "$OUT/ncu.csv" > "$OUT/ours-families.json" || row "kernel families of ncu.csv" FAIL "scripts/kernel_families.py failed"
  [ -s "$OUT/ours-families.json" ] && python3 - "$OUT/ours-families.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("ours, one step:", d["kernels"], "kernels,", d["kernel_ms"], "ms of GPU time")
for f, v in d["families"].items(): print(f"  {f:12s} {v['ms']:9.3f} ms {100*v['share']:5.1f} % {v['launches']:5d} launches")
for k in d["top_kernels"][:15]: print(f"    {k['ms']:8.3f} ms  {k['family']:11s} {k['name']}")
PY
fi
if [ "${TORCH:-1}" = 1 ]; then
  if PYTHONUNBUFFERED=1 timeout 400 python3 bench/torch_gpt.py $TORCH_ARGS --batch "$BATCH" --steps ${TORCH_STEPS:-20} --modes eager,compile --profile > "$OUT/torch.log" 2>&1; then
    row "PyTorch eager and torch.compile, profiled" ok ""
  else
    row "PyTorch eager and torch.compile, profiled" FAIL "see torch.log"
  fi
  grep '^{' "$OUT/torch.log" | python3 -c '
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    if "profile_per_step" not in d: print(l.strip()); continue
    p = d["profile_per_step"]
    print(d["impl"], "one step:", p["kernels"], "kernels,", p["kernel_ms"], "ms of GPU time; wall", p["wall_ms_profiled"], "ms (profiled)")
    for f, v in p["families"].items(): print("  %-12s %9.3f ms %5.1f %% %5d launches" % (f, v["ms"], 100 * v["share"], v["launches"]))
    for k in p["top_kernels"][:12]: print("    %8.3f ms  %-11s %s" % (k["ms"], k["family"], k["name"]))
' || tail -20 "$OUT/torch.log"
fi
