package ablate

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// opCase is one rank's tensors of a cell group (op, direction, shape,
// world): what every strategy of the group runs on.
type opCase interface {
	// outputs are compared against the collective's.
	outputs() []*tensor.Tensor
	// reset poisons the outputs (NaN) and restores the accumulated
	// gradients, before a checked call.
	reset()
	// site builds the strategy's site; run is one call, waited on the
	// stream.
	site(s overlap.Strategy) (run func() error, close func() error, err error)
	gemm() error // the GEMMs of the op alone
	comm() error // its collective alone
	// sampled checks sampled elements of outs (the collective's outputs,
	// in outputs() order) against the math in float64.
	sampled(outs [][]float64) float64
	flops() float64 // per rank
	bytes() float64 // the collective's message: the larger of its input and output
	busFactor() float64
	spec() overlap.Spec // the site's spec (the autotune key)
}

// hostOutputter is an opCase whose checked outputs are not plain tensors
// (a loss, gradients summed over the group): they replace outputs().
type hostOutputter interface {
	hostOutputs() ([][]float64, error)
}

// verifier is an opCase that says what its collective is checked against.
type verifier interface{ verified() string }

// tp holds what the TP ops share.
type tp struct {
	g       gen
	b       tensor.Backend
	grp     comm.Comm
	st      comm.Stream
	P, me   int
	M, N, K int
	n       int // M/P
	dtBytes float64
	sp      overlap.Spec
	accs    []*tensor.Tensor // accumulated in place: restored from accs0
	accs0   []*tensor.Tensor
	outs    []*tensor.Tensor
	samples int
	bwd     bool
}

// MatMulFunc is a GEMM with tensor.Backend.MatMul's layouts and meaning,
// c = alpha·op(a)·op(b) + beta·c, that can refuse a call (an error, with
// nothing queued and the backend left as it was).
type MatMulFunc func(c, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) error

// engineGemmer is an op whose GEMMs alone can run on another GEMM (the
// GEMM engine of the fused strategy) where the fused strategy uses it.
type engineGemmer interface {
	gemmWith(mm MatMulFunc) error
}

// matmul is the backend's MatMul as a MatMulFunc.
func (t *tp) matmul(c, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) error {
	t.b.MatMul(c, a, b, transA, transB, alpha, beta)
	return nil
}

func (t *tp) outputs() []*tensor.Tensor { return t.outs }
func (t *tp) spec() overlap.Spec        { return t.sp }

func (t *tp) reset() {
	for _, o := range t.outs {
		if !containsT(t.accs, o) {
			t.b.Fill(o, math.NaN())
		}
	}
	for i, a := range t.accs {
		t.b.Copy(a, t.accs0[i])
	}
}

func containsT(ts []*tensor.Tensor, t *tensor.Tensor) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

func (t *tp) up(what string, q, rows, cols, rowOff int) (*tensor.Tensor, error) {
	return t.g.upload(t.b, what, q, rows, cols, rowOff)
}

func (t *tp) v(what string, q, i, j, cols int) float64 {
	return t.g.at(whatHash(what), q, i, j, cols)
}

// waitOn waits for a collective's Work on s.
func waitOn(s comm.Stream) func(comm.Work, error) error {
	return func(w comm.Work, err error) error { return wait(w, err, s) }
}

func wait(w comm.Work, err error, s comm.Stream) error {
	if err != nil {
		return err
	}
	return w.Wait(s)
}

