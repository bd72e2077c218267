package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// elementwise checks tensors of one shape and dtype for an elementwise op:
// the first is the reference, and names gives their names for the errors.
func (bk *Backend) elementwise(op string, names []string, ts ...*tensor.Tensor) bool {
	c := bk.check(op)
	opcheck.Elementwise(c, names, ts...)
	return c.OK()
}

// SwiGLU sets out = silu(gate)·up, elementwise, where silu(g) = g·σ(g). out
// may alias gate or up.
func (bk *Backend) SwiGLU(out, gate, up *tensor.Tensor) {
	if !bk.elementwise("SwiGLU", []string{"gate", "up", "out"}, gate, up, out) {
		return
	}
	switch gate.DType() {
	case tensor.Float32:
		swiGLU(bk, out.F32(), gate.F32(), up.F32())
	case tensor.Float64:
		swiGLU(bk, out.F64(), gate.F64(), up.F64())
	}
}

func sigmoid[T float](x T) T { return T(1 / (1 + math.Exp(-float64(x)))) }

func swiGLU[T float](bk *Backend, out, gate, up []T) {
	bk.parallelFor(len(out), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g := gate[i]
			out[i] = g * sigmoid(g) * up[i]
		}
	})
}

// SwiGLUBackward sets dgate and dup (overwritten) from dout:
//
//	dgate = dout·up·σ(g)·(1 + g·(1 − σ(g)));  dup = dout·silu(g)
func (bk *Backend) SwiGLUBackward(dgate, dup, dout, gate, up *tensor.Tensor) {
	if !bk.elementwise("SwiGLUBackward", []string{"gate", "up", "dout", "dgate", "dup"}, gate, up, dout, dgate, dup) {
		return
	}
	switch gate.DType() {
	case tensor.Float32:
		swiGLUBackward(bk, dgate.F32(), dup.F32(), dout.F32(), gate.F32(), up.F32())
	case tensor.Float64:
		swiGLUBackward(bk, dgate.F64(), dup.F64(), dout.F64(), gate.F64(), up.F64())
	}
}

func swiGLUBackward[T float](bk *Backend, dgate, dup, dout, gate, up []T) {
	bk.parallelFor(len(dout), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			g, u, d := gate[i], up[i], dout[i]
			s := sigmoid(g)
			dgate[i] = d * u * s * (1 + g*(1-s))
			dup[i] = d * g * s
		}
	})
}

// SwiGLUPacked sets out (N, F) = silu(gate)·up from the packed rows gu
// (N, 2F) = [gate | up], with SwiGLU's arithmetic.
func (bk *Backend) SwiGLUPacked(out, gu *tensor.Tensor) {
	c := bk.check("SwiGLUPacked")
	n, f := opcheck.SwiGLUPacked(c, out, gu)
	if !c.OK() {
		return
	}
	switch gu.DType() {
	case tensor.Float32:
		swiGLUPacked(bk, out.F32(), gu.F32(), n, f)
	case tensor.Float64:
		swiGLUPacked(bk, out.F64(), gu.F64(), n, f)
	}
}

func swiGLUPacked[T float](bk *Backend, out, gu []T, n, f int) {
	bk.parallelFor(n, 16*f, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u, o := gu[2*r*f:][:f], gu[(2*r+1)*f:][:f], out[r*f:][:f]
			for i := range o {
				o[i] = g[i] * sigmoid(g[i]) * u[i]
			}
		}
	})
}

// SwiGLUPackedBackward sets dgu (N, 2F) = [dgate | dup] per row from dout
// (N, F) and the packed gu, with SwiGLUBackward's arithmetic.
func (bk *Backend) SwiGLUPackedBackward(dgu, dout, gu *tensor.Tensor) {
	c := bk.check("SwiGLUPackedBackward")
	n, f := opcheck.SwiGLUPackedBackward(c, dgu, dout, gu)
	if !c.OK() {
		return
	}
	switch gu.DType() {
	case tensor.Float32:
		swiGLUPackedBackward(bk, dgu.F32(), dout.F32(), gu.F32(), n, f)
	case tensor.Float64:
		swiGLUPackedBackward(bk, dgu.F64(), dout.F64(), gu.F64(), n, f)
	}
}

