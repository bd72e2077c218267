package cudabackend

import (
	"math"
	"unsafe"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// AdamW updates p in place from the gradient g with the moments m and v, in
// one launch over the flat buffers:
//
//	g' = GradScale·g   (GradScale 0 means 1)
//	m = β1·m + (1−β1)·g';  v = β2·v + (1−β2)·g'²
//	w −= LR·(m/(1−β1^t) / (sqrt(v/(1−β2^t)) + ε) + WeightDecay·w)
//
// computed in fp32 on w = master when master is not nil (p then receives
// master rounded to p's dtype), else on p itself. p and g are BFloat16 or
// Float32; m, v and master are Float32; all have the same numel. (A bf16 p
// without master is updated through fp32 and rounded each step: allowed,
// though the CPU reference refuses it.)
func (b *Backend) AdamW(p, g, m, v, master *tensor.Tensor, hp tensor.AdamW) {
	c := b.check("AdamW")
	opcheck.AdamW(c, p, g, m, v, master, hp)
	if !c.OK() || p.Numel() == 0 {
		return
	}
	gs := hp.GradScale
	if gs == 0 {
		gs = 1
	}
	var normSq gpu.Ptr // null: no device-side clipping
	if hp.NormSq != nil {
		normSq = ptr(hp.NormSq)
	}
	bc1 := float32(1 - math.Pow(float64(hp.Beta1), float64(hp.Step)))
	bc2 := float32(1 - math.Pow(float64(hp.Beta2), float64(hp.Step)))
	n := p.Numel()
	name := "adamw" + sfx(p.DType()) + sfx(g.DType())
	b.launch("AdamW", name, b.gridStride(n, 4), gpu.D1(threads256), 0,
		ptr(p), ptr(g), ptr(m), ptr(v), ptr(master), int64(n),
		hp.LR, hp.Beta1, hp.Beta2, hp.Eps, hp.WeightDecay, bc1, bc2, gs, normSq, hp.Clip)
}

// sumsqBlocks is the number of partial sums of Σ x² over n elements of x:
// it depends on n only, not on the GPU, so the result does not either.
func sumsqBlocks(x *tensor.Tensor) int {
	return min(ceilDiv(x.Numel(), threads256*packOf(x.DType().Size())), 1024)
}

// SumSquaresTo adds Σ x² to dst[0] (fp32) on the stream, without waiting:
// the same fp64 partial sums as SumSquares, added in block order on the
// device by sumsq_finish and rounded once.
func (b *Backend) SumSquaresTo(dst, x *tensor.Tensor) {
	c := b.check("SumSquaresTo")
	opcheck.SumSquaresTo(c, dst, x)
	if !c.OK() || x.Numel() == 0 {
		return
	}
	blocks := sumsqBlocks(x)
	b.do("SumSquaresTo", func(d gpu.Device) error {
		s, size, err := b.scratch(tensor.Float32, 2*blocks)
		if err != nil {
			return err
		}
		defer b.putScratch(s, size) // reused in stream order, after sumsq_finish
		if err := d.Launch("sumsq_partial"+sfx(x.DType()), gpu.D1(blocks), gpu.D1(threads256), 0, s, ptr(x), int64(x.Numel())); err != nil {
			return err
		}
		return d.Launch("sumsq_finish", gpu.D1(1), gpu.D1(1), 0, ptr(dst), s, int32(blocks))
	})
}

// SumSquares returns Σ x² (fp64 partial sums per block, added on the host in
// block order), waiting for the result. It returns 0 when an error is
// recorded.
func (b *Backend) SumSquares(x *tensor.Tensor) float64 {
	c := b.check("SumSquares")
	opcheck.SumSquares(c, x)
	if !c.OK() || x.Numel() == 0 {
		return 0
	}
	n := x.Numel()
	blocks := sumsqBlocks(x)
	partial := make([]float64, blocks)
	b.do("SumSquares", func(d gpu.Device) error {
		s, size, err := b.scratch(tensor.Float32, 2*blocks)
		if err != nil {
			return err
		}
		defer b.putScratch(s, size)
		if err := d.Launch("sumsq_partial"+sfx(x.DType()), gpu.D1(blocks), gpu.D1(threads256), 0, s, ptr(x), int64(n)); err != nil {
			return err
		}
		if err := d.CopyDtoH(unsafe.Pointer(&partial[0]), s, 8*blocks); err != nil {
			return err
		}
		b.readFlags()
		return nil
	})
	if b.failed() {
		return 0
	}
	var sum float64
	for _, v := range partial {
		sum += v
	}
	return sum
}
