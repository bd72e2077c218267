package backendtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// The conformance tests of tensor.GroupedGEMM, the grouped expert GEMMs.
// The reference is the CPU's plain MatMul on each group's row views (not its
// grouped op), so the CPU's grouped op is tested by the suite too.

// groupedCase is one grouping of rows: the rows of each group, the rows
// before the first group and after the last (left untouched), and the
// widths K (the input's) and N (the output's).
type groupedCase struct {
	name         string
	counts       []int
	before, past int
	k, n         int
}

func (gc groupedCase) offsets() ([]int32, int) {
	off := make([]int32, len(gc.counts)+1)
	off[0] = int32(gc.before)
	for g, c := range gc.counts {
		off[g+1] = off[g] + int32(c)
	}
	return off, int(off[len(gc.counts)]) + gc.past
}

func groupedCases(h *harness) []groupedCase {
	many := make([]int, 40)
	for g := range many {
		many[g] = h.rng.IntN(6) // 0 to 5 rows: about a sixth empty
	}
	many[0], many[39] = 0, 0
	return []groupedCase{
		{name: "uneven", counts: []int{5, 0, 70, 1, 13}, k: 24, n: 40},
		{name: "ragged K N", counts: []int{3, 66, 0, 17}, k: 21, n: 37},
		{name: "empty experts", counts: []int{0, 0, 9, 0}, k: 16, n: 19},
		{name: "one expert", counts: []int{50}, k: 35, n: 70},
		{name: "many experts", counts: many, k: 13, n: 11},
		{name: "all empty", counts: []int{0, 0, 0}, k: 8, n: 9},
		{name: "rows outside the groups", counts: []int{4, 0, 7}, before: 3, past: 5, k: 10, n: 12},
	}
}

// grouped returns the grouped GEMMs of the backend under test.
func (h *harness) grouped() tensor.GroupedGEMM {
	h.t.Helper()
	g, err := tensor.GroupedOf(h.b)
	if err != nil {
		h.t.Fatal(err)
	}
	return g
}

// view is a view of a host tensor for the reference.
func (h *harness) view(t *tensor.Tensor, off int, shape ...int) *tensor.Tensor {
	h.t.Helper()
	v, err := t.View(off, shape...)
	if err != nil {
		h.t.Fatal(err)
	}
	return v
}

// TestGroupedMatMul checks GroupedMatMul (x·W_eᵀ and dy·W_e) and
// GroupedMatMulTN (dW_e = dyᵀ·x) on uneven, empty, single and many groups,
// ragged widths and rows outside the groups: with beta = 0 into a
// NaN-poisoned output (where every row or group is written) and
// accumulating with alpha, beta.
func TestGroupedMatMul(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 105)
	dev := h.grouped()
	for _, gc := range groupedCases(h) {
		off, m := gc.offsets()
		G, K, N := len(gc.counts), gc.k, gc.n
		offs := h.fromHost(mustInt32(t, off, G+1))
		covered := gc.before == 0 && gc.past == 0
		for _, ab := range [][2]float32{{1, 0}, {0.5, 0.75}} {
			for _, transW := range []bool{true, false} {
				name := fmt.Sprintf("GroupedMatMul %s (G=%d M=%d K=%d N=%d) transW=%v alpha=%v beta=%v", gc.name, G, m, K, N, transW, ab[0], ab[1])
				ws := []int{G, K, N}
				if transW {
					ws = []int{G, N, K}
				}
				a, w := h.rand(h.dt, m, K), h.rand(h.dt, ws...)
				var c pair
				if ab[1] == 0 && covered {
					c = h.out(h.dt, m, N)
				} else {
					c = h.rand(h.dt, m, N)
				}
				dev.GroupedMatMul(c.dev, a.dev, w.dev, offs.dev, transW, ab[0], ab[1])
				for g := range G {
					lo, hi := int(off[g]), int(off[g+1])
					if lo == hi {
						continue
					}
					h.ref.MatMul(h.view(c.ref, lo*N, hi-lo, N), h.view(a.ref, lo*K, hi-lo, K),
						h.view(w.ref, g*N*K, ws[1], ws[2]), false, transW, ab[0], ab[1])
				}
				h.compare(name, c)
			}
			// dW_e = alpha·dy_eᵀ·x_e + beta·dW_e: c (G, P, Q) from a (M, P), b (M, Q).
			name := fmt.Sprintf("GroupedMatMulTN %s (G=%d M=%d P=%d Q=%d) alpha=%v beta=%v", gc.name, G, m, N, K, ab[0], ab[1])
			a, bb := h.rand(h.dt, m, N), h.rand(h.dt, m, K)
			var c pair
			if ab[1] == 0 {
				c = h.out(h.dt, G, N, K)
			} else {
				c = h.rand(h.dt, G, N, K)
			}
			dev.GroupedMatMulTN(c.dev, a.dev, bb.dev, offs.dev, ab[0], ab[1])
			for g := range G {
				lo, hi := int(off[g]), int(off[g+1])
				cg := h.view(c.ref, g*N*K, N, K)
				if lo == hi { // an empty group: c[g] = beta·c[g]
					h.ref.Scale(cg, cg, ab[1])
					if ab[1] == 0 {
						h.ref.Fill(cg, 0)
					}
					continue
				}
				h.ref.MatMul(cg, h.view(a.ref, lo*N, hi-lo, N), h.view(bb.ref, lo*K, hi-lo, K), true, false, ab[0], ab[1])
			}
			h.compare(name, c)
		}
	}
}

