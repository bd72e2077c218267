"""PyTorch rows of cmd/ablate's report: the same ops at the same shapes,
at world size 1 on one GPU (NCCL refuses two ranks on one GPU; under
torchrun with several GPUs it runs at that world size).

    echo '[{"op": "all-gather-matmul", "m": 8192, "n": 12288, "k": 4096}]' | python3 bench/torch_ablate.py --reps 20

Reads the shapes (cmd/ablate's TorchShape: op, m, n, k; for the MoE op n is
the width and k the top-K) as JSON on stdin and prints one JSON line per
(impl, op, shape) on rank 0: the median of reps CUDA-event timings after
3 warm-up calls. Ops:
  all-gather-matmul      torch-nccl: all_gather_into_tensor + mm;
                         torch-symm-mem: torch.ops.symm_mem.fused_all_gather_matmul
  matmul-reduce-scatter  torch-nccl: mm + reduce_scatter_tensor;
                         torch-symm-mem: torch.ops.symm_mem.fused_matmul_reduce_scatter
  matmul-all-reduce      torch-nccl: mm + all_reduce
  moe-dispatch-combine   torch-nccl: all_to_all_single of the M·top-K rows, there and back
An op that fails prints its error in the row instead of a time.
"""
import argparse, json, os, statistics, sys

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
if "RANK" not in os.environ:
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29537", LOCAL_RANK="0")
ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=20)
args = ap.parse_args()
shapes = json.load(sys.stdin)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group("nccl")
group = dist.group.WORLD
try:
    import torch.distributed._symmetric_memory as symm_mem
    symm_mem.enable_symm_mem_for_group(group.group_name)
    symm_err = None
except Exception as e:  # noqa: BLE001 - reported in the rows
    symm_err = f"{type(e).__name__}: {e}"
dt = torch.bfloat16


def timeit(fn):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(args.reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def row(impl, sh, fn, flops=0.0, nbytes=0.0):
    r = {"impl": impl, "op": sh["op"], "m": sh["m"], "n": sh["n"], "k": sh["k"], "world": world, "torch": torch.__version__}
    try:
        us = timeit(fn)
        r["us"] = round(us, 2)
        if flops:
            r["tflops"] = round(flops / (us * 1e-6) / 1e12, 2)
        if nbytes:
            r["bytes"], r["algbw_gbps"] = nbytes, round(nbytes / (us * 1e-6) / 1e9, 2)
    except Exception as e:  # noqa: BLE001 - reported in the row
        r["error"] = f"{type(e).__name__}: {e}"[:300]
    if rank == 0:
        print(json.dumps(r), flush=True)


for sh in shapes:
    op, M, N, K = sh["op"], sh["m"], sh["n"], sh["k"]
    n = M // world
    if op == "all-gather-matmul":
        Nl = N // world
        x, full = torch.randn(n, K, device="cuda", dtype=dt), torch.empty(M, K, device="cuda", dtype=dt)
        w = torch.randn(Nl, K, device="cuda", dtype=dt)
        flops = 2.0 * M * Nl * K
        row("torch-nccl", sh, lambda: torch.mm((dist.all_gather_into_tensor(full, x), full)[1], w.t()), flops, M * K * 2)
        if symm_err:
            row("torch-symm-mem", sh, lambda: (_ for _ in ()).throw(RuntimeError(symm_err)))
        else:
            row("torch-symm-mem", sh, lambda: torch.ops.symm_mem.fused_all_gather_matmul(x, [w.t()], gather_dim=0, group_name=group.group_name), flops, M * K * 2)
    elif op in ("matmul-reduce-scatter", "matmul-all-reduce"):
        Kl = K // world
        x, w = torch.randn(M, Kl, device="cuda", dtype=dt), torch.randn(N, Kl, device="cuda", dtype=dt)
        out = torch.empty(n, N, device="cuda", dtype=dt)
        flops = 2.0 * M * N * Kl
        if op == "matmul-all-reduce":
            row("torch-nccl", sh, lambda: dist.all_reduce(torch.mm(x, w.t())), flops, M * N * 2)
            continue
        row("torch-nccl", sh, lambda: dist.reduce_scatter_tensor(out, torch.mm(x, w.t())), flops, M * N * 2)
        if symm_err:
            row("torch-symm-mem", sh, lambda: (_ for _ in ()).throw(RuntimeError(symm_err)))
        else:
            row("torch-symm-mem", sh, lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", scatter_dim=0, group_name=group.group_name), flops, M * N * 2)
    elif op == "moe-dispatch-combine":
        rows = n * K  # K is the top-K here
        rows -= rows % world
        send = torch.randn(rows, N, device="cuda", dtype=dt)
        recv, back = torch.empty_like(send), torch.empty_like(send)
        row("torch-nccl", sh, lambda: (dist.all_to_all_single(recv, send), dist.all_to_all_single(back, recv)), 0.0, 2 * rows * N * 2)
dist.destroy_process_group()
