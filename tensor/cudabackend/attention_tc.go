package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// The tensor-core attention kernels (cuda/kernels/attention_tc.cu): bf16,
// D = 64 or 128, 16-byte aligned tensors; 64 rows per block, 4 warps.

// tcKernelProbe is a kernel whose presence says the image has them.
const tcKernelProbe = "attn_fwd_tc_d64_bf16"

// tcAligned reports whether every tensor starts on a 16-byte boundary (the
// kernels copy 16-byte chunks with cp.async).
func tcAligned(ts ...*tensor.Tensor) bool {
	for _, t := range ts {
		if ptr(t)%16 != 0 {
			return false
		}
	}
	return true
}

// tcSmemFwd is the forward's dynamic shared memory: Q (64 rows) and two
// buffers each of K and V (64 rows), rows of D + 8 bf16.
func tcSmemFwd(d int) int { return (64 + 4*64) * (d + 8) * 2 }

// tcBwdStep is the tile of the streamed rows in the backward kernels: 64 for
// D = 64, 32 for D = 128 (register budget).
func tcBwdStep(d int) int {
	if d == 128 {
		return 32
	}
	return 64
}

// tcSmemDkdv: K and V (64 rows), two buffers each of Q and dO (step rows),
// and two buffers of lse and delta (step floats each).
func tcSmemDkdv(d int) int { s := tcBwdStep(d); return (2*64+4*s)*(d+8)*2 + 16*s }

// tcSmemDq: Q and dO (64 rows), two buffers each of K and V (step rows).
func tcSmemDq(d int) int { return (2*64 + 4*tcBwdStep(d)) * (d + 8) * 2 }

func (b *Backend) attentionTC(out, lse, q, k, v *tensor.Tensor, scale float32, nb, nt, nh, d int) {
	name := fmt.Sprintf("attn_fwd_tc_d%d_bf16", d)
	grid := gpu.D2(ceilDiv(nt, 64), nb*nh)
	b.launch("Attention", name, grid, gpu.D1(128), tcSmemFwd(d),
		ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), int32(nb), int32(nt), int32(nh), scale)
}

func (b *Backend) attentionBackwardTC(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32, nb, nt, nh, d int) {
	rowsN := nb * nt * nh
	grid := gpu.D2(ceilDiv(nt, 64), nb*nh)
	b.do("AttentionBackward", func(dev gpu.Device) error {
		delta, size, err := b.scratch(tensor.Float32, rowsN)
		if err != nil {
			return err
		}
		defer b.putScratch(delta, size)
		if err := dev.Launch("attn_bwd_delta_bf16", rowGrid(rowsN), gpu.D1(threads256), 0,
			delta, ptr(dout), ptr(out), int32(nb), int32(nt), int32(nh), int32(d)); err != nil {
			return err
		}
		if err := dev.Launch(fmt.Sprintf("attn_bwd_dkdv_tc_d%d_bf16", d), grid, gpu.D1(128), tcSmemDkdv(d),
			ptr(dk), ptr(dv), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), delta,
			int32(nb), int32(nt), int32(nh), scale); err != nil {
			return err
		}
		return dev.Launch(fmt.Sprintf("attn_bwd_dq_tc_d%d_bf16", d), grid, gpu.D1(128), tcSmemDq(d),
			ptr(dq), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), delta,
			int32(nb), int32(nt), int32(nh), scale)
	})
}
