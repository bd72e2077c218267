package backendtest

import (
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestRMSNorm checks RMSNorm (out, rstd) and its backward (dx overwritten,
// dw accumulated).
func TestRMSNorm(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 6)
	const n, c = 37, 50
	x, w := h.rand(h.dt, n, c), h.rand(h.dt, c)
	out, rstd := h.out(h.dt, n, c), h.out(tensor.Float32, n)
	h.b.RMSNorm(out.dev, rstd.dev, x.dev, w.dev, 1e-5)
	h.ref.RMSNorm(out.ref, rstd.ref, x.ref, w.ref, 1e-5)
	h.compare("RMSNorm out", out)
	h.compare("RMSNorm rstd", rstd)

	dout, dx, dw := h.rand(h.dt, n, c), h.out(h.dt, n, c), h.rand(h.dt, c)
	h.b.RMSNormBackward(dx.dev, dw.dev, dout.dev, x.dev, w.dev, rstd.dev)
	h.ref.RMSNormBackward(dx.ref, dw.ref, dout.ref, x.ref, w.ref, rstd.ref)
	h.compare("RMSNormBackward dx", dx)
	h.compare("RMSNormBackward dw", dw)
}

// TestSwiGLU checks SwiGLU, in place too, and its backward.
func TestSwiGLU(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 7)
	const n, f = 37, 50
	gate, up, out := h.rand(h.dt, n, f), h.rand(h.dt, n, f), h.out(h.dt, n, f)
	h.b.SwiGLU(out.dev, gate.dev, up.dev)
	h.ref.SwiGLU(out.ref, gate.ref, up.ref)
	h.compare("SwiGLU", out)

	dout, dgate, dup := h.rand(h.dt, n, f), h.out(h.dt, n, f), h.out(h.dt, n, f)
	h.b.SwiGLUBackward(dgate.dev, dup.dev, dout.dev, gate.dev, up.dev)
	h.ref.SwiGLUBackward(dgate.ref, dup.ref, dout.ref, gate.ref, up.ref)
	h.compare("SwiGLUBackward dgate", dgate)
	h.compare("SwiGLUBackward dup", dup)

	h.b.SwiGLU(gate.dev, gate.dev, up.dev)
	h.ref.SwiGLU(gate.ref, gate.ref, up.ref)
	h.compare("SwiGLU in place", gate)
}

// TestGELU checks GELU, in place too, and its backward.
func TestGELU(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 8)
	const n, f = 37, 50
	// x in ±[0.3, 3), so that both tails of the tanh are used.
	x, out := h.values(h.dt, testutil.RandFloats(h.rng, n*f, 0.3, 3), n, f), h.out(h.dt, n, f)
	h.b.GELU(out.dev, x.dev)
	h.ref.GELU(out.ref, x.ref)
	h.compare("GELU", out)

	dout, dx := h.rand(h.dt, n, f), h.out(h.dt, n, f)
	h.b.GELUBackward(dx.dev, dout.dev, x.dev)
	h.ref.GELUBackward(dx.ref, dout.ref, x.ref)
	h.compare("GELUBackward", dx)

	h.b.GELU(x.dev, x.dev)
	h.ref.GELU(x.ref, x.ref)
	h.compare("GELU in place", x)
}

// TestSoftmax checks Softmax and its backward, on rows shifted far from 0
// (a kernel that forgets the max-subtraction overflows).
func TestSoftmax(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 9)
	const n, c = 37, 61
	vals := testutil.RandFloats(h.rng, n*c, 0.1, 1)
	for i := range vals {
		vals[i] += 100
	}
	x, out := h.values(h.dt, vals, n, c), h.out(h.dt, n, c)
	h.b.Softmax(out.dev, x.dev)
	h.ref.Softmax(out.ref, x.ref)
	h.compare("Softmax", out)

	dout, dx := h.rand(h.dt, n, c), h.out(h.dt, n, c)
	h.b.SoftmaxBackward(dx.dev, dout.dev, out.dev)
	h.ref.SoftmaxBackward(dx.ref, dout.ref, out.ref)
	h.compare("SoftmaxBackward", dx)
}

