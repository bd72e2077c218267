package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// RMSNorm sets out = x / rms(x) · w over the last dim, and rstd = 1/rms(x)
// per row, where rms(x) = sqrt(mean(x²) + eps).
//
//	x, out (N, C); w (C); rstd (N), Float32 or x's dtype
func (bk *Backend) RMSNorm(out, rstd, x, w *tensor.Tensor, eps float32) {
	c := bk.check("RMSNorm")
	n, cols := opcheck.RMSNorm(c, out, rstd, x, w)
	if !c.OK() {
		return
	}
	switch {
	case x.DType() == tensor.Float32:
		rmsNorm(bk, out.F32(), rstd.F32(), x.F32(), w.F32(), n, cols, eps)
	case rstd.DType() == tensor.Float64:
		rmsNorm(bk, out.F64(), rstd.F64(), x.F64(), w.F64(), n, cols, eps)
	default:
		rmsNorm(bk, out.F64(), rstd.F32(), x.F64(), w.F64(), n, cols, eps)
	}
}

func rmsNorm[T, S float](bk *Backend, out []T, rstd []S, x, w []T, n, cols int, eps float32) {
	bk.parallelFor(n, cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := x[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
			var ss T
			for _, v := range xr {
				ss += v * v
			}
			rs := T(1 / math.Sqrt(float64(ss)/float64(cols)+float64(eps)))
			for j, v := range xr {
				or[j] = v * rs * w[j]
			}
			rstd[r] = S(rs)
		}
	})
}

// RMSNormBackward sets dx (overwritten) and accumulates dw += ∂L/∂w, from
// dout and the forward's x, w and rstd:
//
//	dx = rstd·w·dout − rstd³/C · x · Σ_k w_k·dout_k·x_k   (per row)
//	dw += Σ_n dout·x·rstd
func (bk *Backend) RMSNormBackward(dx, dw, dout, x, w, rstd *tensor.Tensor) {
	c := bk.check("RMSNormBackward")
	n, cols := opcheck.RMSNormBackward(c, dx, dw, dout, x, w, rstd)
	if !c.OK() {
		return
	}
	switch {
	case x.DType() == tensor.Float32:
		rmsNormBackward(bk, dx.F32(), dw.F32(), dout.F32(), x.F32(), w.F32(), rstd.F32(), n, cols)
	case rstd.DType() == tensor.Float64:
		rmsNormBackward(bk, dx.F64(), dw.F64(), dout.F64(), x.F64(), w.F64(), rstd.F64(), n, cols)
	default:
		rmsNormBackward(bk, dx.F64(), dw.F64(), dout.F64(), x.F64(), w.F64(), rstd.F32(), n, cols)
	}
}

func rmsNormBackward[T, S float](bk *Backend, dx, dw, dout, x, w []T, rstd []S, n, cols int) {
	// dw first: dx may alias dout.
	bk.parallelFor(cols, n, func(lo, hi int) {
		acc := make([]T, hi-lo)
		for r := range n {
			rs := T(rstd[r])
			xr, dr := x[r*cols+lo:r*cols+hi], dout[r*cols+lo:r*cols+hi]
			for j := range acc {
				acc[j] += dr[j] * xr[j] * rs
			}
		}
		for j, v := range acc {
			dw[lo+j] += v
		}
	})
	bk.parallelFor(n, cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rs := T(rstd[r])
			xr, dr, dxr := x[r*cols:(r+1)*cols], dout[r*cols:(r+1)*cols], dx[r*cols:(r+1)*cols]
			var dot T
			for j, v := range xr {
				dot += w[j] * dr[j] * v
			}
			k := rs * rs * rs * dot / T(cols)
			for j, v := range xr {
				dxr[j] = rs*w[j]*dr[j] - k*v
			}
		}
	})
}

// AddRMSNorm sets h = x + r, then out = RMSNorm(h)·w and rstd, with the
// arithmetic of Add then RMSNorm (the reference of the fused kernel).
func (bk *Backend) AddRMSNorm(h, out, rstd, x, r, w *tensor.Tensor, eps float32) {
	c := bk.check("AddRMSNorm")
	n, cols := opcheck.AddRMSNorm(c, h, out, rstd, x, r, w)
	if !c.OK() {
		return
	}
	switch {
	case x.DType() == tensor.Float32:
		add(bk, h.F32(), x.F32(), r.F32())
		rmsNorm(bk, out.F32(), rstd.F32(), h.F32(), w.F32(), n, cols, eps)
	case rstd.DType() == tensor.Float64:
		add(bk, h.F64(), x.F64(), r.F64())
		rmsNorm(bk, out.F64(), rstd.F64(), h.F64(), w.F64(), n, cols, eps)
	default:
		add(bk, h.F64(), x.F64(), r.F64())
		rmsNorm(bk, out.F64(), rstd.F32(), h.F64(), w.F64(), n, cols, eps)
	}
}

// RMSNormBackwardAdd sets dx = RMSNormBackward's dx + dres (dx may alias
// dres or dout) and adds to dw, with the arithmetic of RMSNormBackward then
// Add.
func (bk *Backend) RMSNormBackwardAdd(dx, dw, dout, h, w, rstd, dres *tensor.Tensor) {
	c := bk.check("RMSNormBackwardAdd")
	n, cols := opcheck.RMSNormBackwardAdd(c, dx, dw, dout, h, w, rstd, dres)
	if !c.OK() {
		return
	}
	switch {
	case h.DType() == tensor.Float32:
		tmp := make([]float32, n*cols)
		rmsNormBackward(bk, tmp, dw.F32(), dout.F32(), h.F32(), w.F32(), rstd.F32(), n, cols)
		add(bk, dx.F32(), tmp, dres.F32())
	case rstd.DType() == tensor.Float64:
		tmp := make([]float64, n*cols)
		rmsNormBackward(bk, tmp, dw.F64(), dout.F64(), h.F64(), w.F64(), rstd.F64(), n, cols)
		add(bk, dx.F64(), tmp, dres.F64())
	default:
		tmp := make([]float64, n*cols)
		rmsNormBackward(bk, tmp, dw.F64(), dout.F64(), h.F64(), w.F64(), rstd.F32(), n, cols)
		add(bk, dx.F64(), tmp, dres.F64())
	}
}
