package backendtest

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestAdamW checks three AdamW steps, with weight decay and a gradient
// scale: on p itself when the compute dtype is Float32 or Float64, and with
// an fp32 master copy (p receiving master rounded to its dtype).
func TestAdamW(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 14)
	const n = 1851 // 37·50 + 1
	hp := tensor.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5}
	if h.dt != tensor.BFloat16 {
		p, m, v := h.rand(h.dt, n), h.zeros(h.dt, n), h.zeros(h.dt, n)
		for step := 1; step <= 3; step++ {
			hp.Step = step
			g := h.rand(h.dt, n)
			h.b.AdamW(p.dev, g.dev, m.dev, v.dev, nil, hp)
			h.ref.AdamW(p.ref, g.ref, m.ref, v.ref, nil, hp)
		}
		h.compare("AdamW p", p)
		h.compare("AdamW m", m)
		h.compare("AdamW v", v)
	}

	// With a master copy: the reference keeps it in float64.
	master := h.rand(tensor.Float32, n)
	p := h.out(h.dt, n)
	h.b.Copy(p.dev, master.dev)
	m, v := h.zeros(tensor.Float32, n), h.zeros(tensor.Float32, n)
	hp.GradScale = 0
	for step := 1; step <= 3; step++ {
		hp.Step = step
		g := h.rand(h.dt, n)
		h.b.AdamW(p.dev, g.dev, m.dev, v.dev, master.dev, hp)
		h.ref.AdamW(p.ref, g.ref, m.ref, v.ref, master.ref, hp)
	}
	h.compare("AdamW master", master)
	h.compare("AdamW p from master", p)
	h.compare("AdamW m (master)", m)
	h.compare("AdamW v (master)", v)
}

// zeros is a zeroed tensor on both sides.
func (h *harness) zeros(dt tensor.DType, shape ...int) pair {
	return pair{h.b.Zeros(dt, shape...), tensor.MustHost(tensor.Float64, shape...)}
}

// TestSumSquares checks SumSquares on the compute dtype and on Float32, on
// more elements than one block of a typical reduction kernel.
func TestSumSquares(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 15)
	for _, dt := range []tensor.DType{h.dt, tensor.Float32} {
		x := h.rand(dt, 37, 1001)
		got := h.b.SumSquares(x.dev)
		want := h.ref.SumSquares(x.ref)
		h.sync()
		if e := math.Abs(got-want) / want; !(e <= h.tol) {
			t.Errorf("SumSquares %v: got %v, want %v (relative error %.3g > %.3g)", dt, got, want, e, h.tol)
		}
	}
}
