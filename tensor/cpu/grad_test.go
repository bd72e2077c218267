package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// The gradient checks run in float64: each backward is compared with central
// finite differences of L = Σ out·w (random w, so ∂L/∂out = w) over random
// non-zero inputs.

const (
	fdStep = 1e-5
	fdTol  = 1e-6
)

func rnd(rng *rand.Rand, shape ...int) *tensor.Tensor {
	return testutil.Rand(rng, tensor.Float64, shape...)
}

func zeros(shape ...int) *tensor.Tensor { return tensor.MustHost(tensor.Float64, shape...) }

func clone(t *tensor.Tensor) *tensor.Tensor {
	c := tensor.MustHost(t.DType(), t.Shape()...)
	cpu.New().Copy(c, t)
	return c
}

// checkGrad compares got with the finite-difference gradient of loss with
// respect to the elements of x.
func checkGrad(t *testing.T, name string, loss func() float64, x *tensor.Tensor, got []float64) {
	t.Helper()
	want := testutil.NumGrad(loss, x.F64(), fdStep)
	testutil.AllClose(t, name, got, want, fdTol)
}

// diff returns a − b elementwise (the accumulated part of a gradient).
func diff(a, b *tensor.Tensor) []float64 {
	out := make([]float64, a.Numel())
	for i := range out {
		out[i] = a.F64()[i] - b.F64()[i]
	}
	return out
}

func noErr(t *testing.T, b *cpu.Backend) {
	t.Helper()
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestGradMatMul(t *testing.T) {
	rng := testutil.Rng(1)
	b := cpu.New()
	const m, n, k = 3, 4, 5
	const alpha, beta = 0.7, 0.3
	for _, batch := range []int{0, 2} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			tA, tB := tr[0], tr[1]
			name := fmt.Sprintf("batch=%d transA=%v transB=%v", batch, tA, tB)
			shape := func(r, c int) []int {
				if batch > 0 {
					return []int{batch, r, c}
				}
				return []int{r, c}
			}
			sa, sb := shape(m, k), shape(k, n)
			if tA {
				sa = shape(k, m)
			}
			if tB {
				sb = shape(n, k)
			}
			a, bm, c0, w := rnd(rng, sa...), rnd(rng, sb...), rnd(rng, shape(m, n)...), rnd(rng, shape(m, n)...)
			loss := func() float64 {
				c := clone(c0)
				b.MatMul(c, a, bm, tA, tB, alpha, beta)
				return testutil.Dot(c.F64(), w.F64())
			}
			// dA = alpha·W·op(B)ᵀ, or its transpose; dB = alpha·op(A)ᵀ·W, or its transpose.
			da, db, dc := zeros(sa...), zeros(sb...), zeros(shape(m, n)...)
			if tA {
				b.MatMul(da, bm, w, tB, true, alpha, 0)
			} else {
				b.MatMul(da, w, bm, false, !tB, alpha, 0)
			}
			if tB {
				b.MatMul(db, w, a, true, tA, alpha, 0)
			} else {
				b.MatMul(db, a, w, !tA, false, alpha, 0)
			}
			b.Scale(dc, w, beta)
			noErr(t, b)
			checkGrad(t, name+" dA", loss, a, da.F64())
			checkGrad(t, name+" dB", loss, bm, db.F64())
			checkGrad(t, name+" dC", loss, c0, dc.F64())
		}
	}
}

