package layers

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// matmuls counts a backend's MatMul calls.
type matmuls struct {
	tensor.Backend
	n atomic.Int64
}

func (m *matmuls) MatMul(c, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	m.n.Add(1)
	m.Backend.MatMul(c, a, b, transA, transB, alpha, beta)
}

// TestStackedProjections: the attention's q, k, v and the MLP's gate, up
// run as one GEMM each way (x·[Wq;Wk;Wv]ᵀ forward; one dx and one dW GEMM
// backward), and give the outputs and gradients of the three (two) separate
// linears, the assembly of before, kept behind unstacked, on random
// non-zero inputs and weights in float64.
func TestStackedProjections(t *testing.T) {
	const B, T, C, F = 2, 5, 12, 20
	H, KV := 3, 0
	type result struct {
		out, dx, grads []float64
		fwd, bwd       int64
	}
	run := func(stack bool, mlp bool) result {
		unstacked = !stack
		defer func() { unstacked = false }()
		b := &matmuls{Backend: newBackend()}
		ps := NewParamSet(7)
		var fwd func(out, x *tensor.Tensor) error
		var bwd func(dx, dout *tensor.Tensor) error
		if mlp {
			m, err := NewMLP(b, ps, "m", MLPConfig{Dim: C, Hidden: F, Std: 0.3, OutStd: 0.3})
			noErr(t, b, err)
			fwd, bwd = m.Forward, m.Backward
		} else {
			a, err := NewAttention(b, ps, "a", AttentionConfig{Dim: C, Heads: H, KVHeads: KV, RopeTheta: 100, Std: 0.3, OutStd: 0.3})
			noErr(t, b, err)
			fwd, bwd = a.Forward, a.Backward
		}
		noErr(t, b, ps.Materialize(b, tensor.Float64))
		rng := testutil.Rng(3)
		randomizeParams(t, ps, rng, 0.5)
		x := randDevice(t, b, rng, tensor.Float64, 1, B, T, C)
		dout := randDevice(t, b, rng, tensor.Float64, 1, B, T, C)
		out, dx := b.Zeros(tensor.Float64, B, T, C), b.Zeros(tensor.Float64, B, T, C)
		n0 := b.n.Load()
		noErr(t, b, fwd(out, x))
		n1 := b.n.Load()
		noErr(t, b, bwd(dx, dout))
		_, g := ps.Flat()
		return result{download(t, b, out), download(t, b, dx), download(t, b, g), n1 - n0, b.n.Load() - n1}
	}
	// Attention multi-head (3 heads of 4), grouped-query (6 query heads of
	// 2, 2 key/value heads: [Wq; Wk; Wv] is (12 + 2·4, 12)), and the MLP.
	for _, c := range []struct {
		name      string
		mlp       bool
		heads, kv int
	}{{"attention", false, 3, 0}, {"attention (grouped-query)", false, 6, 2}, {"mlp", true, 0, 0}} {
		mlp, name, sep := c.mlp, c.name, int64(3)
		H, KV = c.heads, c.kv
		if mlp {
			sep = 2
		}
		got, want := run(true, mlp), run(false, mlp)
		// Forward: the stacked GEMM and the output projection; backward:
		// the output projection's two, then one dx and one dW.
		if got.fwd != 2 || got.bwd != 4 || want.fwd != sep+1 || want.bwd != 2*sep+2 {
			t.Errorf("%s: GEMMs forward/backward stacked %d/%d, separate %d/%d; want 2/4 and %d/%d", name, got.fwd, got.bwd, want.fwd, want.bwd, sep+1, 2*sep+2)
		}
		for _, c := range []struct {
			what      string
			got, want []float64
		}{{"output", got.out, want.out}, {"dx", got.dx, want.dx}, {"parameter gradients", got.grads, want.grads}} {
			if err := testutil.Within(name+" "+c.what, c.got, c.want, 1e-12); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestStacked: Stacked views adjacent weights as one, and refuses weights
// that are not adjacent (or not materialized), naming them.
func TestStacked(t *testing.T) {
	b := newBackend()
	ps := NewParamSet(1)
	p1, _ := ps.Add("a", []int{2, 3}, true, Normal(1))
	nd, _ := ps.Add("nodecay", []int{4}, false, nil)
	p2, _ := ps.Add("b", []int{4, 3}, true, Normal(1))
	p3, _ := ps.Add("c", []int{1, 2}, true, Normal(1))
	if _, _, err := Stacked(p1, p2); err == nil || !strings.Contains(err.Error(), "not a materialized") {
		t.Errorf("Stacked before Materialize: %v", err)
	}
	noErr(t, b, ps.Materialize(b, tensor.Float64))
	w, g, err := Stacked(p1, p2)
	if err != nil {
		t.Fatal(err)
	}
	if !w.Shape().Equal(tensor.Shape{6, 3}) || !g.Shape().Equal(tensor.Shape{6, 3}) {
		t.Fatalf("Stacked shapes %v, %v, want (6, 3)", w.Shape(), g.Shape())
	}
	all := append(download(t, b, p1.W), download(t, b, p2.W)...)
	if err := testutil.Within("stacked weights", download(t, b, w), all, 0); err != nil {
		t.Error(err)
	}
	if _, _, err := Stacked(p2, p1); err == nil || !strings.Contains(err.Error(), `"a" (#1) does not follow "b"`) {
		t.Errorf("Stacked out of order: %v", err)
	}
	if _, _, err := Stacked(p2, p3); err == nil || !strings.Contains(err.Error(), "(Out, 3)") {
		t.Errorf("Stacked of other widths: %v", err)
	}
	if _, _, err := Stacked(p1, nd); err == nil {
		t.Errorf("Stacked with a 1-D parameter: no error")
	}
}
