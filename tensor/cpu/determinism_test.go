package cpu_test

import (
	"math"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// runAll runs every heavy op once, in float32, on shapes large enough for
// the kernels to split their work, and returns every output.
func runAll(b *cpu.Backend) ([]*tensor.Tensor, float64) {
	rng := testutil.Rng(99)
	r := func(shape ...int) *tensor.Tensor { return testutil.Rand(rng, tensor.Float32, shape...) }
	const n, c, v = 300, 256, 301
	var outs []*tensor.Tensor
	keep := func(ts ...*tensor.Tensor) { outs = append(outs, ts...) }

	x, w, dout := r(n, c), r(c), r(n, c)
	y, rstd, dx, dw := f32(n, c), f32(n), f32(n, c), r(c)
	b.RMSNorm(y, rstd, x, w, 1e-5)
	b.RMSNormBackward(dx, dw, dout, x, w, rstd)
	keep(y, rstd, dx, dw)

	db := r(c)
	b.SumRows(db, dout)
	sm, dsm := f32(n, c), f32(n, c)
	b.Softmax(sm, x)
	b.SoftmaxBackward(dsm, dout, sm)
	g, dg, du := f32(n, c), f32(n, c), f32(n, c)
	b.SwiGLU(g, x, dout)
	b.SwiGLUBackward(dg, du, dout, x, dout)
	keep(db, sm, dsm, g, dg, du)

	shape := []int{2, 64, 4, 32}
	q, k, vv, do := r(shape...), r(shape...), r(shape...), r(shape...)
	out, lse := f32(shape...), f32(2, 4, 64)
	dq, dk, dv := f32(shape...), f32(shape...), f32(shape...)
	b.Attention(out, lse, q, k, vv, 0.2)
	b.AttentionBackward(dq, dk, dv, do, q, k, vv, out, lse, 0.2)
	ro := f32(shape...)
	b.RoPE(ro, q, 1e4)
	keep(out, lse, dq, dk, dv, ro)

	ids := testutil.RandInts(rng, 50, n) // many repeats
	emb, dtable := f32(n, c), r(50, c)
	b.Embedding(emb, r(50, c), ids)
	b.EmbeddingBackward(dtable, dout, ids)
	keep(emb, dtable)

	logits, targets := r(n, v), testutil.RandInts(rng, v, n)
	losses, dlogits := f32(n), f32(n, v)
	b.CrossEntropy(losses, dlogits, logits, targets, 0.01)
	keep(losses, dlogits)

	c3 := f32(8, 64, 48)
	b.MatMul(c3, r(8, 64, 32), r(8, 48, 32), false, true, 1, 0)
	keep(c3)

	p, m, mv := r(100003), f32(100003), f32(100003)
	for step := 1; step <= 2; step++ {
		b.AdamW(p, r(100003), m, mv, nil, tensor.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, Step: step})
	}
	keep(p, m, mv)
	return outs, b.SumSquares(p)
}

// TestDeterminism checks that the thread count does not change any bit.
func TestDeterminism(t *testing.T) {
	want, wantSS := runAll(cpu.New(cpu.WithThreads(1)))
	for _, threads := range []int{3, 4} {
		b := cpu.New(cpu.WithThreads(threads))
		got, gotSS := runAll(b)
		noErr(t, b)
		for i := range want {
			w, g := want[i].F32(), got[i].F32()
			for j := range w {
				if math.Float32bits(w[j]) != math.Float32bits(g[j]) {
					t.Fatalf("threads=%d: output %d (%v) element %d: %v, want %v", threads, i, want[i].Shape(), j, g[j], w[j])
				}
			}
		}
		if gotSS != wantSS {
			t.Fatalf("threads=%d: SumSquares %v, want %v", threads, gotSS, wantSS)
		}
	}
}

// TestConcurrentBackends runs one backend per goroutine, as simulated ranks
// do: each gets the single-goroutine result.
func TestConcurrentBackends(t *testing.T) {
	want, _ := runAll(cpu.New(cpu.WithThreads(1)))
	var wg sync.WaitGroup
	errs := make([]string, 4)
	for r := range 4 {
		wg.Go(func() {
			got, _ := runAll(cpu.New(cpu.WithThreads(2)))
			for i := range want {
				for j, w := range want[i].F32() {
					if got[i].F32()[j] != w {
						errs[r] = "results differ"
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for r, e := range errs {
		if e != "" {
			t.Errorf("rank %d: %s", r, e)
		}
	}
}