func TestGradElementwise(t *testing.T) {
	rng := testutil.Rng(2)
	b := cpu.New()
	const n, c = 4, 6
	x, y, w := rnd(rng, n, c), rnd(rng, n, c), rnd(rng, n, c)

	add := func() float64 { out := zeros(n, c); b.Add(out, x, y); return testutil.Dot(out.F64(), w.F64()) }
	checkGrad(t, "Add da", add, x, w.F64())
	checkGrad(t, "Add db", add, y, w.F64())

	const s = -0.375
	scale := func() float64 { out := zeros(n, c); b.Scale(out, x, s); return testutil.Dot(out.F64(), w.F64()) }
	ds := zeros(n, c)
	b.Scale(ds, w, s)
	checkGrad(t, "Scale", scale, x, ds.F64())

	const alpha = 0.625
	axpy := func() float64 { out := clone(y); b.Axpy(out, alpha, x); return testutil.Dot(out.F64(), w.F64()) }
	dx := zeros(n, c)
	b.Axpy(dx, alpha, w)
	checkGrad(t, "Axpy dx", axpy, x, dx.F64())
	checkGrad(t, "Axpy dy", axpy, y, w.F64())

	bias := rnd(rng, c)
	addBias := func() float64 { out := clone(x); b.AddBias(out, bias); return testutil.Dot(out.F64(), w.F64()) }
	dbias := rnd(rng, c)
	dbias0 := clone(dbias)
	b.SumRows(dbias, w)
	checkGrad(t, "AddBias dbias (SumRows)", addBias, bias, diff(dbias, dbias0))
	checkGrad(t, "AddBias dx", addBias, x, w.F64())

	wb := rnd(rng, c)
	sumRows := func() float64 { out := zeros(c); b.SumRows(out, x); return testutil.Dot(out.F64(), wb.F64()) }
	dxs := zeros(n, c)
	b.AddBias(dxs, wb)
	checkGrad(t, "SumRows dx", sumRows, x, dxs.F64())
	noErr(t, b)
}

func TestGradRMSNorm(t *testing.T) {
	rng := testutil.Rng(3)
	b := cpu.New()
	const n, c, eps = 4, 6, 1e-5
	x, g, w := rnd(rng, n, c), rnd(rng, c), rnd(rng, n, c)
	rstd := zeros(n)
	loss := func() float64 {
		out := zeros(n, c)
		b.RMSNorm(out, rstd, x, g, eps)
		return testutil.Dot(out.F64(), w.F64())
	}
	loss()
	dx, dg := zeros(n, c), rnd(rng, c)
	dg0 := clone(dg)
	b.RMSNormBackward(dx, dg, w, x, g, rstd)
	noErr(t, b)
	checkGrad(t, "RMSNorm dx", loss, x, dx.F64())
	checkGrad(t, "RMSNorm dw", loss, g, diff(dg, dg0))
}

func TestGradSwiGLU(t *testing.T) {
	rng := testutil.Rng(4)
	b := cpu.New()
	const n, f = 4, 6
	gate, up, w := rnd(rng, n, f), rnd(rng, n, f), rnd(rng, n, f)
	b.Scale(gate, gate, 3) // both sides of the sigmoid
	loss := func() float64 {
		out := zeros(n, f)
		b.SwiGLU(out, gate, up)
		return testutil.Dot(out.F64(), w.F64())
	}
	dgate, dup := zeros(n, f), zeros(n, f)
	b.SwiGLUBackward(dgate, dup, w, gate, up)
	noErr(t, b)
	checkGrad(t, "SwiGLU dgate", loss, gate, dgate.F64())
	checkGrad(t, "SwiGLU dup", loss, up, dup.F64())
}

func TestGradGELU(t *testing.T) {
	rng := testutil.Rng(5)
	b := cpu.New()
	const n, f = 4, 6
	x, w := rnd(rng, n, f), rnd(rng, n, f)
	b.Scale(x, x, 3)
	loss := func() float64 { out := zeros(n, f); b.GELU(out, x); return testutil.Dot(out.F64(), w.F64()) }
	dx := zeros(n, f)
	b.GELUBackward(dx, w, x)
	noErr(t, b)
	checkGrad(t, "GELU", loss, x, dx.F64())
}

func TestGradSoftmax(t *testing.T) {
	rng := testutil.Rng(6)
	b := cpu.New()
	const n, c = 4, 7
	x, w := rnd(rng, n, c), rnd(rng, n, c)
	out := zeros(n, c)
	loss := func() float64 { o := zeros(n, c); b.Softmax(o, x); return testutil.Dot(o.F64(), w.F64()) }
	b.Softmax(out, x)
	dx := zeros(n, c)
	b.SoftmaxBackward(dx, w, out)
	noErr(t, b)
	checkGrad(t, "Softmax", loss, x, dx.F64())
}

func TestGradRoPE(t *testing.T) {
	rng := testutil.Rng(7)
	b := cpu.New()
	shape := []int{2, 3, 2, 6}
	const theta = 100
	x, w := rnd(rng, shape...), rnd(rng, shape...)
	loss := func() float64 { o := zeros(shape...); b.RoPE(o, x, theta); return testutil.Dot(o.F64(), w.F64()) }
	dx := zeros(shape...)
	b.RoPEBackward(dx, w, theta)
	noErr(t, b)
	checkGrad(t, "RoPE", loss, x, dx.F64())
}

