package cudabackend

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/backendtest"
)

// opener returns a fresh backend for a test (closed at the test's end), or
// skips the test.
type opener func(t testing.TB, opts ...Option) *Backend

// runConformance runs the conformance suite in bf16 and f32.
func runConformance(t *testing.T, open opener, opts ...Option) {
	for _, tc := range []struct {
		name string
		dt   tensor.DType
		tol  float64
	}{
		{"bf16", tensor.BFloat16, 1e-2},
		{"f32", tensor.Float32, 1e-5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := open(t, opts...)
			o := backendtest.Options{
				DType:      tc.dt,
				Tol:        tc.tol,
				NewBackend: func() tensor.Backend { return open(t, opts...) },
			}
			backendtest.Run(t, b, o)
			t.Run("MoE", func(t *testing.T) { backendtest.RunMoE(t, b, o) })
		})
	}
}

// determinismRun runs a forward and backward of the ops with reductions
// (matmul, norms, attention and grouped-query attention, embedding,
// cross-entropy, sums) on fixed inputs
// and returns every output's raw bits.
func determinismRun(t *testing.T, b *Backend, dt tensor.DType, d int) [][]uint64 {
	t.Helper()
	rng := testutil.Rng(7)
	up := func(host *tensor.Tensor) *tensor.Tensor {
		x := b.Zeros(host.DType(), host.Shape()...)
		b.Upload(x, host)
		return x
	}
	rnd := func(shape ...int) *tensor.Tensor { return up(testutil.Rand(rng, dt, shape...)) }
	const nb, nt, nh, v = 2, 70, 3, 97
	c := nh * d
	n := nb * nt
	var outs []*tensor.Tensor
	keep := func(ts ...*tensor.Tensor) { outs = append(outs, ts...) }

	ids := up(testutil.RandInts(rng, v, n))
	table := rnd(v, c)
	x := b.Zeros(dt, n, c)
	b.Embedding(x, table, ids)
	w := rnd(c)
	h, rstd := b.Zeros(dt, n, c), b.Zeros(tensor.Float32, n)
	b.RMSNorm(h, rstd, x, w, 1e-5)
	wq := rnd(c, 3*c)
	qkv := b.Zeros(dt, n, 3*c)
	b.MatMul(qkv, h, wq, false, false, 1, 0)
	q, k, vv := b.Zeros(dt, nb, nt, nh, d), b.Zeros(dt, nb, nt, nh, d), b.Zeros(dt, nb, nt, nh, d)
	b.Copy(q, mustView(t, qkv, 0, nb, nt, nh, d))
	b.Copy(k, mustView(t, qkv, n*c, nb, nt, nh, d))
	b.Copy(vv, mustView(t, qkv, 2*n*c, nb, nt, nh, d))
	b.RoPE(q, q, 1e4)
	b.RoPE(k, k, 1e4)
	att, lse := b.Zeros(dt, nb, nt, nh, d), b.Zeros(tensor.Float32, nb, nh, nt)
	scale := float32(1 / math.Sqrt(float64(d)))
	b.Attention(att, lse, q, k, vv, scale)
	head := rnd(c, v)
	logits := b.Zeros(dt, n, v)
	b.MatMul(logits, mustView(t, att, 0, n, c), head, false, false, 1, 0)
	targets := up(testutil.RandInts(rng, v, n))
	losses := b.Zeros(tensor.Float32, n)
	b.CrossEntropy(losses, logits, logits, targets, 1.0/float32(n))
	dh := b.Zeros(dt, n, c)
	b.MatMul(dh, logits, head, false, true, 1, 0)
	dq, dk, dv := b.Zeros(dt, nb, nt, nh, d), b.Zeros(dt, nb, nt, nh, d), b.Zeros(dt, nb, nt, nh, d)
	b.AttentionBackward(dq, dk, dv, mustView(t, dh, 0, nb, nt, nh, d), q, k, vv, att, lse, scale)
	dx, dw := b.Zeros(dt, n, c), b.Zeros(dt, c)
	b.RMSNormBackward(dx, dw, mustView(t, dq, 0, n, c), x, w, rstd)
	dtable := b.Zeros(dt, v, c)
	b.EmbeddingBackward(dtable, dx, ids)
	dbias := b.Zeros(dt, c)
	b.SumRows(dbias, dx)
	keep(x, h, rstd, qkv, att, lse, losses, logits, dq, dk, dv, dx, dw, dtable, dbias)
	// Grouped-query attention: dk and dv sum over groups of 2 query heads.
	const gh, gkv = 2, 1
	gq, gk, gv, gdo := rnd(nb, nt, gh, d), rnd(nb, nt, gkv, d), rnd(nb, nt, gkv, d), rnd(nb, nt, gh, d)
	gatt, glse := b.Zeros(dt, nb, nt, gh, d), b.Zeros(tensor.Float32, nb, gh, nt)
	b.Attention(gatt, glse, gq, gk, gv, scale)
	gdq, gdk, gdv := b.Zeros(dt, nb, nt, gh, d), b.Zeros(dt, nb, nt, gkv, d), b.Zeros(dt, nb, nt, gkv, d)
	b.AttentionBackward(gdq, gdk, gdv, gdo, gq, gk, gv, gatt, glse, scale)
	keep(gatt, glse, gdq, gdk, gdv)
	ss := b.SumSquares(dx)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	res := [][]uint64{{math.Float64bits(ss)}}
	for _, o := range outs {
		host := tensor.MustHost(o.DType(), o.Shape()...)
		b.Download(host, o)
		vals := make([]uint64, o.Numel())
		switch o.DType() {
		case tensor.Float32:
			for i, f := range host.F32() {
				vals[i] = uint64(math.Float32bits(f))
			}
		case tensor.BFloat16:
			for i, f := range host.BF16() {
				vals[i] = uint64(f)
			}
		}
		res = append(res, vals)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	return res
}

func mustView(t *testing.T, x *tensor.Tensor, off int, shape ...int) *tensor.Tensor {
	t.Helper()
	v, err := x.View(off, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// runDeterminism checks that two runs on fresh backends give the same bits.
func runDeterminism(t *testing.T, open opener, opts ...Option) {
	for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
		for _, d := range []int{16, 64} {
			a := determinismRun(t, open(t, opts...), dt, d)
			b := determinismRun(t, open(t, opts...), dt, d)
			for i := range a {
				for j := range a[i] {
					if a[i][j] != b[i][j] {
						t.Errorf("%v D=%d: output %d element %d differs between runs: %#x vs %#x", dt, d, i, j, a[i][j], b[i][j])
						break
					}
				}
			}
		}
	}
}
