"""Groups kernel times by op family, for the step profiles of scripts/gpu-profile.sh.

    python3 scripts/kernel_families.py ncu FILE.csv [--steps-marker adamw] > table.json
    (torch) from bench/torch_gpt.py --profile, which calls families() itself.

Input: ncu's `--csv --page raw --metrics gpu__time_duration.sum` output (one row
per kernel launch), or a list of (name, microseconds) pairs. The last complete
training step is taken: launches are cut into steps after each optimizer kernel
(the marker), and the last full step is kept, so warm-up steps do not count.
"""
import csv, json, re, sys

FAMILIES = [  # first match wins; names of our kernels, cuBLAS(Lt)/CUTLASS, Triton and ATen
    ("optimizer", r"adamw|sumsq|sum_sq|multi_tensor|_foreach|fused_adam|clip|norm_scale|amp_"),
    ("attention", r"attn|attention|flash|fmha|sdpa|rope|rotary"),
    ("loss", r"xent|cross_entropy|softmax_ce|nll|log_softmax|loss"),
    ("norms", r"rmsnorm|rms_norm|layernorm|norm"),
    ("embedding", r"embed|emb_|index_select|indexing_backward|gather"),
    ("gemm", r"gemm|nvjet|cutlass|sm90_xmma|sm80_xmma|cublas|wgmma|matmul|mm_"),
    ("elementwise", r"swiglu|silu|gelu|add|scale|cast|copy|fill|mul|axpy|elementwise|vectorized|triton_|reduce|sum"),
]


def family(name):
    n = name.lower()
    for fam, pat in FAMILIES:
        if re.search(pat, n):
            return fam
    return "other"


def last_step(rows, marker):
    """rows: [(name, us)]; returns the launches of the last full step."""
    ends = [i for i, (n, _) in enumerate(rows) if re.search(marker, n.lower())]
    if len(ends) < 2:
        return rows
    # several marker kernels may end one step (e.g. a multi-tensor AdamW): a
    # step ends at the last marker of a run of markers.
    runs = [ends[0]]
    for a, b in zip(ends, ends[1:]):
        if b - a > 8:
            runs.append(b)
        else:
            runs[-1] = b
    if len(runs) < 2:
        return rows
    return rows[runs[-2] + 1: runs[-1] + 1]


def families(rows):
    tot = {}
    cnt = {}
    for n, us in rows:
        f = family(n)
        tot[f] = tot.get(f, 0.0) + us
        cnt[f] = cnt.get(f, 0) + 1
    all_us = sum(tot.values())
    top = {}
    for n, us in rows:
        top[n] = top.get(n, 0.0) + us
    return {"kernels": len(rows), "kernel_ms": round(all_us / 1e3, 3),
            "families": {f: {"ms": round(t / 1e3, 3), "share": round(t / all_us, 3), "launches": cnt[f]}
                         for f, t in sorted(tot.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": n[:90], "ms": round(t / 1e3, 3), "family": family(n)}
                            for n, t in sorted(top.items(), key=lambda kv: -kv[1])[:25]]}


def read_ncu(path):
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    r = csv.DictReader(lines)
    for rec in r:
        v = rec.get("gpu__time_duration.sum", "")
        try:
            t = float(v.replace(",", ""))
        except ValueError:
            continue  # the units row
        rows.append((rec.get("Kernel Name", rec.get("Function Name", "?")), t / 1e3))  # ns → µs
    return rows


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "ncu":
        sys.exit("usage: kernel_families.py ncu FILE.csv [--steps-marker REGEX]")
    marker = "adamw"
    if "--steps-marker" in sys.argv:
        marker = sys.argv[sys.argv.index("--steps-marker") + 1]
    rows = read_ncu(sys.argv[2])
    print(json.dumps(families(last_step(rows, marker)), indent=1))