// newCase makes this rank's tensors of the group of c.
func newCase(c Cell, g gen, b tensor.Backend, grp comm.Comm, st comm.Stream) (opCase, error) {
	P := grp.Size()
	if P != c.World {
		return nil, fmt.Errorf("ablate: cell %s on a group of %d ranks: expected %d", c.ID(), P, c.World)
	}
	t := &tp{g: g, b: b, grp: grp, st: st, P: P, me: grp.Rank(), M: c.Shape.M, N: c.Shape.N, K: c.Shape.K,
		n: c.Shape.M / P, dtBytes: float64(g.dt.Size()), bwd: c.Dir == "bwd", samples: 48}
	switch c.Op {
	case OpAllGatherMatmul:
		return newAGMM(t)
	case OpMatmulReduceScatter:
		return newMMRS(t)
	case OpMatmulAllReduce:
		return newMMAR(t)
	case OpMoEDispatchCombine:
		return newMoE(c, g, b, grp, st)
	case OpTPBlock, OpMoELayer, OpTrainStep:
		return newLayerCase(c, g, b, grp, st)
	}
	return nil, fmt.Errorf("ablate: op %s has no cells", c.Op)
}

// sample picks the elements (i, j) of an (r, c) output to check.
func (t *tp) sample(r, c, k int) [][2]int {
	out := make([][2]int, t.samples)
	for s := range out {
		h := splitmix(uint64(s)*7919 + uint64(k)*104729 + uint64(t.me))
		out[s] = [2]int{int(h % uint64(r)), int((h >> 32) % uint64(c))}
	}
	return out
}

func sampledErr(got, ref []float64) float64 { return relErr(got, ref) }

// agmm: x (n, K) this rank's rows, xFull (M, K), w (Nl, K), out (M, Nl);
// backward: dout (M, Nl), dx (n, K) = RS(Σ_q dout_q·w_q), dw (Nl, K) +=
// doutᵀ·xFull.
type agmm struct {
	*tp
	Nl                  int
	x, xFull, w, out    *tensor.Tensor
	dout, dx, dw, dFull *tensor.Tensor
}

func newAGMM(t *tp) (opCase, error) {
	a := &agmm{tp: t, Nl: t.N / t.P}
	var err error
	up := func(dst **tensor.Tensor, what string, q, rows, cols, off int) {
		if err == nil {
			*dst, err = t.up(what, q, rows, cols, off)
		}
	}
	up(&a.x, "x", 0, t.n, t.K, t.me*t.n) // x is one global (M, K) matrix: rank q has rows q·n…
	up(&a.xFull, "x", 0, t.M, t.K, 0)
	up(&a.w, "w", t.me, a.Nl, t.K, 0)
	if err != nil {
		return nil, err
	}
	t.sp = overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "ablate.all-gather-matmul", Group: t.grp, Backend: t.b, Stream: t.st,
		Rows: t.n, K: t.K, Outs: []int{a.Nl}, DType: t.g.dt}
	if !t.bwd {
		a.out = t.b.Zeros(t.g.dt, t.M, a.Nl)
		t.outs = []*tensor.Tensor{a.out}
		return a, nil
	}
	up(&a.dout, "dout", t.me, t.M, a.Nl, 0)
	up(&a.dw, "dw", t.me, a.Nl, t.K, 0)
	if err != nil {
		return nil, err
	}
	a.dx = t.b.Zeros(t.g.dt, t.n, t.K)
	a.dFull = t.b.Zeros(t.g.dt, t.M, t.K)
	dw0 := t.b.Zeros(t.g.dt, a.Nl, t.K)
	t.b.Copy(dw0, a.dw)
	t.accs, t.accs0 = []*tensor.Tensor{a.dw}, []*tensor.Tensor{dw0}
	t.outs = []*tensor.Tensor{a.dx, a.dw}
	return a, nil
}

func (a *agmm) flops() float64 {
	f := 2 * float64(a.M) * float64(a.Nl) * float64(a.K)
	if a.bwd {
		return 2 * f
	}
	return f
}
func (a *agmm) bytes() float64     { return float64(a.M) * float64(a.K) * a.dtBytes }
func (a *agmm) busFactor() float64 { return float64(a.P-1) / float64(a.P) }

