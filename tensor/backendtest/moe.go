package backendtest

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// The conformance tests of tensor.MoEOps, the optional routing ops of
// mixture-of-experts layers. A backend that implements them runs RunMoE
// next to Run:
//
//	backendtest.RunMoE(t, mybackend.New(), opts)

// MoETests lists the tests that RunMoE runs, in order.
func MoETests() []Test {
	return []Test{
		{"TopK", TestTopK},
		{"GatherRows", TestGatherRows},
		{"CombineRows", TestCombineRows},
		{"LogSumExp", TestLogSumExp},
		{"MoEErrors", TestMoEErrors},
		{"GroupedMatMul", TestGroupedMatMul},
		{"GroupedErrors", TestGroupedErrors},
	}
}

// RunMoE runs every MoE test on b as a subtest; it fails at once when b does
// not implement tensor.MoEOps (and the grouped GEMM tests fail when it does
// not implement tensor.GroupedGEMM).
func RunMoE(t *testing.T, b tensor.Backend, opts Options) {
	t.Helper()
	if _, err := tensor.MoEOpsOf(b); err != nil {
		t.Fatal(err)
	}
	for _, tc := range MoETests() {
		t.Run(tc.Name, func(t *testing.T) { tc.Fn(t, b, opts) })
	}
}

// moe returns the MoE ops of the backend under test and of the reference.
func (h *harness) moe() (dev, ref tensor.MoEOps) {
	h.t.Helper()
	ops, err := tensor.MoEOpsOf(h.b)
	if err != nil {
		h.t.Fatal(err)
	}
	return ops, h.ref
}

// routing returns n rows of e router probabilities, with a tie between
// columns 1 and 3 of row 0 (lower index first) and a row of equal values.
func (h *harness) routing(n, e int) pair {
	vals := make([]float64, n*e)
	for r := range n {
		var sum float64
		for j := range e {
			v := 0.05 + h.rng.Float64()
			vals[r*e+j] = v
			sum += v
		}
		for j := range e {
			vals[r*e+j] /= sum
		}
	}
	vals[1], vals[3] = 0.5, 0.5
	vals[0], vals[2] = 0, 0
	for j := range e {
		vals[e+j] = 1 / float64(e)
		if j >= 4 {
			vals[j] = 0
		}
	}
	return h.values(h.dt, vals, n, e)
}

// TestTopK checks TopK (indices exactly, ties to the lower index) with and
// without the renormalisation, and its backward.
func TestTopK(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 101)
	dev, ref := h.moe()
	const n, e = 37, 13
	x := h.routing(n, e)
	for _, k := range []int{1, 2, 5} {
		for _, norm := range []bool{false, true} {
			vals, idx := h.out(h.dt, n, k), h.fromHost(tensor.MustHost(tensor.Int32, n, k))
			refIdx := tensor.MustHost(tensor.Int32, n, k)
			dev.TopK(vals.dev, idx.dev, x.dev, norm)
			ref.TopK(vals.ref, refIdx, x.ref, norm)
			h.compare("TopK vals", vals)
			got := tensor.MustHost(tensor.Int32, n, k)
			h.b.Download(got, idx.dev)
			h.sync()
			for i, v := range got.I32() {
				if v != refIdx.I32()[i] {
					t.Fatalf("TopK K=%d normalize=%v: idx[%d, %d] = %d, want %d", k, norm, i/k, i%k, v, refIdx.I32()[i])
				}
			}
			if k == 2 && (refIdx.I32()[0] != 1 || refIdx.I32()[1] != 3) {
				t.Fatalf("reference TopK: tie of columns 1 and 3 gave %v, want [1 3]", refIdx.I32()[:2])
			}
			idx.ref = refIdx
			dvals, dx := h.rand(h.dt, n, k), h.out(h.dt, n, e)
			dev.TopKBackward(dx.dev, dvals.dev, vals.dev, idx.dev, x.dev, norm)
			ref.TopKBackward(dx.ref, dvals.ref, vals.ref, idx.ref, x.ref, norm)
			h.compare("TopKBackward", dx)
		}
	}
}

// permutation returns tok (m) and pos (n, k) of a routing where each of the
// n·k slots is kept unless dropped, in a shuffled order: tok[pos[s]] = s/k.
func (h *harness) permutation(n, k int, drop func(s int) bool) (tok, pos pair, m int) {
	order := h.rng.Perm(n * k)
	tokH, posH := tensor.MustHost(tensor.Int32, n*k), tensor.MustHost(tensor.Int32, n, k)
	for i := range posH.I32() {
		posH.I32()[i] = -1
	}
	for _, s := range order {
		if drop(s) {
			continue
		}
		tokH.I32()[m] = int32(s / k)
		posH.I32()[s] = int32(m)
		m++
	}
	tokM, _ := tokH.Rows(0, m)
	return h.fromHost(tokM), h.fromHost(posH), m
}

// TestGatherRows checks GatherRows with and without a scale, with a
// negative index (a zero row).
func TestGatherRows(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 102)
	dev, ref := h.moe()
	const n, k, c = 37, 3, 50
	src := h.rand(h.dt, n, c)
	tok, _, m := h.permutation(n, k, func(s int) bool { return s%7 == 3 })
	idxH := tensor.MustHost(tensor.Int32, m)
	for i := range m {
		idxH.I32()[i] = int32(h.rng.IntN(n))
	}
	idxH.I32()[2] = -1
	idx := h.fromHost(idxH)
	for _, ix := range []pair{tok, idx} {
		for _, scaled := range []bool{false, true} {
			dst := h.out(h.dt, m, c)
			var sd, sr *tensor.Tensor
			if scaled {
				s := h.rand(h.dt, m)
				sd, sr = s.dev, s.ref
			}
			dev.GatherRows(dst.dev, src.dev, ix.dev, sd)
			ref.GatherRows(dst.ref, src.ref, ix.ref, sr)
			h.compare("GatherRows", dst)
		}
	}
}

