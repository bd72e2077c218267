package overlaptest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Case is one shape of the suite: Rows rows per rank (the sequence-parallel
// shard; the rows of matmul∘all-reduce), K inner features, one output
// width per weight.
type Case struct {
	Rows int
	K    int
	Outs []int
}

func (c Case) String() string { return fmt.Sprintf("rows=%d,K=%d,outs=%v", c.Rows, c.K, c.Outs) }

// Cases are the suite's shapes: ragged row counts (1, odd, prime) and
// widths that are not multiples of 8, one weight and several sharing one
// gather. Every output has a few dozen elements or more, so that a bf16
// sum of partials that happens to cancel in one element cannot dominate
// the relative error of the whole tensor.
func Cases() []Case {
	return []Case{
		{Rows: 1, K: 16, Outs: []int{40}},
		{Rows: 5, K: 24, Outs: []int{12, 20, 12}},
		{Rows: 13, K: 21, Outs: []int{8, 5}},
		{Rows: 32, K: 24, Outs: []int{16}},
		// Widths of multiples of 8 (what the fused strategy's GEMM engine
		// takes) with ragged rows.
		{Rows: 7, K: 40, Outs: []int{24, 56, 24}},
		{Rows: 3, K: 64, Outs: []int{136}},
	}
}

// Tolerance is the bound on ‖out − ref‖ / ‖ref‖ for a dtype: float64 1e-12,
// float32 1e-5, bf16 1e-2.
func Tolerance(dt tensor.DType) float64 { return dt.Tolerance() }

// Rank is one rank's side of a suite run: its group, backend and stream,
// the strategy under test and the dtype of the tensors.
type Rank struct {
	Group    comm.Comm
	Backend  tensor.Backend
	Stream   comm.Stream
	Strategy overlap.Strategy
	DType    tensor.DType
	// Seed makes the inputs; every rank of a run must use the same one.
	Seed uint64
}

func (r Rank) spec(kind overlap.Kind, c Case) overlap.Spec {
	return overlap.Spec{Kind: kind, Name: "suite." + string(kind), Group: r.Group, Backend: r.Backend, Stream: r.Stream,
		Rows: c.Rows, K: c.K, Outs: c.Outs, DType: r.DType}
}

// CheckAll runs every site kind on every case, twice per site (the second
// call with fresh inputs: persistent buffers must not leak state), on this
// rank. Every rank of the group calls it with the same arguments.
func (r Rank) CheckAll() error {
	_, err := r.CheckAllReport()
	return err
}

// CheckAllReport is CheckAll, returning also the (site kind, case) pairs
// the strategy declares it cannot build (Supports wraps
// overlap.ErrUnavailable: the fused strategy takes widths of multiples of
// 8 and no matmul∘all-reduce), each with the strategy's reason, so that a
// caller can print them; every other pair is checked.
func (r Rank) CheckAllReport() (skipped []string, err error) {
	unavailable := func(kind overlap.Kind, c Case) bool {
		e := r.Strategy.Supports(r.spec(kind, c))
		if e != nil && errors.Is(e, overlap.ErrUnavailable) {
			skipped = append(skipped, fmt.Sprintf("%s %s %v: %v", r.Strategy.Name(), kind, c, e))
			return true
		}
		return false
	}
	for _, c := range Cases() {
		if !unavailable(overlap.KindAllGatherMatmul, c) {
			if err := r.CheckAllGatherMatmul(c); err != nil {
				return skipped, fmt.Errorf("%s all-gather-matmul %v: %w", r.Strategy.Name(), c, err)
			}
		}
		if !unavailable(overlap.KindMatmulReduceScatter, c) {
			if err := r.CheckMatmulReduceScatter(c); err != nil {
				return skipped, fmt.Errorf("%s matmul-reduce-scatter %v: %w", r.Strategy.Name(), c, err)
			}
		}
		if unavailable(overlap.KindMatmulAllReduce, c) {
			continue
		}
		for _, transW := range []bool{true, false} {
			if err := r.CheckMatmulAllReduce(c, transW); err != nil {
				return skipped, fmt.Errorf("%s matmul-all-reduce %v transW=%v: %w", r.Strategy.Name(), c, transW, err)
			}
		}
	}
	return skipped, nil
}

// CheckAllGatherMatmul checks the entry site against the unsharded math in
// float64: out_i = X·w_iᵀ with X the rows of every rank; dx = rows r of
// Σ_q Σ_i dout_i^q·w_i^q; dw_i += dout_iᵀ·X.
func (r Rank) CheckAllGatherMatmul(c Case) error {
	site, err := r.Strategy.NewAllGatherMatmul(r.spec(overlap.KindAllGatherMatmul, c))
	if err != nil {
		return err
	}
	defer site.Close()
	P, me, n := r.Group.Size(), r.Group.Rank(), c.Rows
	N := P * n
	for call := range 2 {
		gen := func(q int, what string, rows, cols int) mat { return r.gen(call, q, what, rows, cols) }
		X := mat{0, c.K, nil}
		for q := range P {
			X = X.stack(gen(q, "x", n, c.K))
		}
		x := r.upload(gen(me, "x", n, c.K))
		xFull := r.poisoned(N, c.K)
		ws, outs, douts, dws := make([]*tensor.Tensor, len(c.Outs)), make([]*tensor.Tensor, len(c.Outs)), make([]*tensor.Tensor, len(c.Outs)), make([]*tensor.Tensor, len(c.Outs))
		refDX := zeros(n, c.K)
		var refDW []mat
		for i, m := range c.Outs {
			ws[i] = r.upload(gen(me, fmt.Sprint("w", i), m, c.K))
			outs[i] = r.poisoned(N, m)
			douts[i] = r.upload(gen(me, fmt.Sprint("dout", i), N, m))
			dw0 := gen(me, fmt.Sprint("dw", i), m, c.K)
			dws[i] = r.upload(dw0)
			for q := range P {
				full := matmul(gen(q, fmt.Sprint("dout", i), N, m), gen(q, fmt.Sprint("w", i), m, c.K), false)
				refDX = refDX.add(full.rows(me*n, (me+1)*n))
			}
			refDW = append(refDW, dw0.add(matmul(gen(me, fmt.Sprint("dout", i), N, m).t(), X, false)))
		}
		if err := site.Forward(outs, xFull, x, ws); err != nil {
			return err
		}
		if err := r.near("xFull", xFull, X); err != nil {
			return fmt.Errorf("call %d: %w", call, err)
		}
		for i := range c.Outs {
			if err := r.near(fmt.Sprint("out ", i), outs[i], matmul(X, gen(me, fmt.Sprint("w", i), c.Outs[i], c.K).t(), false)); err != nil {
				return fmt.Errorf("call %d: %w", call, err)
			}
		}
		dx := r.poisoned(n, c.K)
		w, err := site.Backward(dx, dws, douts, xFull, ws)
		if err == nil {
			err = w.Wait(r.Stream)
		}
		if err != nil {
			return err
		}
		if err := r.near("dx", dx, refDX); err != nil {
			return fmt.Errorf("call %d: %w", call, err)
		}
		for i := range c.Outs {
			if err := r.near(fmt.Sprint("dw ", i), dws[i], refDW[i]); err != nil {
				return fmt.Errorf("call %d: %w", call, err)
			}
		}
	}
	return nil
}

// CheckMatmulReduceScatter checks the exit site: out = rows r of
// Σ_q x^q·w^qᵀ; with G = the stacked dout of every rank, dx = G·w and
// dw += Gᵀ·x.
func (r Rank) CheckMatmulReduceScatter(c Case) error {
	site, err := r.Strategy.NewMatmulReduceScatter(r.spec(overlap.KindMatmulReduceScatter, c))
	if err != nil {
		return err
	}
	defer site.Close()
	P, me, n, m := r.Group.Size(), r.Group.Rank(), c.Rows, c.Outs[0]
	N := P * n
	for call := range 2 {
		gen := func(q int, what string, rows, cols int) mat { return r.gen(call, q, what, rows, cols) }
		ref := zeros(n, m)
		G := mat{0, m, nil}
		for q := range P {
			ref = ref.add(matmul(gen(q, "x", N, c.K), gen(q, "w", m, c.K).t(), false).rows(me*n, (me+1)*n))
			G = G.stack(gen(q, "dout", n, m))
		}
		xm, wm, dw0 := gen(me, "x", N, c.K), gen(me, "w", m, c.K), gen(me, "dw", m, c.K)
		x, w, out := r.upload(xm), r.upload(wm), r.poisoned(n, m)
		if err := site.Forward(out, x, w); err != nil {
			return err
		}
		if err := r.near("out", out, ref); err != nil {
			return fmt.Errorf("call %d: %w", call, err)
		}
		dx, dw := r.poisoned(N, c.K), r.upload(dw0)
		wk, err := site.Backward(dx, dw, r.upload(gen(me, "dout", n, m)), x, w)
		if err == nil {
			err = wk.Wait(r.Stream)
		}
		if err != nil {
			return err
		}
		if err := r.near("dx", dx, matmul(G, wm, false)); err != nil {
			return fmt.Errorf("call %d: %w", call, err)
		}
		if err := r.near("dw", dw, dw0.add(matmul(G.t(), xm, false))); err != nil {
			return fmt.Errorf("call %d: %w", call, err)
		}
	}
	return nil
}

// CheckMatmulAllReduce checks out = Σ_q Σ_i a_i^q·op(w_i^q), the inner
// widths K_i taken from c.Outs and the output width from c.K.
func (r Rank) CheckMatmulAllReduce(c Case, transW bool) error {
	site, err := r.Strategy.NewMatmulAllReduce(r.spec(overlap.KindMatmulAllReduce, c))
	if err != nil {
		return err
	}
	defer site.Close()
	P, me, R, C := r.Group.Size(), r.Group.Rank(), c.Rows, c.K
	for call := range 2 {
		gen := func(q int, what string, rows, cols int) mat { return r.gen(call, q, what, rows, cols) }
		wshape := func(k int) (int, int) {
			if transW {
				return C, k
			}
			return k, C
		}
		ref := zeros(R, C)
		as, ws := make([]*tensor.Tensor, len(c.Outs)), make([]*tensor.Tensor, len(c.Outs))
		for i, k := range c.Outs {
			wr, wc := wshape(k)
			for q := range P {
				wq := gen(q, fmt.Sprint("w", i), wr, wc)
				if transW {
					wq = wq.t()
				}
				ref = ref.add(matmul(gen(q, fmt.Sprint("a", i), R, k), wq, false))
			}
			as[i] = r.upload(gen(me, fmt.Sprint("a", i), R, k))
			ws[i] = r.upload(gen(me, fmt.Sprint("w", i), wr, wc))
		}
		out := r.poisoned(R, C)
		wk, err := site.Run(out, as, ws, transW)
		if err == nil {
			err = wk.Wait(r.Stream)
		}
		if err != nil {
			return err
		}
		if err := r.near("out", out, ref); err != nil {
			return fmt.Errorf("call %d: %w", call, err)
		}
	}
	return nil
}

// gen is the seeded input `what` of rank q for the call, rounded to the
// run's dtype (so the reference sees exactly what the site sees); every
// rank can make every rank's inputs.
func (r Rank) gen(call, q int, what string, rows, cols int) mat {
	h := uint64(14695981039346656037)
	for _, ch := range fmt.Sprintf("%s/%d/%d", what, q, call) {
		h = (h ^ uint64(ch)) * 1099511628211
	}
	rng := rand.New(rand.NewPCG(r.Seed, h))
	m := zeros(rows, cols)
	for i := range m.v {
		m.v[i] = r.DType.Round(rng.Float64()*2 - 1)
	}
	return m
}

func (r Rank) upload(m mat) *tensor.Tensor {
	return testutil.Upload(r.Backend, r.DType, m.v, m.r, m.c)
}

// poisoned is an output tensor filled with NaN, so an unwritten element
// fails the check.
func (r Rank) poisoned(rows, cols int) *tensor.Tensor {
	return testutil.Poisoned(r.Backend, r.DType, rows, cols)
}

// near downloads t and checks ‖t − ref‖ / ‖ref‖ against the dtype's
// tolerance; a NaN (an unwritten element) never passes.
func (r Rank) near(name string, t *tensor.Tensor, ref mat) error {
	if err := r.Backend.Sync(); err != nil {
		return err
	}
	h := tensor.MustHost(r.DType, t.Shape()...)
	r.Backend.Download(h, t)
	if err := r.Backend.Sync(); err != nil {
		return err
	}
	got, err := h.Float64s()
	if err != nil {
		return err
	}
	if len(got) != len(ref.v) {
		return fmt.Errorf("%s: %d elements, expected %d", name, len(got), len(ref.v))
	}
	var num, den float64
	for i, g := range got {
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return fmt.Errorf("%s: element %d is %v (unwritten or overflowed), expected %.6g", name, i, g, ref.v[i])
		}
		d := g - ref.v[i]
		num += d * d
		den += ref.v[i] * ref.v[i]
	}
	rel := math.Sqrt(num / max(den, 1e-300))
	if rel > Tolerance(r.DType) {
		return fmt.Errorf("%s: relative error %.3g, expected ≤ %.0e", name, rel, Tolerance(r.DType))
	}
	return nil
}
