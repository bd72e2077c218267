"""Shared set-up of the PyTorch reference scripts that run under torchrun with
several ranks on ONE GPU (bench/torch_symm_mem.py, bench/torch_moe.py).

Process groups: the world group is gloo (host barriers, the agreement on
errors, and the store that symmetric memory's CUDA backend rendezvouses
through); NCCL is a second group over the same ranks, connected lazily on its
first collective, so that its refusal of several ranks on one GPU ("Duplicate
GPU detected") is an error row and not a crash. Symmetric memory's
rendezvous refuses ranks on one device unless
TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 (CUDASymmetricMemory.cu,
validate_rendezvous_requests); it is set here. Several ranks on one GPU share
its SMs and memory: the times show the mechanics, not NVLink speeds.
"""
import json, os, statistics, sys, warnings
from datetime import timedelta

# Never NVLink multicast: it can take a shared host's GPUs out of service
# (README, docs/usage.md); forced here, not left to the defaults.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")

import torch
import torch.distributed as dist


class Ctx:
    pass


def init(port="29541"):
    """Initialises the groups (plain python3: world size 1) and binds the
    device: LOCAL_RANK modulo the visible GPUs, so all ranks use cuda:0 on a
    one-GPU machine."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", port)
    c = Ctx()
    c.rank, c.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ndev = torch.cuda.device_count()
    c.dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % ndev)
    torch.cuda.set_device(c.dev)
    c.ranks_per_gpu = max(1, c.world // ndev) if c.world > 1 else 1
    tmo = timedelta(seconds=int(os.environ.get("TORCH_REFS_TIMEOUT_S", "120")))
    dist.init_process_group("gloo", timeout=tmo)
    c.gloo = dist.group.WORLD
    c.nccl = dist.new_group(backend="nccl", timeout=tmo)
    c.nccl_err = None  # set once the probe has run
    c.nccl_probed = False
    return c


def err_text(e):
    return f"{type(e).__name__}: {e}"[:400]


def agree(c, err):
    """The first non-empty error over all ranks (a collective on gloo)."""
    if c.world == 1:
        return err
    errs = [None] * c.world
    dist.all_gather_object(errs, err, group=c.gloo)
    for r, e in enumerate(errs):
        if e:
            return f"rank {r}: {e}"
    return None


def gather(c, v):
    if c.world == 1:
        return [v]
    vs = [None] * c.world
    dist.all_gather_object(vs, v, group=c.gloo)
    return vs


def timeit(c, fn, warmup, reps):
    """Median µs over reps CUDA-event timings on this rank, the ranks lined
    up by a host barrier before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if c is not None and c.world > 1:
            dist.barrier(group=c.gloo)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def emit(c, row):
    if c is None or c.rank == 0:
        print(json.dumps(row), flush=True)


def measure(c, base, fn, warmup, reps, check=None, flops=0.0, nbytes=0.0):
    """Times fn on every rank and prints one row (rank 0): us is rank 0's
    median, us_ranks every rank's. check() runs once after the timing and
    returns extra fields (errors against a reference). Any exception on any
    rank makes the row {"ok": false, "error": ...}."""
    row = dict(base)
    err, us, extra = None, None, {}
    try:
        us = timeit(c, fn, warmup, reps)
    except Exception as e:  # noqa: BLE001 - reported in the row
        err = err_text(e)
    err = agree(c, err) if c is not None else err
    if not err and check is not None:  # collective too: only once every rank timed
        try:
            extra = check() or {}
        except Exception as e:  # noqa: BLE001
            err = "check: " + err_text(e)
        err = agree(c, err) if c is not None else err
    if err:
        row.update(ok=False, error=err)
    else:
        uss = gather(c, round(us, 2)) if c is not None else [round(us, 2)]
        row.update(us=uss[0], ok=True)
        if len(uss) > 1:
            row["us_ranks"] = uss
        if flops:
            row["tflops"] = round(flops / (uss[0] * 1e-6) / 1e12, 1)
        if nbytes:
            row["bytes"], row["algbw_GBps"] = int(nbytes), round(nbytes / (uss[0] * 1e-6) / 1e9, 1)
        row.update(extra)
    emit(c, row)
    return not err


def unavailable(c, base, err):
    row = dict(base)
    row.update(ok=False, error=err)
    emit(c, row)


def probe_nccl(c):
    """One tiny all_reduce on the NCCL group; its error (agreed over the
    ranks) is kept so that every NCCL row can report it without trying to
    connect again."""
    if not c.nccl_probed:
        c.nccl_probed = True
        err = None
        try:
            t = torch.ones(1, device=c.dev)
            dist.all_reduce(t, group=c.nccl)
            torch.cuda.synchronize()
            if int(t.item()) != c.world:
                err = f"all_reduce gave {t.item()}, want {c.world}"
        except Exception as e:  # noqa: BLE001
            err = err_text(e)
        c.nccl_err = agree(c, err)
    return c.nccl_err


def symm_group(c):
    """The group symmetric memory runs on: gloo's world group if a workspace
    rendezvous and a device barrier work there, else the NCCL group. Returns
    (group_name, label, error of the gloo try or None, error if neither)."""
    if hasattr(c, "symm"):
        return c.symm
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except Exception as e:  # noqa: BLE001
        c.symm = (None, None, None, err_text(e))
        return c.symm
    first = None
    for label, g in (("gloo", c.gloo), ("nccl", c.nccl)):
        err = None
        try:
            name = g.group_name
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if hasattr(symm_mem, "enable_symm_mem_for_group"):
                    symm_mem.enable_symm_mem_for_group(name)
            ws = symm_mem.get_symm_mem_workspace(name, min_size=1 << 20)
            ws.barrier(channel=0)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            err = err_text(e)
        err = agree(c, err)
        if not err:
            c.symm = (name, label, first, None)
            return c.symm
        first = first or err
    c.symm = (None, None, first, first)
    return c.symm


def finish(c):
    """Destroys the groups, unless NCCL failed to connect (then its teardown
    could hang): exit at once, the rows already printed."""
    sys.stdout.flush()
    if c.nccl_err:
        os._exit(0)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
