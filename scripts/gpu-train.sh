#!/usr/bin/env bash
# Runs on the GPU machine (after build/ is carried and the kernels are built by
# scripts/gpu.sh or cuda/kernels/build.sh): training checks and the
# end-to-end benchmark against PyTorch, in one call.
#  1. tiny, 50 steps, on the CPU and on the GPU: the loss curves must agree
#     within bf16 tolerance (printed: the largest relative difference).
#  2. gpt2-124m on the GPU: tokens/s and MFU, its loss must fall.
#  3. the same model and batch in PyTorch, eager and torch.compile.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/out}
mkdir -p "$OUT"
export ASYNCTP_KERNELS=${ASYNCTP_KERNELS:-$PWD/build/asynctp_kernels.fatbin}
GPT2_STEPS=${GPT2_STEPS:-40}
GPT2_BATCH=${GPT2_BATCH:-8}

./build/train --model tiny --device cpu --steps 50 --log-every 25 --checkpoint-every 0 --out "$OUT/tiny-cpu" > "$OUT/tiny-cpu.log" 2>&1
./build/train --model tiny --device cuda --steps 50 --log-every 25 --checkpoint-every 0 --out "$OUT/tiny-gpu" > "$OUT/tiny-gpu.log" 2>&1 || tail -20 "$OUT/tiny-gpu.log"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/{d}/metrics.jsonl"))}
c, g = losses("tiny-cpu"), losses("tiny-gpu")
worst = max(abs(g[s] - c[s]) / abs(c[s]) for s in c)
print(f"tiny cpu vs gpu over {len(c)} steps: loss {c[1]:.4f} -> {c[max(c)]:.4f} (cpu), {g[1]:.4f} -> {g[max(g)]:.4f} (gpu); max relative difference {worst:.2e}")
PY

./build/train --model gpt2-124m --device cuda --steps "$GPT2_STEPS" --batch "$GPT2_BATCH" --warmup 10 --log-every 10 \
  --checkpoint-every 0 --out "$OUT/gpt2" > "$OUT/gpt2.log" 2>&1 || tail -30 "$OUT/gpt2.log"
grep -E "^(device|model|step)" "$OUT/gpt2.log" | tail -6
python3 - "$OUT" "$GPT2_BATCH" <<'PY'
import json, sys
out, batch = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for l in open(f"{out}/gpt2/metrics.jsonl")]
skip = 5  # warm-up steps (allocator, cuBLASLt plans, clocks)
tps = sorted(r["tokens_per_s"] for r in recs[skip:])[len(recs[skip:]) // 2]
fps = sorted(r.get("flops_per_s", 0) for r in recs[skip:])[len(recs[skip:]) // 2]
print(json.dumps({"impl": "asynctp-cuda", "tokens_per_s": round(tps), "mfu": round(fps / 989e12, 4),
                  "first_loss": recs[0]["loss"], "last_loss": recs[-1]["loss"], "steps": len(recs)}))
PY
PYTHONUNBUFFERED=1 python3 bench/torch_gpt.py --batch "$GPT2_BATCH" --steps 30 --modes eager,compile 2>&1 | grep -E '^\{|Error|error' | tail -5
