package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// checkNorm validates x (N, C), w (C) and rstd (N elements, Float32).
func checkNorm(c *checker, x, w, rstd *tensor.Tensor) (n, cols int) {
	checkRowsVec(c, x, "w", w)
	if c.failed() {
		return 0, 0
	}
	c.dtype("rstd", rstd, tensor.Float32)
	n, cols = rows(x)
	if !c.failed() && rstd.Numel() != n {
		c.failf("rstd has shape %v, expected %v (one value per row of x %v)", rstd.Shape(), outer(x.Shape()), x.Shape())
	}
	c.fits("N", n)
	c.fits("C", cols)
	return n, cols
}

// RMSNorm sets out = x / rms(x) · w over the last dim and rstd = 1/rms(x)
// per row (fp32), rms(x) = sqrt(mean(x²) + eps). x, out (N, C); w (C); one
// warp per row.
func (b *Backend) RMSNorm(out, rstd, x, w *tensor.Tensor, eps float32) {
	c := b.check("RMSNorm")
	n, cols := checkNorm(c, x, w, rstd)
	c.like("out", out, "x", x)
	if !c.ok() || n == 0 {
		return
	}
	b.launch("RMSNorm", "rmsnorm_fwd"+sfx(x.DType()), rowGrid(n), gpu.D1(threads256), 0,
		ptr(out), ptr(rstd), ptr(x), ptr(w), int32(n), int32(cols), eps)
}

// RMSNormBackward sets dx (overwritten) and adds to dw from dout, the
// forward's x, w and rstd. dw is summed deterministically (per-chunk fp32
// partials, then in chunk order).
func (b *Backend) RMSNormBackward(dx, dw, dout, x, w, rstd *tensor.Tensor) {
	c := b.check("RMSNormBackward")
	n, cols := checkNorm(c, x, w, rstd)
	c.like("dout", dout, "x", x)
	c.like("dx", dx, "x", x)
	c.like("dw", dw, "w", w)
	if !c.ok() || n == 0 {
		return
	}
	s := sfx(x.DType())
	b.launch("RMSNormBackward", "rmsnorm_bwd_dx"+s, rowGrid(n), gpu.D1(threads256), 0,
		ptr(dx), ptr(dout), ptr(x), ptr(w), ptr(rstd), int32(n), int32(cols))
	if cols == 0 {
		return
	}
	b.columnSum("RMSNormBackward", dw, n, cols, func(d gpu.Device, partial gpu.Ptr, r, rpc int) error {
		return d.Launch("rmsnorm_dw_partial"+s, gpu.D2(ceilDiv(cols, 32), r), gpu.D2(32, 8), 0,
			partial, ptr(dout), ptr(x), ptr(rstd), int32(n), int32(cols), int32(rpc))
	})
}
