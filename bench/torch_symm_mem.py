"""PyTorch's symmetric-memory async TP at the shapes of our fused TP bench
(overlap/peercopy/gpu_test.go, func bench: 8192 tokens of the whole sequence,
model width 4096, bf16), with the unfused references in the same process.

    torchrun --standalone --nproc-per-node P bench/torch_symm_mem.py   # P = 1, 2, 4
    python3 bench/torch_symm_mem.py                                    # world size 1

On a one-GPU machine every rank uses cuda:0 (scripts/gpu-torch-refs.sh runs
them under MPS). Several ranks on one GPU share its SMs and memory: the times
show the mechanics of each op, not NVLink speeds.

Ops, one JSON line per (op, P) printed by rank 0 ({"ok": false, "error": ...}
where an op is refused, e.g. NCCL's "Duplicate GPU detected" for several
ranks on one GPU):
  all-gather∘matmul, x shard (8192/P, 4096), w (3·4096/P, 4096), y = all_gather(x)·wᵀ (8192, 3·4096/P):
    mm                                      torch.mm of the gathered x alone
    symm_mem.fused_all_gather_matmul        gather_dim 0 (returns the gathered x too)
    symm_mem._low_contention_all_gather     the comm alone, through symmetric memory
    nccl.all_gather_into_tensor             the comm alone
    nccl.all_gather_into_tensor+mm          unfused
  matmul∘reduce-scatter, x (8192, 4096/P), w (4096, 4096/P), y = reduce_scatter(x·wᵀ) (8192/P, 4096):
    mm                                      torch.mm alone (the partial (8192, 4096))
    symm_mem.fused_matmul_reduce_scatter    reduce op "sum", scatter_dim 0
    symm_mem._low_contention_reduce_scatter the comm alone, through symmetric memory
    nccl.reduce_scatter_tensor              the comm alone
    nccl.mm+reduce_scatter_tensor           unfused
us is rank 0's median of --reps CUDA-event timings after --warmup calls
(us_ranks: every rank's); the fused rows carry max_rel_err against the
product computed locally from every rank's (seeded) inputs.
"""
import argparse, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # sets the no-multicast environment before torch loads

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=8192, help="tokens of the whole sequence")
ap.add_argument("--k", type=int, default=4096, help="model width")
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--families", default="mm,symm,nccl", help="which rows: mm, symm, nccl (in this order)")
a = ap.parse_args()
fams = set(a.families.split(","))

c = tc.init(port="29541")
P, rank, dev, bf = c.world, c.rank, c.dev, torch.bfloat16
M, K = a.rows, a.k
n, m, kl = M // P, 3 * K // P, K // P


def gen(seed, *shape):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    return torch.randn(*shape, generator=g, device=dev, dtype=bf)


