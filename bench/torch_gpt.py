"""PyTorch reference for the gpt2-124m preset of cmd/train: the same model
(pre-norm RMSNorm blocks, RoPE attention, SwiGLU MLP, tied LM head, no biases),
the same batch, AdamW, bf16 autocast with fp32 master weights. Prints one JSON
line per mode with tokens/s and model FLOP utilisation, using the same FLOP
count per token as asynctp (6·N_matmul + 12·L·D·T).

    python3 bench/torch_gpt.py --modes eager,compile --steps 30
"""
import argparse, json, math, time

import torch
import torch.nn as nn
import torch.nn.functional as F

H200_BF16_PEAK = 989e12  # dense bf16 tensor-core peak, FLOP/s


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.w


def rope(x, cos, sin):  # x (B, H, T, D), rotate-half convention
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.n1(x)
        q, k, v = (w(h).view(B, T, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, C))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, vocab, seq, ffn, theta=10000.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        hd = dim // heads
        inv = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets):
        T = ids.shape[1]
        cos, sin = self.cos[:T].to(torch.bfloat16), self.sin[:T].to(torch.bfloat16)
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = F.linear(self.norm(x), self.embed.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def one_step(step_fn, model, opt, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_fn(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def profile_steps(fn, n):
    """GPU time per op family over n steps (scripts/kernel_families.py), per step."""
    import os, sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from kernel_families import families
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n
    rows = []
    for e in p.events():
        # kernels only: user annotations such as "Optimizer.step#AdamW.step"
        # also carry device time and would count their kernels twice
        if "#" in e.name or e.name.startswith("ProfilerStep"):
            continue
        if str(getattr(e, "device_type", "")).endswith("CUDA") and getattr(e, "device_time", 0) > 0:
            rows.append((e.name, e.device_time / n))  # µs per step
    out = families(rows)
    out["wall_ms_profiled"] = round(wall * 1e3, 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile 2 steps with torch.profiler and print their GPU time per op family")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    for mode in a.modes.split(","):
        model = GPT(a.layers, a.dim, a.heads, a.vocab, a.seq, a.ffn).to(dev)
        n_matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2)
        flops_tok = 6 * n_matmul + 12 * a.layers * a.dim * a.seq
        opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        step_fn = model
        if mode == "compile":
            step_fn = torch.compile(model)
        ids = torch.randint(0, 256, (a.batch, a.seq + 1), device=dev)
        x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        losses = []
        for i in range(a.warmup + a.steps):
            if i == a.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_fn(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item() if i in (0, a.warmup + a.steps - 1) else None)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tps = a.batch * a.seq * a.steps / dt
        peak, peak_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        prof = None
        if a.profile:
            prof = profile_steps(lambda: one_step(step_fn, model, opt, x, y), 2)
        print(json.dumps({"impl": "torch-" + mode, "tokens_per_s": round(tps), "mfu": round(tps * flops_tok / H200_BF16_PEAK, 4),
                          "step_ms": round(dt / a.steps * 1e3, 2), "flops_per_token": flops_tok,
                          "first_loss": losses[0], "last_loss": losses[-1], "peak_mem_gib": round(peak / 2**30, 2), "peak_reserved_gib": round(peak_res / 2**30, 2),
                          "torch": torch.__version__}), flush=True)
        if prof is not None:
            print(json.dumps({"impl": "torch-" + mode, "profile_per_step": prof}), flush=True)
        del model, opt, step_fn
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