// TestCombineRows checks CombineRows with and without weights, with dropped
// slots, and its backward.
func TestCombineRows(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 103)
	dev, ref := h.moe()
	const n, k, c = 37, 3, 50
	_, pos, m := h.permutation(n, k, func(s int) bool { return s%5 == 1 })
	src, w := h.rand(h.dt, m, c), h.rand(h.dt, n, k)
	for _, weighted := range []bool{false, true} {
		var wd, wr *tensor.Tensor
		if weighted {
			wd, wr = w.dev, w.ref
		}
		out := h.out(h.dt, n, c)
		dev.CombineRows(out.dev, src.dev, pos.dev, wd)
		ref.CombineRows(out.ref, src.ref, pos.ref, wr)
		h.compare("CombineRows", out)

		dout, dsrc, dw := h.rand(h.dt, n, c), h.out(h.dt, m, c), h.out(h.dt, n, k)
		dev.CombineRowsBackward(dsrc.dev, dw.dev, dout.dev, src.dev, pos.dev, wd)
		ref.CombineRowsBackward(dsrc.ref, dw.ref, dout.ref, src.ref, pos.ref, wr)
		h.compare("CombineRowsBackward dsrc", dsrc)
		h.compare("CombineRowsBackward dweights", dw)

		dsrc = h.out(h.dt, m, c)
		dev.CombineRowsBackward(dsrc.dev, nil, dout.dev, src.dev, pos.dev, wd)
		ref.CombineRowsBackward(dsrc.ref, nil, dout.ref, src.ref, pos.ref, wr)
		h.compare("CombineRowsBackward dsrc without dweights", dsrc)
	}
}

// TestLogSumExp checks LogSumExp on rows far from 0 and its backward.
func TestLogSumExp(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 104)
	dev, ref := h.moe()
	const n, e = 37, 13
	x := h.rand(h.dt, n, e)
	h.b.Scale(x.dev, x.dev, 8)
	h.ref.Scale(x.ref, x.ref, 8)
	lse := h.out(tensor.Float32, n)
	dev.LogSumExp(lse.dev, x.dev)
	ref.LogSumExp(lse.ref, x.ref)
	h.compare("LogSumExp", lse)

	dlse, dx := h.rand(tensor.Float32, n), h.out(h.dt, n, e)
	dev.LogSumExpBackward(dx.dev, dlse.dev, x.dev, lse.dev)
	ref.LogSumExpBackward(dx.ref, dlse.ref, x.ref, lse.ref)
	h.compare("LogSumExpBackward", dx)
}

var moeErrorCases = []struct {
	op  string
	run func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType)
}{
	{"TopK", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		ops.TopK(b.Zeros(dt, 4, 6), b.Zeros(tensor.Int32, 4, 6), b.Zeros(dt, 4, 5), true) // K > E
	}},
	{"TopKBackward", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		idx := b.Zeros(tensor.Int32, 4, 2)
		b.Fill(idx, 5) // E = 5: out of range
		ops.TopKBackward(b.Zeros(dt, 4, 5), b.Zeros(dt, 4, 2), b.Zeros(dt, 4, 2), idx, b.Zeros(dt, 4, 5), false)
	}},
	{"GatherRows", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		idx := b.Zeros(tensor.Int32, 3)
		b.Fill(idx, 4) // 4 source rows: out of range
		ops.GatherRows(b.Zeros(dt, 3, 5), b.Zeros(dt, 4, 5), idx, nil)
	}},
	{"GatherRows", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		ops.GatherRows(b.Zeros(dt, 3, 6), b.Zeros(dt, 4, 5), b.Zeros(tensor.Int32, 3), nil)
	}},
	{"CombineRows", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		ops.CombineRows(b.Zeros(dt, 3, 5), b.Zeros(dt, 6, 5), b.Zeros(tensor.Int32, 3, 2), b.Zeros(dt, 3, 3))
	}},
	{"CombineRowsBackward", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		ops.CombineRowsBackward(b.Zeros(dt, 6, 5), nil, b.Zeros(dt, 3, 5), b.Zeros(dt, 6, 4), b.Zeros(tensor.Int32, 3, 2), nil)
	}},
	{"LogSumExp", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		ops.LogSumExp(b.Zeros(tensor.Float32, 5), b.Zeros(dt, 4, 5))
	}},
	{"LogSumExpBackward", func(b tensor.Backend, ops tensor.MoEOps, dt tensor.DType) {
		ops.LogSumExpBackward(b.Zeros(dt, 4, 5), b.Zeros(tensor.Float32, 4), b.Zeros(dt, 4, 6), b.Zeros(tensor.Float32, 4))
	}},
}

// TestMoEErrors calls each MoE op with a bad shape or index on a fresh
// backend: the op must record an error naming it, and not panic.
func TestMoEErrors(t *testing.T, b tensor.Backend, opts Options) {
	opts = opts.withDefaults()
	if opts.NewBackend == nil {
		t.Skip("Options.NewBackend is nil: the error tests need fresh backends")
	}
	for _, tc := range moeErrorCases {
		fresh := opts.NewBackend()
		ops, err := tensor.MoEOpsOf(fresh)
		if err != nil {
			t.Fatal(err)
		}
		tc.run(fresh, ops, opts.DType)
		err = fresh.Sync()
		if err == nil {
			t.Errorf("%s with a bad argument: no error", tc.op)
			continue
		}
		if !strings.Contains(err.Error(), tc.op) {
			t.Errorf("%s with a bad argument: error %q does not name the op", tc.op, err)
		}
	}
}
