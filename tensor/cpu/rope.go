package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// RoPE rotates x (B, T, H, D) by position: for t < T and i < D/2 the pair
// (x[..., i], x[..., i+D/2]) turns by the angle t·theta^(−2i/D). out may
// alias x.
func (bk *Backend) RoPE(out, x *tensor.Tensor, theta float64) {
	c := bk.check("RoPE")
	opcheck.RoPE(c, out, x)
	if !c.OK() {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		rope(bk, out.F32(), x.F32(), x.Shape(), theta, 1)
	case tensor.Float64:
		rope(bk, out.F64(), x.F64(), x.Shape(), theta, 1)
	}
}

// RoPEBackward sets dx to dout turned back by the same angles (overwritten;
// dx may alias dout).
func (bk *Backend) RoPEBackward(dx, dout *tensor.Tensor, theta float64) {
	c := bk.check("RoPEBackward")
	opcheck.RoPEBackward(c, dx, dout)
	if !c.OK() {
		return
	}
	switch dout.DType() {
	case tensor.Float32:
		rope(bk, dx.F32(), dout.F32(), dout.Shape(), theta, -1)
	case tensor.Float64:
		rope(bk, dx.F64(), dout.F64(), dout.Shape(), theta, -1)
	}
}

// rope turns each pair by sign·angle (sign −1 is the inverse rotation, the
// backward).
func rope[T float](bk *Backend, out, x []T, s tensor.Shape, theta float64, sign T) {
	nb, nt, nh, d := s[0], s[1], s[2], s[3]
	half := d / 2
	cos := make([]T, nt*half) // (T, D/2)
	sin := make([]T, nt*half)
	for t := range nt {
		for i := range half {
			a := float64(t) * math.Pow(theta, -2*float64(i)/float64(d))
			cos[t*half+i] = T(math.Cos(a))
			sin[t*half+i] = sign * T(math.Sin(a))
		}
	}
	bk.parallelFor(nb*nt, nh*d, func(lo, hi int) {
		for bt := lo; bt < hi; bt++ {
			t := bt % nt
			cs, sn := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
			for h := range nh {
				o := (bt*nh + h) * d
				xr, or := x[o:o+d], out[o:o+d]
				for i := range half {
					x1, x2 := xr[i], xr[i+half]
					or[i] = x1*cs[i] - x2*sn[i]
					or[i+half] = x2*cs[i] + x1*sn[i]
				}
			}
		}
	})
}
