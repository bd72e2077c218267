#!/usr/bin/env python3
"""Hugging Face interchange proof: our train binary against transformers.

  python3 scripts/hf_interchange.py --train build/train [--work DIR]

(a) transformers -> us: a small random LlamaForCausalLM (and a Mixtral) is
    saved with save_pretrained; `train --init-from` starts from it on a
    batch of random tokens (exactly one batch: B windows of T tokens, so
    step 1's batch is all of them whatever our data order); our step-1 loss
    must equal transformers' loss on the same windows (fp32, <= 1e-4 rel).
(b) us -> transformers: a run of ours (dense at --tp 2, grouped-query at
    --tp 2, MoE at --dp 2 --ep 2) is exported with `train export`, loaded with
    LlamaForCausalLM / MixtralForCausalLM.from_pretrained, and its logits on
    a batch must equal ours (`train logits`, fp32, <= 1e-4 relative to the
    largest logit); the exported byte-level tokenizer must encode bytes as
    their ids.
Prints PASS/FAIL lines with the figures; exits 1 on any FAIL. Our binary
runs on the CPU (--device cpu); transformers on the CPU in float32.
"""
import argparse, json, os, struct, subprocess, sys, tempfile

import torch
import transformers
from safetensors.torch import load_file

B, T = 4, 32
fails = 0


def report(ok, what, figures):
    global fails
    fails += 0 if ok else 1
    print(f"{'PASS' if ok else 'FAIL'} {what}: {figures}", flush=True)


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], sep="\n")
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def batch_file(path, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, vocab, (B * T + 1,), generator=g)
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(toks)}H", *toks.tolist()))
    return toks


def windows(toks):
    x = torch.stack([toks[i * T:i * T + T] for i in range(B)])
    y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(B)])
    return x, y


def hf_loss(model, toks):
    x, y = windows(toks)
    with torch.no_grad():
        logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def our_step1_loss(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rec = json.loads(f.readline())
    return rec["loss"] - rec.get("aux_loss", 0.0)


def part_a(train, work):
    torch.manual_seed(0)
    cases = [
        ("llama", transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                           rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False),
         transformers.LlamaForCausalLM, [[], ["--tp", "2"]]),
        ("mixtral", transformers.MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                                               num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
                                               sliding_window=None, tie_word_embeddings=False),
         transformers.MixtralForCausalLM, [[], ["--dp", "2", "--ep", "2"]]),
    ]
    for name, cfg, cls, layouts in cases:
        model = cls(cfg).float().eval()
        with torch.no_grad():  # a random model whose loss is far from log(V)
            for p in model.parameters():
                p.mul_(5.0 if p.dim() > 1 else 1.0)
        d = os.path.join(work, f"hf-{name}")
        model.save_pretrained(d, safe_serialization=True)
        data = os.path.join(work, f"batch-{name}.bin")
        toks = batch_file(data, cfg.vocab_size, 1)
        want = hf_loss(model, toks)
        for lay in layouts:
            out = os.path.join(work, f"init-{name}-{'-'.join(lay) or 'single'}")
            run([train, "--device", "cpu", "--init-from", d, "--data", data, "--batch", str(B), "--seq", str(T),
                 "--steps", "1", "--val-fraction", "0", "--log-every", "1", "--overwrite", "--out", out] + lay)
            got = our_step1_loss(out)
            rel = abs(got - want) / abs(want)
            report(rel <= 1e-4, f"(a) transformers {name} save_pretrained -> --init-from {' '.join(lay) or '(one rank)'}",
                   f"step-1 loss ours {got:.7f}, transformers {want:.7f}, rel diff {rel:.2e}")


def part_b(train, work):
    cases = [("dense, --tp 2", ["--layers", "2", "--dim", "64", "--heads", "4", "--tp", "2", "--tied=false"], transformers.LlamaForCausalLM),
             ("gqa, --kv-heads 2 --tp 2", ["--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--tp", "2", "--tied=false"],
              transformers.LlamaForCausalLM),
             ("moe, --dp 2 --ep 2", ["--model", "tiny-moe", "--experts", "4", "--dp", "2", "--ep", "2"], transformers.MixtralForCausalLM)]
    for name, flags, cls in cases:
        run_dir = os.path.join(work, "run-" + name.split(",")[0])
        run([train, "--device", "cpu", "--steps", "30", "--seq", str(T), "--overwrite", "--out", run_dir] + flags)
        exp = run_dir + "-hf"
        run([train, "export", "--from", run_dir, "--out", exp])
        data = os.path.join(work, "batch-b.bin")
        toks = batch_file(data, 256, 2)
        lf = os.path.join(work, "logits-" + name.split(",")[0] + ".safetensors")
        run([train, "logits", "--from", run_dir, "--data", data, "--batch", str(B), "--seq", str(T), "--out", lf])
        ours = load_file(lf)
        model = cls.from_pretrained(exp).float().eval()
        x, _ = windows(toks)
        assert torch.equal(ours["ids"].long(), x), "our logits are of other windows"
        with torch.no_grad():
            theirs = model(input_ids=x).logits.float()
        err = (theirs - ours["logits"]).abs().max().item()
        scale = ours["logits"].abs().max().item()
        report(err <= 1e-4 * scale, f"(b) our {name} checkpoint -> train export -> {cls.__name__}.from_pretrained",
               f"max |logit diff| {err:.3e}, max |logit| {scale:.3f}, rel {err / scale:.2e}; loss ours {ours['loss'].item():.6f}, "
               f"transformers {hf_loss(model, toks):.6f}")
        try:
            tok = transformers.AutoTokenizer.from_pretrained(exp)
            ids = tok("héllo, world", add_special_tokens=False)["input_ids"]
            want = list("héllo, world".encode())
            report(ids == want, "(b) exported byte-level tokenizer", f"ids {ids[:8]}..., expected the bytes {want[:8]}...")
        except Exception as e:  # the vocabulary is optional for the logits proof
            report(False, "(b) exported byte-level tokenizer", repr(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True, help="our train binary (go build -o build/train ./cmd/train)")
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="hf-interchange-")
    os.makedirs(work, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, work {work}", flush=True)
    part_a(os.path.abspath(a.train), work)
    part_b(os.path.abspath(a.train), work)
    print("ALL PASS" if fails == 0 else f"{fails} FAIL", flush=True)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
