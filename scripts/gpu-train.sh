#!/usr/bin/env bash
# Runs on the GPU machine (after build/ is carried and the kernels are built by
# scripts/gpu.sh or cuda/kernels/build.sh): training checks and the
# end-to-end benchmark against PyTorch, in one run.
#  1. tiny, 50 steps, on the CPU and on the GPU: the loss curves must agree
#     within TOL (bf16, default 2e-2; printed: the largest relative difference).
#  2. gpt2-124m on the GPU, GPT2_STEPS steps at batch GPT2_BATCH: tokens/s and
#     MFU; its loss must fall.
#  3. the same model and batch in PyTorch, eager and torch.compile.
# Exit status: scripts/README.md (0 all passed, 1 a step failed, 77 no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
OUT=${OUT:-build/out}
mkdir -p "$OUT"
summary_on_exit "summary (logs in $OUT)"
need build/train "$ASYNCTP_KERNELS"
GPT2_STEPS=${GPT2_STEPS:-40}
GPT2_BATCH=${GPT2_BATCH:-8}
TOL=${TOL:-0.02}

# train NAME ARGS...: one run, its log in $OUT/NAME.log, a FAIL row if it fails.
train() {
  local name=$1; shift
  if ./build/train "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1; then return 0; fi
  row "$name" FAIL "see $name.log"; tail -20 "$OUT/$name.log"; return 1
}

rm -rf "$OUT/tiny-cpu" "$OUT/tiny-gpu" "$OUT/gpt2"
if train tiny-cpu --model tiny --device cpu --steps 50 --log-every 25 --checkpoint-every 0 &&
   train tiny-gpu --model tiny --device cuda --steps 50 --log-every 25 --checkpoint-every 0; then
  res=$(python3 - "$OUT" "$TOL" <<'PY'
import json, sys
out, tol = sys.argv[1], float(sys.argv[2])
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{out}/{d}/metrics.jsonl"))}
c, g = losses("tiny-cpu"), losses("tiny-gpu")
worst = max(abs(g[s] - c[s]) / abs(c[s]) for s in c)
print(f"loss {c[1]:.4f} -> {c[max(c)]:.4f} (cpu), {g[1]:.4f} -> {g[max(g)]:.4f} (gpu); max relative difference {worst:.2e} (tolerance {tol})")
sys.exit(0 if worst <= tol else 1)
PY
  ) && row "tiny, cpu against gpu, 50 steps" ok "$res" || row "tiny, cpu against gpu, 50 steps" FAIL "$res"
fi

if train gpt2 --model gpt2-124m --device cuda --steps "$GPT2_STEPS" --batch "$GPT2_BATCH" --warmup 10 --log-every 10 --checkpoint-every 0; then
  grep -E "^(device|model|step)" "$OUT/gpt2.log" | tail -6
  res=$(python3 - "$OUT" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(f"{sys.argv[1]}/gpt2/metrics.jsonl")]
skip = 5  # warm-up steps (allocator, cuBLASLt plans, clocks)
tps = sorted(r["tokens_per_s"] for r in recs[skip:])[len(recs[skip:]) // 2]
fps = sorted(r.get("flops_per_s", 0) for r in recs[skip:])[len(recs[skip:]) // 2]
print(json.dumps({"impl": "asynctp-cuda", "tokens_per_s": round(tps), "mfu": round(fps / 989e12, 4),
                  "first_loss": recs[0]["loss"], "last_loss": recs[-1]["loss"], "steps": len(recs)}))
sys.exit(0 if recs[-1]["loss"] < recs[0]["loss"] else 1)
PY
  ) && row "gpt2-124m on the GPU" ok "$res" || row "gpt2-124m on the GPU" FAIL "the loss did not fall: $res"
fi

if PYTHONUNBUFFERED=1 python3 bench/torch_gpt.py --batch "$GPT2_BATCH" --steps 30 --modes eager,compile > "$OUT/torch-gpt.log" 2>&1; then
  while read -r l; do row "PyTorch" ok "$l"; done < <(grep '^{' "$OUT/torch-gpt.log")
else
  row "PyTorch eager and torch.compile" FAIL "see torch-gpt.log"; grep -E 'Error|error' "$OUT/torch-gpt.log" | tail -5
fi