func mustInt32(t *testing.T, vals []int32, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromInt32(vals, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

var groupedErrorCases = []struct {
	op, want string
	run      func(b tensor.Backend, g tensor.GroupedGEMM, dt tensor.DType)
}{
	{"GroupedMatMul", "expected (G, N, K) with K = 5", func(b tensor.Backend, g tensor.GroupedGEMM, dt tensor.DType) {
		g.GroupedMatMul(b.Zeros(dt, 6, 4), b.Zeros(dt, 6, 5), b.Zeros(dt, 2, 4, 6), b.Zeros(tensor.Int32, 3), true, 1, 0)
	}},
	{"GroupedMatMul", "(G + 1) for G = 2", func(b tensor.Backend, g tensor.GroupedGEMM, dt tensor.DType) {
		g.GroupedMatMul(b.Zeros(dt, 6, 4), b.Zeros(dt, 6, 5), b.Zeros(dt, 2, 5, 4), b.Zeros(tensor.Int32, 2), false, 1, 0)
	}},
	{"GroupedMatMul", "offsets[2]", func(b tensor.Backend, g tensor.GroupedGEMM, dt tensor.DType) {
		off, _ := tensor.FromInt32([]int32{0, 4, 2}, 3) // decreasing
		offs := b.Zeros(tensor.Int32, 3)
		b.Upload(offs, off)
		g.GroupedMatMul(b.Zeros(dt, 6, 4), b.Zeros(dt, 6, 5), b.Zeros(dt, 2, 4, 5), offs, true, 1, 0)
	}},
	{"GroupedMatMulTN", "offsets[2]", func(b tensor.Backend, g tensor.GroupedGEMM, dt tensor.DType) {
		off, _ := tensor.FromInt32([]int32{0, 3, 7}, 3) // past M = 6
		offs := b.Zeros(tensor.Int32, 3)
		b.Upload(offs, off)
		g.GroupedMatMulTN(b.Zeros(dt, 2, 4, 5), b.Zeros(dt, 6, 4), b.Zeros(dt, 6, 5), offs, 1, 0)
	}},
	{"GroupedMatMulTN", "expected 6 rows", func(b tensor.Backend, g tensor.GroupedGEMM, dt tensor.DType) {
		g.GroupedMatMulTN(b.Zeros(dt, 2, 4, 5), b.Zeros(dt, 6, 4), b.Zeros(dt, 7, 5), b.Zeros(tensor.Int32, 3), 1, 0)
	}},
}

// TestGroupedErrors calls each grouped GEMM with a bad shape or bad offsets
// on a fresh backend: the op must record an error naming it and what was
// wrong, and not panic.
func TestGroupedErrors(t *testing.T, b tensor.Backend, opts Options) {
	opts = opts.withDefaults()
	if opts.NewBackend == nil {
		t.Skip("Options.NewBackend is nil: the error tests need fresh backends")
	}
	for _, tc := range groupedErrorCases {
		fresh := opts.NewBackend()
		g, err := tensor.GroupedOf(fresh)
		if err != nil {
			t.Fatal(err)
		}
		tc.run(fresh, g, opts.DType)
		err = fresh.Sync()
		if err == nil {
			t.Errorf("%s with a bad argument: no error", tc.op)
			continue
		}
		if !strings.Contains(err.Error(), tc.op) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with a bad argument: error %q, want one naming the op and containing %q", tc.op, err, tc.want)
		}
	}
}
