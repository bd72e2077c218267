"""PyTorch's MoE building blocks, the references for our grouped GEMM and our
expert-parallel dispatch/combine (parallel/ep/peerep/gpu_test.go, func bench).

    python3 bench/torch_moe.py                                        # (a), one process
    torchrun --standalone --nproc-per-node P bench/torch_moe.py       # (b), P = 1, 2, 4

(a) --parts gemm: torch._grouped_mm, bf16, E experts × rows per expert
    (balanced offs, int32 cumulative ends), 4096→1536 and 7168→2048:
      fwd    x (M,K) · w (E,K,N), 2D×3D; w stored (E,K,N), and (E,N,K)
             passed transposed (nn.Linear's layout)          → y (M,N)
      dgrad  dy (M,N) · wᵀ, w.transpose(-2,-1), 2D×3D         → dx (M,K)
      wgrad  xᵀ (K,M) · dy (M,N), 2D×2D with offs along M     → dw (E,K,N)
    (the forms PyTorch's own _grouped_mm backward uses; GroupedMMUtils.h),
    each against dense torch.mm of the same FLOPs (M = E·rows). TFLOP/s;
    max_rel_err of the first and last expert against torch.mm.
(b) --parts a2a: dispatch and combine at DeepEP's shapes (128 and 4096
    tokens per rank, hidden 7168, bf16, top-8 of 256 experts, experts
    split evenly over the ranks in blocks), random routing from a fixed seed
    (every rank derives every rank's routing, so the split sizes need no
    exchange). A token goes once to each rank that holds one of its experts.
      nccl     dist.all_to_all_single with uneven splits; dispatch
               there, combine back; us_pack adds the gather of the token
               rows (index_select) before the dispatch / the sum back into
               tokens (index_add_) after the combine
      symm-mem each rank copies its rows straight into the peers'
               symmetric buffers (tensor.copy_ through
               torch.distributed._symmetric_memory's mapped peer buffers,
               device barriers before and after): a copy-based
               all-to-all, works where NCCL refuses several ranks on a GPU
    NCCL refuses several ranks on one GPU ("Duplicate GPU detected"): those
    rows say so. Several ranks on one GPU share its SMs and memory: the
    times show the mechanics, not NVLink speeds.
Default parts: gemm without torchrun, a2a under it. JSON lines on rank 0.
"""
import argparse, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # sets the no-multicast environment before torch loads

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--parts", default="auto", help="gemm, a2a, or both (auto: gemm without torchrun, a2a under it)")
ap.add_argument("--experts-list", default="8,64", help="(a) E")
ap.add_argument("--rows-list", default="512,2048,4096", help="(a) rows per expert")
ap.add_argument("--shapes", default="4096x1536,7168x2048", help="(a) KxN")
ap.add_argument("--tokens", default="128,4096", help="(b) tokens per rank")
ap.add_argument("--hidden", type=int, default=7168)
ap.add_argument("--topk", type=int, default=8)
ap.add_argument("--experts", type=int, default=256, help="(b) experts over all ranks")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
a = ap.parse_args()
parts = a.parts
if parts == "auto":
    parts = "a2a" if "WORLD_SIZE" in os.environ else "gemm"
parts = set(parts.split(","))
bf = torch.bfloat16
ints = lambda s: [int(v) for v in s.split(",") if v]


