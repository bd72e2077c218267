"""PyTorch's NCCL collectives, the same-call reference for asynctp's comm
benchmarks (comm/nccl BenchmarkBusBandwidth, comm/nvshmem BenchmarkCollectives).
Run under torchrun for several GPUs, or plainly for world size 1:

    python3 bench/torch_nccl.py                       # world size 1
    torchrun --nproc-per-node 8 bench/torch_nccl.py   # one process per GPU

Prints one JSON line per op and size (rank 0): time, algorithm and bus
bandwidth (nccl-tests conventions: size = the larger of input and output).
"""
import json, os

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
if "RANK" not in os.environ:
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", LOCAL_RANK="0")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group("nccl")
sizes = [4 << 10 << (2 * i) for i in range(0, 9)]  # 4 KiB .. 256 MiB, ×4


def timeit(fn, iters):
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / iters


for nbytes in sizes:
    n = nbytes // 2  # bf16 elements of the full (gathered) tensor
    n -= n % world
    full = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    part = torch.randn(n // world, device="cuda", dtype=torch.bfloat16)
    out_a2a = torch.empty_like(full)
    iters = 20 if nbytes >= (64 << 20) else 100
    ops = {
        "all_gather": (lambda: dist.all_gather_into_tensor(full, part), (world - 1) / world),
        "reduce_scatter": (lambda: dist.reduce_scatter_tensor(part, full), (world - 1) / world),
        "all_reduce": (lambda: dist.all_reduce(full), 2 * (world - 1) / world),
        "all_to_all": (lambda: dist.all_to_all_single(out_a2a, full), (world - 1) / world),
    }
    for name, (fn, factor) in ops.items():
        t = timeit(fn, iters)
        alg = n * 2 / t / 1e9
        if rank == 0:
            print(json.dumps({"impl": "torch-nccl", "op": name, "world": world, "bytes": n * 2,
                              "us": round(t * 1e6, 2), "algbw_GBps": round(alg, 2), "busbw_GBps": round(alg * factor, 2)}), flush=True)
dist.destroy_process_group()