func (a *agmm) site(s overlap.Strategy) (func() error, func() error, error) {
	site, err := s.NewAllGatherMatmul(a.sp)
	if err != nil {
		return nil, nil, err
	}
	if !a.bwd {
		return func() error {
			return site.Forward([]*tensor.Tensor{a.out}, a.xFull, a.x, []*tensor.Tensor{a.w})
		}, site.Close, nil
	}
	return func() error {
		w, err := site.Backward(a.dx, []*tensor.Tensor{a.dw}, []*tensor.Tensor{a.dout}, a.xFull, []*tensor.Tensor{a.w})
		return wait(w, err, a.st)
	}, site.Close, nil
}

func (a *agmm) gemm() error { return a.gemmWith(a.matmul) }

// gemmWith is the op's GEMMs alone with mm for the products the fused
// strategy gives the GEMM engine (the forward; the backward's dx partial),
// the backend's MatMul for the rest (the weight gradient, cuBLASLt there
// too).
func (a *agmm) gemmWith(mm MatMulFunc) error {
	if !a.bwd {
		return mm(a.out, a.xFull, a.w, false, true, 1, 0)
	}
	if err := mm(a.dFull, a.dout, a.w, false, false, 1, 0); err != nil {
		return err
	}
	a.b.MatMul(a.dw, a.dout, a.xFull, true, false, 1, 1)
	return nil
}

func (a *agmm) comm() error {
	if !a.bwd {
		return waitOn(a.st)(a.grp.AllGather(a.xFull, a.x, a.st))
	}
	return waitOn(a.st)(a.grp.ReduceScatter(a.dx, a.dFull, comm.Sum, a.st))
}

func (a *agmm) sampled(outs [][]float64) float64 {
	var got, ref []float64
	if !a.bwd {
		for _, e := range a.sample(a.M, a.Nl, 0) {
			s := 0.0
			for k := range a.K {
				s += a.v("x", 0, e[0], k, a.K) * a.v("w", a.me, e[1], k, a.K)
			}
			got, ref = append(got, outs[0][e[0]*a.Nl+e[1]]), append(ref, s)
		}
		return sampledErr(got, ref)
	}
	for _, e := range a.sample(a.n, a.K, 1) { // dx: rows me·n… of Σ_q dout_q·w_q
		s := 0.0
		for q := range a.P {
			for j := range a.Nl {
				s += a.v("dout", q, a.me*a.n+e[0], j, a.Nl) * a.v("w", q, j, e[1], a.K)
			}
		}
		got, ref = append(got, outs[0][e[0]*a.K+e[1]]), append(ref, s)
	}
	for _, e := range a.sample(a.Nl, a.K, 2) { // dw = dw0 + doutᵀ·X
		s := a.v("dw", a.me, e[0], e[1], a.K)
		for i := range a.M {
			s += a.v("dout", a.me, i, e[0], a.Nl) * a.v("x", 0, i, e[1], a.K)
		}
		got, ref = append(got, outs[1][e[0]*a.K+e[1]]), append(ref, s)
	}
	return sampledErr(got, ref)
}

// mmrs: x (M, Kl), w (N, Kl), out (n, N) = rows me·n… of Σ_q x_q·w_qᵀ;
// backward: dout (n, N), G = the stacked dout (M, N), dx (M, Kl) = G·w,
// dw (N, Kl) += Gᵀ·x.
type mmrs struct {
	*tp
	Kl                     int
	x, w, out, partial     *tensor.Tensor
	dout, doutFull, dx, dw *tensor.Tensor
}