def rel(got, want):
    return round(((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item(), 5)


# all-gather∘matmul operands; every rank builds the gathered x from the seeds
x = gen(1000 + rank, n, K)
w = gen(2000 + rank, m, K)
x_all = torch.cat([gen(1000 + r, n, K) for r in range(P)])
full = torch.empty(M, K, device=dev, dtype=bf)
# matmul∘reduce-scatter operands
x2, w2 = gen(3000 + rank, M, kl), gen(4000 + rank, K, kl)
partial = torch.mm(x2, w2.t())
out2 = torch.empty(n, K, device=dev, dtype=bf)
torch.cuda.synchronize()

AG = f"x {n}x{K} gathered to {M}x{K} @ w {m}x{K}^T"
RS = f"x {M}x{kl} @ w {K}x{kl}^T reduce-scattered to {n}x{K}"
FL_AG, FL_RS = 2.0 * M * m * K, 2.0 * M * K * kl
common = {"bench": "torch_symm_mem", "P": P, "ranks_per_gpu": c.ranks_per_gpu, "torch": torch.__version__}


def base(op, shape):
    return dict(common, op=op, shape=shape)


def ag_ref():
    return torch.mm(x_all, w.t())


def rs_ref():
    acc = torch.zeros(M, K, device=dev, dtype=torch.float32)
    for r in range(P):
        acc += torch.mm(gen(3000 + r, M, kl), gen(4000 + r, K, kl).t()).float()
    return acc[rank * n:(rank + 1) * n]


def run(op, shape, fn, check=None, flops=0.0, nbytes=0.0):
    tc.measure(c, base(op, shape), fn, a.warmup, a.reps, check, flops, nbytes)


if "mm" in fams:
    run("mm", AG, lambda: torch.mm(x_all, w.t()), flops=FL_AG)
    run("mm", RS, lambda: torch.mm(x2, w2.t()), flops=FL_RS)

if "symm" in fams:
    gname, label, gloo_err, err = tc.symm_group(c)
    ops = ["symm_mem.fused_all_gather_matmul", "symm_mem._low_contention_all_gather",
           "symm_mem.fused_matmul_reduce_scatter", "symm_mem._low_contention_reduce_scatter"]
    if err:
        for op in ops:
            tc.unavailable(c, base(op, AG if "gather" in op else RS), "symmetric memory: " + err)
    else:
        common = dict(common, symm_group=label)
        if gloo_err:
            common["symm_gloo_error"] = gloo_err
        fused_ag = lambda: torch.ops.symm_mem.fused_all_gather_matmul(x, [w.t()], gather_dim=0, group_name=gname)

        def check_ag():
            A, outs = fused_ag()
            return {"max_rel_err": rel(outs[0], ag_ref()), "gathered_exact": bool(torch.equal(A, x_all))}

        run(ops[0], AG, fused_ag, check_ag, FL_AG, M * K * 2)

        def lc_ag():
            return torch.ops._c10d_functional.wait_tensor(torch.ops.symm_mem._low_contention_all_gather(x, gname))

        run(ops[1], AG, lc_ag, lambda: {"exact": bool(torch.equal(lc_ag(), x_all))}, 0.0, M * K * 2)
        fused_rs = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(x2, w2.t(), "sum", scatter_dim=0, group_name=gname)
        run(ops[2], RS, fused_rs, lambda: {"max_rel_err": rel(fused_rs(), rs_ref())}, FL_RS, M * K * 2)

        def lc_rs():
            return torch.ops._c10d_functional.wait_tensor(torch.ops.symm_mem._low_contention_reduce_scatter(partial, "sum", gname))

        def check_lc_rs():
            want = torch.zeros(n, K, device=dev, dtype=torch.float32)
            for r in range(P):
                want += torch.mm(gen(3000 + r, M, kl), gen(4000 + r, K, kl).t())[rank * n:(rank + 1) * n].float()
            return {"max_rel_err": rel(lc_rs(), want)}

        run(ops[3], RS, lc_rs, check_lc_rs, 0.0, M * K * 2)
        common.pop("symm_group", None)
        common.pop("symm_gloo_error", None)

if "nccl" in fams:
    rows = [
        ("nccl.all_gather_into_tensor", AG, lambda: dist.all_gather_into_tensor(full, x, group=c.nccl), None, 0.0),
        ("nccl.all_gather_into_tensor+mm", AG,
         lambda: (dist.all_gather_into_tensor(full, x, group=c.nccl), torch.mm(full, w.t()))[1],
         lambda: {"max_rel_err": rel((dist.all_gather_into_tensor(full, x, group=c.nccl), torch.mm(full, w.t()))[1], ag_ref())}, FL_AG),
        ("nccl.reduce_scatter_tensor", RS, lambda: dist.reduce_scatter_tensor(out2, partial, group=c.nccl), None, 0.0),
        ("nccl.mm+reduce_scatter_tensor", RS, lambda: dist.reduce_scatter_tensor(out2, torch.mm(x2, w2.t()), group=c.nccl),
         lambda: (dist.reduce_scatter_tensor(out2, torch.mm(x2, w2.t()), group=c.nccl), {"max_rel_err": rel(out2, rs_ref())})[1], FL_RS),
    ]
    err = tc.probe_nccl(c)
    for op, shape, fn, check, flops in rows:
        if err:
            tc.unavailable(c, base(op, shape), "NCCL: " + err)
        else:
            run(op, shape, fn, check, flops, M * K * 2)

tc.finish(c)
