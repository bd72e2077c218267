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

	// The same update on views that start one element into their buffers
	// (not 16-byte aligned: a GPU kernel may take another path there) gives
	// the same bits as on whole buffers.
	hp.Step = 4
	g := h.rand(h.dt, n)
	shifted := func(src *tensor.Tensor) *tensor.Tensor {
		buf := h.b.Zeros(src.DType(), n+1)
		v := h.view(buf, 1, n)
		h.b.Copy(v, src)
		return v
	}
	p2, g2, m2, v2, master2 := shifted(p.dev), shifted(g.dev), shifted(m.dev), shifted(v.dev), shifted(master.dev)
	h.b.AdamW(p.dev, g.dev, m.dev, v.dev, master.dev, hp)
	h.b.AdamW(p2, g2, m2, v2, master2, hp)
	for _, c := range []struct {
		name       string
		whole, off *tensor.Tensor
	}{{"p", p.dev, p2}, {"m", m.dev, m2}, {"v", v.dev, v2}, {"master", master.dev, master2}} {
		h.exact("AdamW "+c.name+" on unaligned views against whole buffers", h.download(c.off), h.download(c.whole))
	}
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

// TestDeviceClip checks the device-side gradient norm and clipping that let
// a training step run without reading the norm back: SumSquaresTo adding
// the sums of two views into a one-element fp32 tensor, AdamW reading that
// tensor as NormSq (with clipping active and inactive, against the
// reference given the clip factor computed on the host), a non-finite
// NormSq leaving every state tensor bit-for-bit as it was, and ReadAsync
// returning a tensor's values as they were when the read was queued.
func TestDeviceClip(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 16)
	const n = 1851
	g := h.rand(h.dt, n)
	lo, err1 := g.dev.View(0, 1000)
	hi, err2 := g.dev.View(1000, n-1000)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	ss := h.b.Zeros(tensor.Float32, 1)
	h.b.SumSquaresTo(ss, lo)
	h.b.SumSquaresTo(ss, hi)
	wantSS := h.ref.SumSquares(g.ref)
	gotSS := h.download(ss)[0]
	if e := math.Abs(gotSS-wantSS) / wantSS; !(e <= 1e-5) {
		t.Errorf("SumSquaresTo over two views: got %v, want %v (relative error %.3g)", gotSS, wantSS, e)
	}
	read := tensor.ReadAsync(h.b, ss)
	h.b.Fill(ss, 3) // after the read: the read must not see it
	if vals, err := read.Wait(); err != nil || len(vals) != 1 || vals[0] != gotSS {
		t.Errorf("ReadAsync then Fill: Wait = %v, %v, want [%v]", vals, err, gotSS)
	}
	h.b.Fill(ss, gotSS)

	master := h.rand(tensor.Float32, n)
	p := h.out(h.dt, n)
	h.b.Copy(p.dev, master.dev)
	h.ref.Copy(p.ref, master.ref)
	m, v := h.zeros(tensor.Float32, n), h.zeros(tensor.Float32, n)
	norm := math.Sqrt(wantSS)
	for step, clip := range []float64{0.5 * norm, 4 * norm} { // clipping (factor ≈ 1/2), then none
		hp := tensor.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5, Step: step + 1,
			NormSq: ss, Clip: float32(clip)}
		h.b.AdamW(p.dev, g.dev, m.dev, v.dev, master.dev, hp)
		ref := hp
		ref.NormSq, ref.Clip = nil, 0
		ref.GradScale = float32(0.5 * tensor.ClipFactor(wantSS, float64(float32(clip))))
		h.ref.AdamW(p.ref, g.ref, m.ref, v.ref, master.ref, ref)
	}
	h.compare("AdamW master (NormSq)", master)
	h.compare("AdamW p (NormSq)", p)
	h.compare("AdamW m (NormSq)", m)
	h.compare("AdamW v (NormSq)", v)

	for _, bad := range []float64{math.NaN(), math.Inf(1)} {
		before := [][]float64{h.download(p.dev), h.download(m.dev), h.download(v.dev), h.download(master.dev)}
		h.b.Fill(ss, bad)
		h.b.AdamW(p.dev, g.dev, m.dev, v.dev, master.dev, tensor.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Step: 3, NormSq: ss, Clip: 1})
		for i, x := range []*tensor.Tensor{p.dev, m.dev, v.dev, master.dev} {
			after := h.download(x)
			for j := range after {
				if math.Float64bits(after[j]) != math.Float64bits(before[i][j]) {
					t.Errorf("AdamW with NormSq %v changed tensor %d (p, m, v, master) at %d: %v -> %v", bad, i, j, before[i][j], after[j])
					break
				}
			}
		}
	}
	h.sync()
}
