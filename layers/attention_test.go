package layers

import (
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestAttentionGQAExpanded: grouped-query attention (4 query heads, 2
// key/value heads) equals multi-head attention whose wk and wv repeat each
// key/value head's rows for the query heads of its group (float64): the
// same output, dx, dWq and dWo, and dWk, dWv equal to the sums of the
// multi-head ones over each group.
func TestAttentionGQAExpanded(t *testing.T) {
	const B, T, C, H, KV = 2, 5, 16, 4, 2
	const D, G = C / H, H / KV
	b := newBackend()
	build := func(kv int) *Attention {
		ps := NewParamSet(3)
		a, err := NewAttention(b, ps, "a", AttentionConfig{Dim: C, Heads: H, KVHeads: kv, RopeTheta: 100, Std: 0.3, OutStd: 0.3})
		noErr(t, b, err)
		noErr(t, b, ps.Materialize(b, tensor.Float64))
		return a
	}
	gqa, mha := build(KV), build(0)
	if s := gqa.Wk.W.Shape(); s[0] != KV*D || gqa.Wv.W.Numel()*G != mha.Wv.W.Numel() {
		t.Fatalf("wk %v, wv %d elements: want (%d, %d), 1/%d of multi-head's %d", s, gqa.Wv.W.Numel(), KV*D, C, G, mha.Wv.W.Numel())
	}
	rng := testutil.Rng(4)
	for _, p := range gqa.Params() {
		upload(t, b, p.W, testutil.RandFloats(rng, p.Numel(), 0.1, 0.6))
	}
	// expand repeats the rows of each key/value head (D rows of C) for its group.
	expand := func(w []float64) []float64 {
		out := make([]float64, 0, H*D*C)
		for h := range H {
			out = append(out, w[h/G*D*C:][:D*C]...)
		}
		return out
	}
	upload(t, b, mha.Wq.W.W, download(t, b, gqa.Wq.W.W))
	upload(t, b, mha.Wo.W.W, download(t, b, gqa.Wo.W.W))
	upload(t, b, mha.Wk.W.W, expand(download(t, b, gqa.Wk.W.W)))
	upload(t, b, mha.Wv.W.W, expand(download(t, b, gqa.Wv.W.W)))

	x := randDevice(t, b, rng, tensor.Float64, 1, B, T, C)
	dout := randDevice(t, b, rng, tensor.Float64, 1, B, T, C)
	run := func(a *Attention) (out, dx []float64) {
		o, d := b.Zeros(tensor.Float64, B, T, C), b.Zeros(tensor.Float64, B, T, C)
		noErr(t, b, a.Forward(o, x))
		noErr(t, b, a.Backward(d, dout))
		return download(t, b, o), download(t, b, d)
	}
	gOut, gDx := run(gqa)
	mOut, mDx := run(mha)
	within := func(what string, got, want []float64, tol float64) {
		t.Helper()
		if err := testutil.Within(what, got, want, tol); err != nil {
			t.Error(err)
		}
	}
	within("output", gOut, mOut, 1e-13)
	within("dx", gDx, mDx, 1e-13)
	within("dWq", download(t, b, gqa.Wq.W.G), download(t, b, mha.Wq.W.G), 1e-13)
	within("dWo", download(t, b, gqa.Wo.W.G), download(t, b, mha.Wo.W.G), 1e-13)
	// sumGroups adds the rows of the query heads of each group: expand's adjoint.
	sumGroups := func(g []float64) []float64 {
		out := make([]float64, KV*D*C)
		for h := range H {
			for i, v := range g[h*D*C : (h+1)*D*C] {
				out[h/G*D*C+i] += v
			}
		}
		return out
	}
	within("dWk", download(t, b, gqa.Wk.W.G), sumGroups(download(t, b, mha.Wk.W.G)), 1e-12)
	within("dWv", download(t, b, gqa.Wv.W.G), sumGroups(download(t, b, mha.Wv.W.G)), 1e-12)
}
