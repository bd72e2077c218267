package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// RMSNorm sets out = x / rms(x) · w over the last dim and rstd = 1/rms(x)
// per row (fp32), rms(x) = sqrt(mean(x²) + eps). x, out (N, C); w (C); one
// warp per row.
func (b *Backend) RMSNorm(out, rstd, x, w *tensor.Tensor, eps float32) {
	c := b.check("RMSNorm")
	n, cols := opcheck.RMSNorm(c, out, rstd, x, w)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 {
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
	n, cols := opcheck.RMSNormBackward(c, dx, dw, dout, x, w, rstd)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 {
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

// AddRMSNorm sets h = x + r and out = h / rms(h) · w, rstd = 1/rms(h), in
// one launch (add_rmsnorm_fwd: one warp per row, h written once and read
// back by the same warp): the residual add and the norm after it, one pass
// over the stream instead of three.
func (b *Backend) AddRMSNorm(h, out, rstd, x, r, w *tensor.Tensor, eps float32) {
	c := b.check("AddRMSNorm")
	n, cols := opcheck.AddRMSNorm(c, h, out, rstd, x, r, w)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 {
		return
	}
	b.launch("AddRMSNorm", "add_rmsnorm_fwd"+sfx(x.DType()), rowGrid(n), gpu.D1(threads256), 0,
		ptr(h), ptr(out), ptr(rstd), ptr(x), ptr(r), ptr(w), int32(n), int32(cols), eps)
}

// RMSNormBackwardAdd sets dx = RMSNormBackward's dx at h + dres (one launch
// for dx, rmsnorm_bwd_dx_add; dx may alias dres) and adds to dw as
// RMSNormBackward does.
func (b *Backend) RMSNormBackwardAdd(dx, dw, dout, h, w, rstd, dres *tensor.Tensor) {
	c := b.check("RMSNormBackwardAdd")
	n, cols := opcheck.RMSNormBackwardAdd(c, dx, dw, dout, h, w, rstd, dres)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 {
		return
	}
	s := sfx(h.DType())
	if cols > 0 { // dw first: dx may alias dout
		b.columnSum("RMSNormBackwardAdd", dw, n, cols, func(d gpu.Device, partial gpu.Ptr, r, rpc int) error {
			return d.Launch("rmsnorm_dw_partial"+s, gpu.D2(ceilDiv(cols, 32), r), gpu.D2(32, 8), 0,
				partial, ptr(dout), ptr(h), ptr(rstd), int32(n), int32(cols), int32(rpc))
		})
	}
	b.launch("RMSNormBackwardAdd", "rmsnorm_bwd_dx_add"+s, rowGrid(n), gpu.D1(threads256), 0,
		ptr(dx), ptr(dout), ptr(h), ptr(w), ptr(rstd), ptr(dres), int32(n), int32(cols))
}
