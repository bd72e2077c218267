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
	ropeRows(bk, out, x, ropeLayout{nb, nt, nh, d, nh * d, 0, nh * d, 0}, theta, sign)
}

// ropeLayout places the heads of each token in out and x: token bt's head h
// starts at bt·stride + off + h·D in each (a stride of H·D and offset 0 is
// the plain (B, T, H, D) layout; (H + 2·Hkv)·D with offsets 0 and H·D are
// q and k of packed projections).
type ropeLayout struct {
	nb, nt, nh, d     int
	outStride, outOff int
	xStride, xOff     int
}

// RoPEQKV rotates the q and k parts of the packed qkv (B, T, (H + 2·Hkv)·D)
// into q (B, T, H, D) and k (B, T, Hkv, D) and copies its v part into v
// (B, T, Hkv, D): the same arithmetic as RoPE on separate q and k.
func (bk *Backend) RoPEQKV(q, k, v, qkv *tensor.Tensor, theta float64) {
	c := bk.check("RoPEQKV")
	nb, nt, nh, hkv, d := opcheck.RoPEQKV(c, q, k, v, qkv)
	if !c.OK() {
		return
	}
	qd, kd := nh*d, hkv*d
	w := qd + 2*kd
	lq := ropeLayout{nb, nt, nh, d, qd, 0, w, 0}
	lk := ropeLayout{nb, nt, hkv, d, kd, 0, w, qd}
	switch q.DType() {
	case tensor.Float32:
		ropeRows(bk, q.F32(), qkv.F32(), lq, theta, 1)
		ropeRows(bk, k.F32(), qkv.F32(), lk, theta, 1)
		unpack(v.F32(), qkv.F32(), nb*nt, kd, w, qd+kd)
	case tensor.Float64:
		ropeRows(bk, q.F64(), qkv.F64(), lq, theta, 1)
		ropeRows(bk, k.F64(), qkv.F64(), lk, theta, 1)
		unpack(v.F64(), qkv.F64(), nb*nt, kd, w, qd+kd)
	}
}

// RoPEQKVBackward writes dqkv (B, T, (H + 2·Hkv)·D) = [RoPE⁻¹(dq) |
// RoPE⁻¹(dk) | dv] per token.
func (bk *Backend) RoPEQKVBackward(dqkv, dq, dk, dv *tensor.Tensor, theta float64) {
	c := bk.check("RoPEQKVBackward")
	nb, nt, nh, hkv, d := opcheck.RoPEQKVBackward(c, dqkv, dq, dk, dv)
	if !c.OK() {
		return
	}
	qd, kd := nh*d, hkv*d
	w := qd + 2*kd
	lq := ropeLayout{nb, nt, nh, d, w, 0, qd, 0}
	lk := ropeLayout{nb, nt, hkv, d, w, qd, kd, 0}
	switch dq.DType() {
	case tensor.Float32:
		ropeRows(bk, dqkv.F32(), dq.F32(), lq, theta, -1)
		ropeRows(bk, dqkv.F32(), dk.F32(), lk, theta, -1)
		pack(dqkv.F32(), dv.F32(), nb*nt, kd, w, qd+kd)
	case tensor.Float64:
		ropeRows(bk, dqkv.F64(), dq.F64(), lq, theta, -1)
		ropeRows(bk, dqkv.F64(), dk.F64(), lk, theta, -1)
		pack(dqkv.F64(), dv.F64(), nb*nt, kd, w, qd+kd)
	}
}

// unpack copies the w columns from column off of each row of packed (rows,
// stride) into dst (rows, w); pack is the reverse.
func unpack[T float](dst, packed []T, rows, w, stride, off int) {
	for r := range rows {
		copy(dst[r*w:(r+1)*w], packed[r*stride+off:][:w])
	}
}

func pack[T float](packed, src []T, rows, w, stride, off int) {
	for r := range rows {
		copy(packed[r*stride+off:][:w], src[r*w:(r+1)*w])
	}
}

// ropeRows turns each pair of x's heads by sign·angle into out, in the
// layout l.
func ropeRows[T float](bk *Backend, out, x []T, l ropeLayout, theta float64, sign T) {
	nb, nt, nh, d := l.nb, l.nt, l.nh, l.d
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
				xo, oo := bt*l.xStride+l.xOff+h*d, bt*l.outStride+l.outOff+h*d
				xr, or := x[xo:xo+d], out[oo:oo+d]
				for i := range half {
					x1, x2 := xr[i], xr[i+half]
					or[i] = x1*cs[i] - x2*sn[i]
					or[i+half] = x2*cs[i] + x1*sn[i]
				}
			}
		}
	})
}
