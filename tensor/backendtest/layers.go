package backendtest

import (
	"testing"

	"github.com/asynctp/asynctp/internal/testutil"
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
