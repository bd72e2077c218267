package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// Add sets dst = a + b (same shape and dtype; dst may alias a or b).
func (b *Backend) Add(dst, a, bb *tensor.Tensor) {
	c := b.check("Add")
	n := opcheck.Elementwise(c, []string{"a", "b", "dst"}, a, bb, dst)
	if !c.OK() || n == 0 {
		return
	}
	b.launch("Add", "add"+sfx(a.DType()), b.gridStride(n, packOf(a.DType().Size())), gpu.D1(threads256), 0,
		ptr(dst), ptr(a), ptr(bb), int64(n))
}

// Scale sets dst = s·a (dst may alias a).
func (b *Backend) Scale(dst, a *tensor.Tensor, s float32) {
	c := b.check("Scale")
	n := opcheck.Elementwise(c, []string{"a", "dst"}, a, dst)
	if !c.OK() || n == 0 {
		return
	}
	b.launch("Scale", "scale"+sfx(a.DType()), b.gridStride(n, packOf(a.DType().Size())), gpu.D1(threads256), 0,
		ptr(dst), ptr(a), s, int64(n))
}

// Axpy sets y += alpha·x (y may alias x).
func (b *Backend) Axpy(y *tensor.Tensor, alpha float32, x *tensor.Tensor) {
	c := b.check("Axpy")
	n := opcheck.Elementwise(c, []string{"x", "y"}, x, y)
	if !c.OK() || n == 0 {
		return
	}
	b.launch("Axpy", "axpy"+sfx(x.DType()), b.gridStride(n, packOf(x.DType().Size())), gpu.D1(threads256), 0,
		ptr(y), alpha, ptr(x), int64(n))
}

// AddBias adds bias (C) to every row of x (N, C) (x may have more leading
// dimensions).
func (b *Backend) AddBias(x, bias *tensor.Tensor) {
	c := b.check("AddBias")
	n, cols := opcheck.RowsVec(c, x, "bias", bias)
	fits(c, "C", cols)
	if !c.OK() || x.Numel() == 0 {
		return
	}
	b.launch("AddBias", "add_bias"+sfx(x.DType()), b.gridStride(x.Numel(), packOf(x.DType().Size())), gpu.D1(threads256), 0,
		ptr(x), ptr(bias), int64(n), int32(cols))
}

// SumRows adds the sum of the rows of x (N, C) to dst (C), the bias
// gradient, deterministically: per-chunk partial sums (fp32) then their sum
// in chunk order (see colsumPlan).
func (b *Backend) SumRows(dst, x *tensor.Tensor) {
	c := b.check("SumRows")
	n, cols := opcheck.RowsVec(c, x, "dst", dst)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 || cols == 0 {
		return
	}
	suffix := sfx(x.DType())
	b.columnSum("SumRows", dst, n, cols, func(d gpu.Device, partial gpu.Ptr, r, rpc int) error {
		return d.Launch("colsum_partial"+suffix, gpu.D2(ceilDiv(cols, 32), r), gpu.D2(32, 8), 0,
			partial, ptr(x), int32(n), int32(cols), int32(rpc))
	})
}

// colsumPlan splits n rows of cols columns into r chunks of rpc rows for the
// two-stage column sums: about four blocks (32 columns each) per SM, at
// least 8 rows per chunk. It depends only on the shape and the SM count, so
// runs on one GPU are bit-for-bit repeatable.
func (b *Backend) colsumPlan(n, cols int) (r, rpc int) {
	colBlocks := ceilDiv(cols, 32)
	r = max(1, min(ceilDiv(4*max(b.dev.SMCount(), 1), colBlocks), ceilDiv(n, 8)))
	rpc = ceilDiv(n, r)
	return ceilDiv(n, rpc), rpc
}

// columnSum runs a two-stage column sum into dst (C) +=: partial writes
// (r, cols) fp32 partial sums into a scratch buffer, then colsum_finish adds
// them in order into dst.
func (b *Backend) columnSum(op string, dst *tensor.Tensor, n, cols int, partial func(d gpu.Device, p gpu.Ptr, r, rpc int) error) {
	r, rpc := b.colsumPlan(n, cols)
	b.do(op, func(d gpu.Device) error {
		p, size, err := b.scratch(tensor.Float32, r*cols)
		if err != nil {
			return err
		}
		defer b.putScratch(p, size)
		if err := partial(d, p, r, rpc); err != nil {
			return err
		}
		return d.Launch("colsum_finish"+sfx(dst.DType()), gpu.D1(ceilDiv(cols, threads256)), gpu.D1(threads256), 0,
			ptr(dst), p, int32(r), int32(cols))
	})
}