// TestGradAttention: multi-head (Hkv = H) and grouped-query attention
// (groups of 2 and 4 query heads per key/value head).
func TestGradAttention(t *testing.T) {
	for _, hkv := range []int{4, 2, 1} {
		t.Run(fmt.Sprintf("kv%d", hkv), func(t *testing.T) {
			rng := testutil.Rng(uint64(8 + hkv))
			b := cpu.New()
			const nb, nt, nh, d, scale = 2, 5, 4, 4, 0.5
			shape, kvShape := []int{nb, nt, nh, d}, []int{nb, nt, hkv, d}
			q, k, v, w := rnd(rng, shape...), rnd(rng, kvShape...), rnd(rng, kvShape...), rnd(rng, shape...)
			b.Scale(q, q, 3) // peakier attention than the raw inputs give
			out, lse := zeros(shape...), zeros(nb, nh, nt)
			loss := func() float64 {
				o := zeros(shape...)
				b.Attention(o, zeros(nb, nh, nt), q, k, v, scale)
				return testutil.Dot(o.F64(), w.F64())
			}
			b.Attention(out, lse, q, k, v, scale)
			dq, dk, dv := zeros(shape...), zeros(kvShape...), zeros(kvShape...)
			b.AttentionBackward(dq, dk, dv, w, q, k, v, out, lse, scale)
			noErr(t, b)
			checkGrad(t, "Attention dq", loss, q, dq.F64())
			checkGrad(t, "Attention dk", loss, k, dk.F64())
			checkGrad(t, "Attention dv", loss, v, dv.F64())
		})
	}
}

func TestGradEmbedding(t *testing.T) {
	rng := testutil.Rng(9)
	b := cpu.New()
	const v, c = 5, 3
	ids, err := tensor.FromInt32([]int32{3, 0, 3, 4, 1, 3, 0}, 7)
	if err != nil {
		t.Fatal(err)
	}
	table, w := rnd(rng, v, c), rnd(rng, 7, c)
	loss := func() float64 { o := zeros(7, c); b.Embedding(o, table, ids); return testutil.Dot(o.F64(), w.F64()) }
	dtable := rnd(rng, v, c)
	dtable0 := clone(dtable)
	b.EmbeddingBackward(dtable, w, ids)
	noErr(t, b)
	checkGrad(t, "Embedding dtable", loss, table, diff(dtable, dtable0))
}

func TestGradCrossEntropy(t *testing.T) {
	rng := testutil.Rng(10)
	b := cpu.New()
	const n, v, gs = 5, 7, 0.75
	targets, err := tensor.FromInt32([]int32{2, -1, 6, 0, 2}, n)
	if err != nil {
		t.Fatal(err)
	}
	logits := rnd(rng, n, v)
	b.Scale(logits, logits, 3)
	loss := func() float64 {
		l := zeros(n)
		b.CrossEntropy(l, nil, logits, targets, 1)
		var s float64
		for _, x := range l.F64() {
			s += gs * x
		}
		return s
	}
	losses, dlogits := zeros(n), zeros(n, v)
	b.CrossEntropy(losses, dlogits, logits, targets, gs)
	noErr(t, b)
	checkGrad(t, "CrossEntropy dlogits", loss, logits, dlogits.F64())
	if losses.F64()[1] != 0 {
		t.Errorf("loss of the ignored row is %v, want 0", losses.F64()[1])
	}
	for j := range v {
		if g := dlogits.F64()[v+j]; g != 0 {
			t.Errorf("dlogits[1, %d] = %v, want 0 (ignored row)", j, g)
		}
	}

	// In place: dlogits overwrites logits.
	inPlace := clone(logits)
	losses2 := zeros(n)
	b.CrossEntropy(losses2, inPlace, inPlace, targets, gs)
	noErr(t, b)
	testutil.AllClose(t, "CrossEntropy in place dlogits", inPlace.F64(), dlogits.F64(), 0)
	testutil.AllClose(t, "CrossEntropy in place losses", losses2.F64(), losses.F64(), 0)
}