def rel(got, want):
    return round(((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item(), 5)


def gemm_part(dev):
    common = {"bench": "torch_moe", "P": 1, "torch": torch.__version__}
    if not hasattr(torch, "_grouped_mm"):
        tc.emit(None, dict(common, op="grouped_mm", ok=False, error="torch._grouped_mm is missing"))
        return
    for K, N in ([int(v) for v in s.split("x")] for s in a.shapes.split(",")):
        for E in ints(a.experts_list):
            for rows in ints(a.rows_list):
                M = E * rows
                shape = f"{E} experts x {rows} rows, {K}->{N}"
                fl = 2.0 * M * K * N
                g = torch.Generator(device=dev)
                g.manual_seed(a.seed)
                rnd = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=bf)
                try:
                    x, dy = rnd(M, K), rnd(M, N)
                    w, wt = rnd(E, K, N), rnd(E, N, K)
                    w0 = rnd(K, N)
                    offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * rows
                except Exception as e:  # noqa: BLE001 - e.g. out of memory
                    tc.emit(None, dict(common, op="grouped_mm", shape=shape, ok=False, error=tc.err_text(e)))
                    continue
                b = dict(common, shape=shape, E=E, rows_per_expert=rows, M=M, K=K, N=N)
                ends = [0, E - 1]
                sl = lambda e: slice(e * rows, (e + 1) * rows)

                fwd = lambda: torch._grouped_mm(x, w, offs=offs)
                fwd_t = lambda: torch._grouped_mm(x, wt.transpose(-2, -1), offs=offs)
                dgrad = lambda: torch._grouped_mm(dy, w.transpose(-2, -1), offs=offs)
                wgrad = lambda: torch._grouped_mm(x.t(), dy, offs=offs)

                def chk(f, ref):
                    def run():
                        y = f()
                        return {"max_rel_err": max(rel(*ref(y, e)) for e in ends)}
                    return run

                rows_ = [
                    ("grouped_mm fwd", "w (E,K,N)", fwd, chk(fwd, lambda y, e: (y[sl(e)], x[sl(e)] @ w[e]))),
                    ("grouped_mm fwd", "w (E,N,K) transposed", fwd_t, chk(fwd_t, lambda y, e: (y[sl(e)], x[sl(e)] @ wt[e].t()))),
                    ("grouped_mm dgrad", "w (E,K,N) transposed", dgrad, chk(dgrad, lambda y, e: (y[sl(e)], dy[sl(e)] @ w[e].t()))),
                    ("grouped_mm wgrad", "2D x 2D, offs along M", wgrad, chk(wgrad, lambda y, e: (y[e], x[sl(e)].t() @ dy[sl(e)]))),
                    ("mm fwd (dense, same FLOPs)", "x (M,K) @ w (K,N)", lambda: torch.mm(x, w0), None),
                    ("mm dgrad (dense, same FLOPs)", "dy (M,N) @ w^T", lambda: torch.mm(dy, w0.t()), None),
                    ("mm wgrad (dense, same FLOPs)", "x^T (K,M) @ dy (M,N)", lambda: torch.mm(x.t(), dy), None),
                ]
                for op, layout, fn, check in rows_:
                    tc.measure(None, dict(b, op=op, layout=layout), fn, a.warmup, a.reps, check, fl)
                x = dy = w = wt = w0 = offs = None  # free before the next shape
                torch.cuda.empty_cache()


def route(seed, r, N, E, topk, P):
    """Rank r's routing of its N tokens: (N, P) bool, token → the ranks that
    hold one of its top-k experts (random distinct experts, fixed seed)."""
    g = torch.Generator()
    g.manual_seed(seed * 1000003 + r * 7919 + N)
    idx = torch.rand(N, E, generator=g).topk(topk, dim=1).indices
    mask = torch.zeros(N, P, dtype=torch.bool)
    mask.scatter_(1, idx // (E // P), True)
    return mask


def a2a_part(c):
    P, rank, dev, C = c.world, c.rank, c.dev, a.hidden
    common = {"bench": "torch_moe", "P": P, "ranks_per_gpu": c.ranks_per_gpu, "torch": torch.__version__}
    for N in ints(a.tokens):
        shape = f"{N} tok/rank, hidden {C}, top-{a.topk} of {a.experts}, {a.experts // P} experts/rank"
        masks = [route(a.seed, r, N, a.experts, a.topk, P) for r in range(P)]
        cnt = [[int(m[:, d].sum()) for d in range(P)] for m in masks]  # cnt[s][d]: rows s sends d
        soff = [[sum(cnt[s][:d]) for d in range(P)] for s in range(P)]  # d's block in s's send
        roff = [[sum(cnt[t][d] for t in range(s)) for d in range(P)] for s in range(P)]  # s's block in d's recv
        S = [sum(cnt[s]) for s in range(P)]
        R = [sum(cnt[s][d] for s in range(P)) for d in range(P)]
        in_splits, out_splits = cnt[rank], [cnt[s][rank] for s in range(P)]
        gidx = torch.cat([masks[rank][:, d].nonzero().flatten() for d in range(P)]).to(dev)
        x = torch.randn(N, C, device=dev, dtype=bf)
        x[:, 0] = rank  # the source rank, exact in bf16: checked after the copies
        send = x.index_select(0, gidx)
        recv = torch.empty(R[rank], C, device=dev, dtype=bf)
        back = torch.empty(S[rank], C, device=dev, dtype=bf)
        out = torch.empty(N, C, device=dev, dtype=bf)
        b = dict(common, shape=shape, tokens=N, rows_sent=S[rank], rows_recv=R[rank],
                 rows_sent_ranks=S, rows_remote_sent=S[rank] - cnt[rank][rank])
        nbytes = S[rank] * C * 2

        def src_ok(buf):
            return all(bool((buf[roff[s][rank]:roff[s][rank] + cnt[s][rank], 0] == s).all()) for s in range(P))

        # symmetric memory: push copies into the peers' mapped buffers
        gname, label, gloo_err, err = tc.symm_group(c)
        if err:
            for op in ("dispatch", "combine"):
                tc.unavailable(c, dict(b, op=op, impl="symm-mem"), "symmetric memory: " + err)
        else:
            import torch.distributed._symmetric_memory as symm_mem
            try:
                rsym = symm_mem.empty(max(R), C, dtype=bf, device=dev)
                bsym = symm_mem.empty(max(S), C, dtype=bf, device=dev)
                hr, hb = symm_mem.rendezvous(rsym, gname), symm_mem.rendezvous(bsym, gname)
                peer_r = [hr.get_buffer(d, [max(R), C], bf) for d in range(P)]
                peer_b = [hb.get_buffer(s, [max(S), C], bf) for s in range(P)]
                disp = [(peer_r[d][roff[rank][d]:roff[rank][d] + cnt[rank][d]], send[soff[rank][d]:soff[rank][d] + cnt[rank][d]])
                        for d in range(P) if cnt[rank][d]]
                comb = [(peer_b[s][soff[s][rank]:soff[s][rank] + cnt[s][rank]], rsym[roff[s][rank]:roff[s][rank] + cnt[s][rank]])
                        for s in range(P) if cnt[s][rank]]
                err = None
            except Exception as e:  # noqa: BLE001
                err = tc.err_text(e)
            err = tc.agree(c, err)
            if err:
                for op in ("dispatch", "combine"):
                    tc.unavailable(c, dict(b, op=op, impl="symm-mem"), "symmetric memory: " + err)
            else:
                bs = dict(b, impl="symm-mem", symm_group=label)

                def sdispatch():
                    hr.barrier(channel=0)
                    for dst, src in disp:
                        dst.copy_(src)
                    hr.barrier(channel=1)

                def scombine():
                    hb.barrier(channel=0)
                    for dst, src in comb:
                        dst.copy_(src)
                    hb.barrier(channel=1)

                def check_d():
                    sdispatch()
                    torch.cuda.synchronize()
                    return {"sources_ok": src_ok(rsym)}

                def check_c():
                    scombine()
                    torch.cuda.synchronize()
                    return {"roundtrip_exact": bool(torch.equal(bsym[:S[rank]], send))}

                tc.measure(c, dict(bs, op="dispatch"), sdispatch, a.warmup, a.reps, check_d, 0.0, nbytes)
                tc.measure(c, dict(bs, op="combine"), scombine, a.warmup, a.reps, check_c, 0.0, nbytes)

        # NCCL all_to_all_single with uneven splits
        err = tc.probe_nccl(c)
        bn = dict(b, impl="nccl.all_to_all_single")
        if err:
            for op in ("dispatch", "combine"):
                tc.unavailable(c, dict(bn, op=op), "NCCL: " + err)
            continue
        d_fn = lambda: dist.all_to_all_single(recv, send, output_split_sizes=out_splits, input_split_sizes=in_splits, group=c.nccl)
        c_fn = lambda: dist.all_to_all_single(back, recv, output_split_sizes=in_splits, input_split_sizes=out_splits, group=c.nccl)

        def d_pack():
            torch.index_select(x, 0, gidx, out=send)
            d_fn()

        def c_unpack():
            c_fn()
            out.zero_()
            out.index_add_(0, gidx, back)

        def check_d():
            d_fn()
            torch.cuda.synchronize()
            return {"sources_ok": src_ok(recv)}

        def check_c():
            c_fn()
            torch.cuda.synchronize()
            return {"roundtrip_exact": bool(torch.equal(back, send))}

        for op, fn, packed, check in (("dispatch", d_fn, d_pack, check_d), ("combine", c_fn, c_unpack, check_c)):
            err, us_pack = None, None
            try:
                us_pack = round(tc.timeit(c, packed, a.warmup, a.reps), 2)
            except Exception as e:  # noqa: BLE001
                err = tc.err_text(e)
            err = tc.agree(c, err)
            extra = {"us_pack": us_pack} if not err else {"us_pack_error": err}
            tc.measure(c, dict(bn, op=op), fn, a.warmup, a.reps, lambda ch=check, ex=extra: dict(ch(), **ex), 0.0, nbytes)


if "a2a" in parts:
    c = tc.init(port="29543")
    if "gemm" in parts and c.rank == 0:
        gemm_part(c.dev)
    a2a_part(c)
    tc.finish(c)
elif "gemm" in parts and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 alone
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    gemm_part(dev)