// TestRoPE checks RoPE and its backward on (B, T, H, D) = (2, 37, 3, 18).
func TestRoPE(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 10)
	shape := []int{2, 37, 3, 18}
	const theta = 10000
	x, out := h.rand(h.dt, shape...), h.out(h.dt, shape...)
	h.b.RoPE(out.dev, x.dev, theta)
	h.ref.RoPE(out.ref, x.ref, theta)
	h.compare("RoPE", out)

	dout, dx := h.rand(h.dt, shape...), h.out(h.dt, shape...)
	h.b.RoPEBackward(dx.dev, dout.dev, theta)
	h.ref.RoPEBackward(dx.ref, dout.ref, theta)
	h.compare("RoPEBackward", dx)
}

// TestAddRMSNorm checks the residual add fused with RMSNorm, and its
// backward fused with the residual gradient's add, against the reference's
// separate Add and RMSNorm (RMSNormBackward and Add): h and out from x and
// r, with h in place of x too; dx from dout and dres, in place of dres too.
// Outputs start as NaN; the row length is not a multiple of 8 and the rows
// outnumber one block's warps.
func TestAddRMSNorm(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 18)
	for _, c := range []int{50, 768} {
		const n = 37
		x, r, w := h.rand(h.dt, n, c), h.rand(h.dt, n, c), h.rand(h.dt, c)
		hs, out, rstd := h.out(h.dt, n, c), h.out(h.dt, n, c), h.out(tensor.Float32, n)
		h.b.AddRMSNorm(hs.dev, out.dev, rstd.dev, x.dev, r.dev, w.dev, 1e-5)
		h.ref.Add(hs.ref, x.ref, r.ref)
		h.ref.RMSNorm(out.ref, rstd.ref, hs.ref, w.ref, 1e-5)
		h.compare("AddRMSNorm h", hs)
		h.compare("AddRMSNorm out", out)
		h.compare("AddRMSNorm rstd", rstd)

		dout, dres, dw := h.rand(h.dt, n, c), h.rand(h.dt, n, c), h.rand(h.dt, c)
		dx := h.out(h.dt, n, c)
		h.b.RMSNormBackwardAdd(dx.dev, dw.dev, dout.dev, hs.dev, w.dev, rstd.dev, dres.dev)
		h.ref.RMSNormBackward(dx.ref, dw.ref, dout.ref, hs.ref, w.ref, rstd.ref)
		h.ref.Add(dx.ref, dx.ref, dres.ref)
		h.compare("RMSNormBackwardAdd dx", dx)
		h.compare("RMSNormBackwardAdd dw", dw)

		// In place: h over x, dx over dres.
		out2 := h.out(h.dt, n, c)
		h.b.AddRMSNorm(x.dev, out2.dev, rstd.dev, x.dev, r.dev, w.dev, 1e-5)
		h.ref.Add(x.ref, x.ref, r.ref)
		h.ref.RMSNorm(out2.ref, rstd.ref, x.ref, w.ref, 1e-5)
		h.compare("AddRMSNorm h in place of x", x)
		h.compare("AddRMSNorm out (h in place)", out2)
		h.b.RMSNormBackwardAdd(dres.dev, dw.dev, dout.dev, x.dev, w.dev, rstd.dev, dres.dev)
		tmp := tensor.MustHost(tensor.Float64, n, c)
		h.ref.RMSNormBackward(tmp, dw.ref, dout.ref, x.ref, w.ref, rstd.ref)
		h.ref.Add(dres.ref, tmp, dres.ref)
		h.compare("RMSNormBackwardAdd dx in place of dres", dres)
		h.compare("RMSNormBackwardAdd dw (in place)", dw)
	}
}