func swiGLUPackedBackward[T float](bk *Backend, dgu, dout, gu []T, n, f int) {
	bk.parallelFor(n, 16*f, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, u, d := gu[2*r*f:][:f], gu[(2*r+1)*f:][:f], dout[r*f:][:f]
			dg, du := dgu[2*r*f:][:f], dgu[(2*r+1)*f:][:f]
			for i := range d {
				s := sigmoid(g[i])
				dg[i] = d[i] * u[i] * s * (1 + g[i]*(1-s))
				du[i] = d[i] * g[i] * s
			}
		}
	})
}

// geluC is sqrt(2/π), geluA the cubic coefficient of the tanh approximation.
const (
	geluC = 0.7978845608028654
	geluA = 0.044715
)

// GELU sets out = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))). out may
// alias x.
func (bk *Backend) GELU(out, x *tensor.Tensor) {
	if !bk.elementwise("GELU", []string{"x", "out"}, x, out) {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		gelu(bk, out.F32(), x.F32())
	case tensor.Float64:
		gelu(bk, out.F64(), x.F64())
	}
}

func gelu[T float](bk *Backend, out, x []T) {
	bk.parallelFor(len(out), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			v := float64(x[i])
			out[i] = T(0.5 * v * (1 + math.Tanh(geluC*(v+geluA*v*v*v))))
		}
	})
}

// GELUBackward sets dx = dout·gelu'(x) (overwritten).
func (bk *Backend) GELUBackward(dx, dout, x *tensor.Tensor) {
	if !bk.elementwise("GELUBackward", []string{"x", "dout", "dx"}, x, dout, dx) {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		geluBackward(bk, dx.F32(), dout.F32(), x.F32())
	case tensor.Float64:
		geluBackward(bk, dx.F64(), dout.F64(), x.F64())
	}
}

func geluBackward[T float](bk *Backend, dx, dout, x []T) {
	bk.parallelFor(len(dx), 16, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			v := float64(x[i])
			t := math.Tanh(geluC * (v + geluA*v*v*v))
			d := 0.5*(1+t) + 0.5*v*(1-t*t)*geluC*(1+3*geluA*v*v)
			dx[i] = T(float64(dout[i]) * d)
		}
	})
}

// Softmax sets out = softmax(x) over the last dimension (max-subtracted).
// out may alias x.
func (bk *Backend) Softmax(out, x *tensor.Tensor) {
	c := bk.check("Softmax")
	n, cols := opcheck.Softmax(c, out, x)
	if !c.OK() {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		softmax(bk, out.F32(), x.F32(), n, cols)
	case tensor.Float64:
		softmax(bk, out.F64(), x.F64(), n, cols)
	}
}

func softmax[T float](bk *Backend, out, x []T, n, cols int) {
	bk.parallelFor(n, 16*cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := x[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
			m := T(math.Inf(-1))
			for _, v := range xr {
				m = max(m, v)
			}
			var sum T
			for j, v := range xr {
				e := T(math.Exp(float64(v - m)))
				or[j] = e
				sum += e
			}
			inv := 1 / sum
			for j := range or {
				or[j] *= inv
			}
		}
	})
}

// SoftmaxBackward sets dx = out·(dout − Σ dout·out), row by row
// (overwritten; dx may alias dout).
func (bk *Backend) SoftmaxBackward(dx, dout, out *tensor.Tensor) {
	c := bk.check("SoftmaxBackward")
	n, cols := opcheck.SoftmaxBackward(c, dx, dout, out)
	if !c.OK() {
		return
	}
	switch out.DType() {
	case tensor.Float32:
		softmaxBackward(bk, dx.F32(), dout.F32(), out.F32(), n, cols)
	case tensor.Float64:
		softmaxBackward(bk, dx.F64(), dout.F64(), out.F64(), n, cols)
	}
}

func softmaxBackward[T float](bk *Backend, dx, dout, out []T, n, cols int) {
	bk.parallelFor(n, 2*cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			dr, or, dxr := dout[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols], dx[r*cols:(r+1)*cols]
			var s T
			for j, v := range dr {
				s += v * or[j]
			}
			for j, v := range dr {
				dxr[j] = or[j] * (v - s)
			}
		}
	})
}