func newMMRS(t *tp) (opCase, error) {
	m := &mmrs{tp: t, Kl: t.K / t.P}
	var err error
	up := func(dst **tensor.Tensor, what string, q, rows, cols, off int) {
		if err == nil {
			*dst, err = t.up(what, q, rows, cols, off)
		}
	}
	up(&m.x, "x", t.me, t.M, m.Kl, 0)
	up(&m.w, "w", t.me, t.N, m.Kl, 0)
	if err != nil {
		return nil, err
	}
	t.sp = overlap.Spec{Kind: overlap.KindMatmulReduceScatter, Name: "ablate.matmul-reduce-scatter", Group: t.grp, Backend: t.b, Stream: t.st,
		Rows: t.M, K: m.Kl, Outs: []int{t.N}, DType: t.g.dt}
	if !t.bwd {
		m.out = t.b.Zeros(t.g.dt, t.n, t.N)
		m.partial = t.b.Zeros(t.g.dt, t.M, t.N)
		t.outs = []*tensor.Tensor{m.out}
		return m, nil
	}
	up(&m.dout, "dout", 0, t.n, t.N, t.me*t.n) // one global (M, N) gradient: rank q has rows q·n…
	up(&m.doutFull, "dout", 0, t.M, t.N, 0)
	up(&m.dw, "dw", t.me, t.N, m.Kl, 0)
	if err != nil {
		return nil, err
	}
	m.dx = t.b.Zeros(t.g.dt, t.M, m.Kl)
	dw0 := t.b.Zeros(t.g.dt, t.N, m.Kl)
	t.b.Copy(dw0, m.dw)
	t.accs, t.accs0 = []*tensor.Tensor{m.dw}, []*tensor.Tensor{dw0}
	t.outs = []*tensor.Tensor{m.dx, m.dw}
	return m, nil
}

func (m *mmrs) flops() float64 {
	f := 2 * float64(m.M) * float64(m.N) * float64(m.Kl)
	if m.bwd {
		return 2 * f
	}
	return f
}
func (m *mmrs) bytes() float64     { return float64(m.M) * float64(m.N) * m.dtBytes }
func (m *mmrs) busFactor() float64 { return float64(m.P-1) / float64(m.P) }

func (m *mmrs) site(s overlap.Strategy) (func() error, func() error, error) {
	site, err := s.NewMatmulReduceScatter(m.sp)
	if err != nil {
		return nil, nil, err
	}
	if !m.bwd {
		return func() error { return site.Forward(m.out, m.x, m.w) }, site.Close, nil
	}
	return func() error {
		w, err := site.Backward(m.dx, m.dw, m.dout, m.x, m.w)
		return wait(w, err, m.st)
	}, site.Close, nil
}

func (m *mmrs) gemm() error { return m.gemmWith(m.matmul) }

// gemmWith: as agmm's (the engine's products: the forward's partial, the
// backward's dx).
func (m *mmrs) gemmWith(mm MatMulFunc) error {
	if !m.bwd {
		return mm(m.partial, m.x, m.w, false, true, 1, 0)
	}
	if err := mm(m.dx, m.doutFull, m.w, false, false, 1, 0); err != nil {
		return err
	}
	m.b.MatMul(m.dw, m.doutFull, m.x, true, false, 1, 1)
	return nil
}

func (m *mmrs) comm() error {
	if !m.bwd {
		return waitOn(m.st)(m.grp.ReduceScatter(m.out, m.partial, comm.Sum, m.st))
	}
	return waitOn(m.st)(m.grp.AllGather(m.doutFull, m.dout, m.st))
}

func (m *mmrs) sampled(outs [][]float64) float64 {
	var got, ref []float64
	if !m.bwd {
		for _, e := range m.sample(m.n, m.N, 0) {
			s := 0.0
			for q := range m.P {
				for k := range m.Kl {
					s += m.v("x", q, m.me*m.n+e[0], k, m.Kl) * m.v("w", q, e[1], k, m.Kl)
				}
			}
			got, ref = append(got, outs[0][e[0]*m.N+e[1]]), append(ref, s)
		}
		return sampledErr(got, ref)
	}
	for _, e := range m.sample(m.M, m.Kl, 1) { // dx = G·w
		s := 0.0
		for j := range m.N {
			s += m.v("dout", 0, e[0], j, m.N) * m.v("w", m.me, j, e[1], m.Kl)
		}
		got, ref = append(got, outs[0][e[0]*m.Kl+e[1]]), append(ref, s)
	}
	for _, e := range m.sample(m.N, m.Kl, 2) { // dw = dw0 + Gᵀ·x
		s := m.v("dw", m.me, e[0], e[1], m.Kl)
		for i := range m.M {
			s += m.v("dout", 0, i, e[0], m.N) * m.v("x", m.me, i, e[1], m.Kl)
		}
		got, ref = append(got, outs[1][e[0]*m.Kl+e[1]]), append(ref, s)
	}
	return sampledErr(got, ref)
}

