"""PyTorch's bf16 matmul on the TP-shaped GEMMs, the reference for asynctp's
cuBLASLt path (cuda.BenchmarkGemmBF16). One JSON line per shape.

    python3 bench/torch_matmul.py
"""
import json, torch

SHAPES = [(8192, 3584, 8192), (8192, 8192, 3584), (8192, 8192, 8192), (4096, 4096, 4096)]


def bench(m, n, k, iters=50):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    s = start.elapsed_time(end) / 1e3 / iters
    return 2 * m * n * k / s / 1e12


for m, n, k in SHAPES:
    print(json.dumps({"impl": "torch.matmul", "m": m, "n": n, "k": k, "tflops": round(bench(m, n, k), 1)}), flush=True)
