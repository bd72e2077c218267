package ablate

import (
	"errors"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
)

// errNoSplit marks an op that has no GEMM-alone or comm-alone part (the
// MoE op: no GEMM, and its collective is the whole op).
var errNoSplit = errors.New("no separate GEMM and collective")

// moeCase is parallel/ep's layout → dispatch → combine of n = M/P tokens
// (n, d) per rank, top-K of E experts, with the experts the identity: out
// = Σ_j w[n, j]·x[n] = x·Σ_j w[n, j], which the check compares with.
type moeCase struct {
	g           gen
	b           tensor.Backend
	grp         comm.Comm
	st          comm.Stream
	n, d, E, K  int
	me          int
	idx         []int32
	x, wts, out *tensor.Tensor
	disp        *ep.Dispatcher
	sent        int // token-slots this rank sends (both ways: dispatch and combine)
	dtBytes     float64
}

func newMoE(c Cell, g gen, b tensor.Backend, grp comm.Comm, st comm.Stream) (opCase, error) {
	P := grp.Size()
	m := &moeCase{g: g, b: b, grp: grp, st: st, n: c.Shape.M / P, d: c.Shape.N, E: c.Shape.Experts, K: c.Shape.TopK, me: grp.Rank(),
		dtBytes: float64(g.dt.Size())}
	var err error
	if m.x, err = g.upload(b, "moe.x", m.me, m.n, m.d, 0); err != nil {
		return nil, err
	}
	// Each token's K distinct experts, from a hash: the load is near even.
	m.idx = make([]int32, m.n*m.K)
	for t := range m.n {
		h := splitmix(uint64(m.me)<<32 | uint64(t))
		for j := range m.K {
			m.idx[t*m.K+j] = int32((h + uint64(j)) % uint64(m.E))
		}
	}
	// The router's weights, in the activations' dtype (as layers.Router
	// makes them), in [0.25, 0.75).
	hw := tensor.MustHost(g.dt, m.n, m.K)
	wv := make([]float64, m.n*m.K)
	for i := range wv {
		wv[i] = m.weight(i)
	}
	if err := hw.SetFloat64s(wv); err != nil {
		return nil, err
	}
	m.wts = b.Zeros(g.dt, m.n, m.K)
	b.Upload(m.wts, hw)
	m.out = b.Zeros(g.dt, m.n, m.d)
	if m.disp, err = ep.NewDispatcher(b, grp, m.E, st); err != nil {
		return nil, err
	}
	m.sent = m.n * m.K
	return m, nil
}

func (m *moeCase) outputs() []*tensor.Tensor { return []*tensor.Tensor{m.out} }
func (m *moeCase) reset()                    { m.b.Fill(m.out, math.NaN()) }
func (m *moeCase) gemm() error               { return errNoSplit }
func (m *moeCase) comm() error               { return errNoSplit }
func (m *moeCase) flops() float64            { return 0 }
func (m *moeCase) busFactor() float64        { return float64(m.grp.Size()-1) / float64(m.grp.Size()) }
func (m *moeCase) spec() overlap.Spec {
	return overlap.Spec{Kind: overlap.KindExpert, Name: "ablate.moe", Group: m.grp, Backend: m.b, Stream: m.st,
		Rows: m.n, K: m.d, Outs: []int{m.E, m.K}, DType: m.g.dt, Experts: m.E}
}

// bytes is what this rank sends in the dispatch and the combine together.
func (m *moeCase) bytes() float64 { return 2 * float64(m.sent) * float64(m.d) * m.dtBytes }

func (m *moeCase) site(s overlap.Strategy) (func() error, func() error, error) {
	if s.Name() != Collective {
		return nil, nil, s.Supports(m.spec())
	}
	return m.run, func() error { return nil }, nil
}

func (m *moeCase) run() error {
	l, err := m.disp.Layout(m.idx, m.n, m.K, 0)
	if err != nil {
		return err
	}
	recv, h, w, err := m.disp.Dispatch(m.x, l)
	if err != nil {
		return err
	}
	defer m.disp.Release(h)
	if err := w.Wait(m.st); err != nil {
		return err
	}
	return m.disp.Combine(m.out, recv, m.wts, h)
}

func (m *moeCase) sampled(outs [][]float64) float64 {
	ref := make([]float64, m.n*m.d)
	wh := whatHash("moe.x")
	for t := range m.n {
		s := 0.0
		for j := range m.K {
			s += m.weight(t*m.K + j)
		}
		for c := range m.d {
			ref[t*m.d+c] = m.g.at(wh, m.me, t, c, m.d) * s
		}
	}
	return relErr(outs[0], ref)
}

// weight is the router weight of slot i (token i / K, choice i % K),
// rounded to the dtype.
func (m *moeCase) weight(i int) float64 {
	return m.g.dt.Round(0.25 + 0.5*(m.g.at(whatHash("moe.w"), m.me, i, 0, 1)+1)/2)
}
