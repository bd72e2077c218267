package backendtest

import (
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestElementwise checks Add, Scale and Axpy, out of place and in place.
func TestElementwise(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 4)
	const n, c = 37, 50
	x, y := h.rand(h.dt, n, c), h.rand(h.dt, n, c)

	out := h.out(h.dt, n, c)
	h.b.Add(out.dev, x.dev, y.dev)
	h.ref.Add(out.ref, x.ref, y.ref)
	h.compare("Add", out)

	out = h.out(h.dt, n, c)
	h.b.Scale(out.dev, x.dev, -0.375)
	h.ref.Scale(out.ref, x.ref, -0.375)
	h.compare("Scale", out)

	acc := h.rand(h.dt, n, c)
	h.b.Axpy(acc.dev, 0.625, x.dev)
	h.ref.Axpy(acc.ref, 0.625, x.ref)
	h.compare("Axpy", acc)

	// In place: dst is the first input.
	a := h.rand(h.dt, n, c)
	h.b.Add(a.dev, a.dev, y.dev)
	h.ref.Add(a.ref, a.ref, y.ref)
	h.compare("Add in place", a)
	h.b.Scale(a.dev, a.dev, 1.5)
	h.ref.Scale(a.ref, a.ref, 1.5)
	h.compare("Scale in place", a)
	h.b.Axpy(a.dev, -2, a.dev)
	h.ref.Axpy(a.ref, -2, a.ref)
	h.compare("Axpy of itself", a)
}

// TestBias checks AddBias and SumRows (which accumulates).
func TestBias(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 5)
	const n, c = 37, 50
	x, bias := h.rand(h.dt, n, c), h.rand(h.dt, c)
	h.b.AddBias(x.dev, bias.dev)
	h.ref.AddBias(x.ref, bias.ref)
	h.compare("AddBias", x)

	dbias := h.rand(h.dt, c)
	g := h.rand(h.dt, n, c)
	h.b.SumRows(dbias.dev, g.dev)
	h.ref.SumRows(dbias.ref, g.ref)
	h.compare("SumRows", dbias)
}
