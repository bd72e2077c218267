package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// The second-generation tensor-core attention kernels
// (cuda/kernels/attention_fa2.cu): bf16, D = 64 or 128, 16-byte aligned
// tensors and row strides; 128 rows per block. The backward is
// deterministic (two launches, no atomics): dq first, which also computes
// delta = Σ dout·out of its rows, then dk and dv, one block per (128 keys,
// key/value head) running the query heads of its group one after another.

// fa2KernelProbe is a kernel whose presence says the image has them.
const fa2KernelProbe = "attn_fwd_fa2_d64_bf16"

// fa2Rows is the rows (queries or keys) each block owns.
const fa2Rows = 128

// fa2FwdD64Warps picks the D = 64 forward: 4 warps × 32 rows (default,
// attn_fwd_fa2_d64_bf16) or 8 warps × 16 rows (attn_fwd_fa2_d64w8_bf16).
// A variable for the tests and benchmarks that compare the two.
var fa2FwdD64Warps = 4

// fa2FwdKernel is the forward kernel for head dim d and its block size: 8
// warps × 16 rows for D = 128; for D = 64 as fa2FwdD64Warps says.
func fa2FwdKernel(d int) (string, int) {
	switch {
	case d == 128:
		return "attn_fwd_fa2_d128_bf16", 256
	case fa2FwdD64Warps == 8:
		return "attn_fwd_fa2_d64w8_bf16", 256
	default:
		return "attn_fwd_fa2_d64_bf16", 128
	}
}

// fa2Step is the streamed tile of the backward kernels (keys in dq, queries
// in dk/dv): 64 for D = 64, 32 for D = 128 (register budget).
func fa2Step(d int) int {
	if d == 128 {
		return 32
	}
	return 64
}

// fa2SmemFwd: Q (128 rows), two buffers each of K and V (64 rows); rows of
// D + 8 bf16.
func fa2SmemFwd(d int) int { return (fa2Rows + 4*64) * (d + 8) * 2 }

// fa2SmemDq: Q and dO (128 rows), two buffers each of K and V (step rows).
func fa2SmemDq(d int) int { return (2*fa2Rows + 4*fa2Step(d)) * (d + 8) * 2 }

// fa2SmemDkdv: K and V (128 rows), two buffers each of Q and dO (step rows)
// and of lse and delta (step floats each).
func fa2SmemDkdv(d int) int { s := fa2Step(d); return (2*fa2Rows+4*s)*(d+8)*2 + 16*s }

// useFA2 says whether the tensor-core kernels run for this call (the wgmma
// ones take their place where useWG says).
func (b *Backend) useFA2() bool {
	a := b.cfg.attention
	return b.hasFA2 && (a == AttentionAuto || a == AttentionWGMMA || a == AttentionFA2)
}

// attentionFA2 launches the forward; heads and row strides st (q, kv, o).
func (b *Backend) attentionFA2(out, lse, q, k, v *tensor.Tensor, scale float32, nb, nt, d int, st attnStrides) {
	name, threads := fa2FwdKernel(d)
	grid := gpu.D2(ceilDiv(nt, fa2Rows), nb*st.h)
	b.launch("Attention", name, grid, gpu.D1(threads), fa2SmemFwd(d),
		ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), int32(nb), int32(nt), int32(st.h), int32(st.hkv),
		int32(st.q), int32(st.kv), int32(st.o), scale)
}

// attentionBackwardFA2 launches dq (with delta) and then dk, dv; heads and
// row strides st.
func (b *Backend) attentionBackwardFA2(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32, nb, nt, d int, st attnStrides) {
	b.attentionBackwardTwoPass(twoPass{"fa2", fa2Rows, 256, fa2SmemDq(d), fa2SmemDkdv(d)},
		dq, dk, dv, dout, q, k, v, out, lse, scale, nb, nt, d, st)
}

// twoPass is a family of the deterministic two-launch backward
// (attn_bwd_dq_<name>_dD_bf16 with delta, then attn_bwd_dkdv_<name>_dD_bf16:
// the FA2 kernels, and the wgmma ones with the same arguments): the rows
// each block owns, the block's threads, and each launch's shared memory.
type twoPass struct {
	name             string
	rows, threads    int
	smemDq, smemDkdv int
}

// attentionBackwardTwoPass launches p's dq (with delta into a scratch
// buffer; a block per query rows and query head) and then its dk, dv (a
// block per key rows and key/value head); heads and strides st.
func (b *Backend) attentionBackwardTwoPass(p twoPass, dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32, nb, nt, d int, st attnStrides) {
	tiles := ceilDiv(nt, p.rows)
	b.do("AttentionBackward", func(dev gpu.Device) error {
		delta, size, err := b.scratch(tensor.Float32, nb*nt*st.h)
		if err != nil {
			return err
		}
		defer b.putScratch(delta, size)
		if err := dev.Launch(fmt.Sprintf("attn_bwd_dq_%s_d%d_bf16", p.name, d), gpu.D2(tiles, nb*st.h), gpu.D1(p.threads), p.smemDq,
			ptr(dq), delta, ptr(q), ptr(k), ptr(v), ptr(out), ptr(dout), ptr(lse),
			int32(nb), int32(nt), int32(st.h), int32(st.hkv), int32(st.q), int32(st.kv), int32(st.o), int32(st.dq), scale); err != nil {
			return err
		}
		return dev.Launch(fmt.Sprintf("attn_bwd_dkdv_%s_d%d_bf16", p.name, d), gpu.D2(tiles, nb*st.hkv), gpu.D1(p.threads), p.smemDkdv,
			ptr(dk), ptr(dv), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), delta,
			int32(nb), int32(nt), int32(st.h), int32(st.hkv), int32(st.q), int32(st.kv), int32(st.o), int32(st.dkv), scale)
	})
}
