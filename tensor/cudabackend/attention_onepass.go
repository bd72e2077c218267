package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// AttentionFA2Atomic uses the second-generation forward with
// FlashAttention-2's one-pass backward (cuda/kernels/attention_onepass.cu):
// one kernel per block of 128 keys recomputes the scores and probabilities
// once per (query tile, key block), keeps dk and dv in registers and adds
// each dq contribution into an fp32 buffer with atomics, then a small kernel
// scales and rounds dq to bf16. Less arithmetic than the default's two
// passes (5 GEMM-equivalents per tile instead of 7).
//
// NOT bit-reproducible: the fp32 additions into dq land in an order that
// depends on timing, so two runs of the same step differ in dq's last bits
// (dk and dv are deterministic). Opt-in only, with WithAttention; the default
// (AttentionAuto) keeps the deterministic backward. Where the tensor-core
// kernels do not apply (f32, D other than 64 and 128, unaligned tensors) it
// falls back like AttentionAuto.
const AttentionFA2Atomic = AttentionTC1 + 1

// onepassStep is the query tile streamed by the one-pass kernel: 64 for D =
// 64, 32 for D = 128 (as fa2Step).
func onepassStep(d int) int { return fa2Step(d) }

// onepassSmem: K and V (128 rows), two buffers each of Q and dO (step rows)
// and of lse and delta (step floats each), and the dSᵀ tile (128 × (step +
// 8) bf16).
func onepassSmem(d int) int {
	s := onepassStep(d)
	return (2*fa2Rows+4*s)*(d+8)*2 + 16*s + fa2Rows*(s+8)*2
}

// useOnePass says whether the backward takes the one-pass kernels.
func (b *Backend) useOnePass() bool { return b.hasFA2 && b.cfg.attention == AttentionFA2Atomic }

// attentionBackwardOnePass launches delta (with dq's accumulator zeroed),
// the one-pass kernel (dk, dv, dq's fp32 sums by atomics) and dq's
// conversion; strides as attentionBackwardFA2.
func (b *Backend) attentionBackwardOnePass(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32, nb, nt, nh, d, sqkv, so, sd int) {
	rowsN := nb * nh * nt
	b.do("AttentionBackward", func(dev gpu.Device) error {
		delta, dsize, err := b.scratch(tensor.Float32, rowsN)
		if err != nil {
			return err
		}
		defer b.putScratch(delta, dsize)
		acc, asize, err := b.scratch(tensor.Float32, rowsN*d)
		if err != nil {
			return err
		}
		defer b.putScratch(acc, asize)
		rowsPerBlock := 256 * 8 / d
		if err := dev.Launch(fmt.Sprintf("attn_bwd_onepass_pre_d%d_bf16", d), gpu.D1(ceilDiv(rowsN, rowsPerBlock)), gpu.D1(256), 0,
			delta, acc, ptr(out), ptr(dout), int32(nb), int32(nt), int32(nh), int32(so)); err != nil {
			return err
		}
		if err := dev.Launch(fmt.Sprintf("attn_bwd_onepass_d%d_bf16", d), gpu.D2(ceilDiv(nt, fa2Rows), nb*nh), gpu.D1(256), onepassSmem(d),
			ptr(dk), ptr(dv), acc, ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), delta,
			int32(nb), int32(nt), int32(nh), int32(sqkv), int32(so), int32(sd), scale); err != nil {
			return err
		}
		return dev.Launch("attn_bwd_onepass_dq_bf16", b.gridStride(rowsN*d/8, 1), gpu.D1(256), 0,
			ptr(dq), acc, int32(nb), int32(nt), int32(nh), int32(d), int32(sd), scale)
	})
}