// mmar, forward (the row-parallel exit without sequence parallelism): a
// (M, Kl), w (N, Kl), out (M, N) = Σ_q a_q·w_qᵀ. Backward (the
// column-parallel entry's, dx = all-reduce of the input gradient): a = dy
// (M, Nl), w (Nl, K), out = dx (M, K) = Σ_q dy_q·w_q.
type mmar struct {
	*tp
	Kl, Nl    int // the split widths: the forward's inner, the backward's
	a, w, out *tensor.Tensor
}

func newMMAR(t *tp) (opCase, error) {
	m := &mmar{tp: t, Kl: t.K / t.P, Nl: t.N / t.P}
	ar, ac, wr, wc, or, oc := t.M, m.Kl, t.N, m.Kl, t.M, t.N
	k, outs := m.Kl, t.N
	if t.bwd {
		ar, ac, wr, wc, or, oc = t.M, m.Nl, m.Nl, t.K, t.M, t.K
		k, outs = t.K, m.Nl
	}
	var err error
	if m.a, err = t.up("a", t.me, ar, ac, 0); err != nil {
		return nil, err
	}
	if m.w, err = t.up("w", t.me, wr, wc, 0); err != nil {
		return nil, err
	}
	m.out = t.b.Zeros(t.g.dt, or, oc)
	t.outs = []*tensor.Tensor{m.out}
	t.sp = overlap.Spec{Kind: overlap.KindMatmulAllReduce, Name: "ablate.matmul-all-reduce", Group: t.grp, Backend: t.b, Stream: t.st,
		Rows: t.M, K: k, Outs: []int{outs}, DType: t.g.dt}
	return m, nil
}

func (m *mmar) flops() float64 {
	if m.bwd {
		return 2 * float64(m.M) * float64(m.Nl) * float64(m.K)
	}
	return 2 * float64(m.M) * float64(m.N) * float64(m.Kl)
}

func (m *mmar) bytes() float64 {
	return float64(m.out.Shape().Numel()) * m.dtBytes
}
func (m *mmar) busFactor() float64 { return 2 * float64(m.P-1) / float64(m.P) }

func (m *mmar) site(s overlap.Strategy) (func() error, func() error, error) {
	site, err := s.NewMatmulAllReduce(m.sp)
	if err != nil {
		return nil, nil, err
	}
	return func() error {
		w, err := site.Run(m.out, []*tensor.Tensor{m.a}, []*tensor.Tensor{m.w}, !m.bwd)
		return wait(w, err, m.st)
	}, site.Close, nil
}

func (m *mmar) gemm() error {
	m.b.MatMul(m.out, m.a, m.w, false, !m.bwd, 1, 0)
	return nil
}

func (m *mmar) comm() error { return waitOn(m.st)(m.grp.AllReduce(m.out, comm.Sum, m.st)) }

func (m *mmar) sampled(outs [][]float64) float64 {
	var got, ref []float64
	cols := m.out.Shape()[1]
	for _, e := range m.sample(m.M, cols, 0) {
		s := 0.0
		for q := range m.P {
			if m.bwd {
				for j := range m.Nl {
					s += m.v("a", q, e[0], j, m.Nl) * m.v("w", q, j, e[1], m.K)
				}
				continue
			}
			for k := range m.Kl {
				s += m.v("a", q, e[0], k, m.Kl) * m.v("w", q, e[1], k, m.Kl)
			}
		}
		got, ref = append(got, outs[0][e[0]*cols+e[1]]), append(ref, s)
	}
	return sampledErr(got, ref)
}
