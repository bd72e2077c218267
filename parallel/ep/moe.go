package ep

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// Parallel is how an expert-parallel layer communicates, as tp.Parallel is
// for a tensor-parallel one: the group it spans, the chooser of its
// communication site's strategy and the backend's stream, plus what is the
// expert path's own. It is passed by value to New; nothing is read from
// globals.
type Parallel struct {
	// Group is the EP group (required): its P ranks hold distinct experts,
	// E/P each, in rank order.
	Group comm.Comm
	// Overlap chooses the strategy of the layer's expert-path site
	// (overlap.KindExpert, named after the layer); nil gives it
	// overlap.Collective.
	Overlap *overlap.Chooser
	// Stream is the stream the backend queues its ops on, the one the
	// collectives are ordered with (nil on the CPU).
	Stream comm.Stream
	// TokenGroup, when set, makes the step's tokens those of the token
	// group rather than of the EP group alone (Dispatcher.SetTokenGroup):
	// a group whose consecutive runs of P ranks are the EP groups and
	// whose ranks all bring different tokens — comm.Grid's World in a
	// model whose MoE blocks give each rank its own slice of the batch.
	// The auxiliary losses, the statistics, the capacity and the drops are
	// then those of the tokens of the whole token group, in its rank
	// order: the layer over the token group equals layers.MoE over the
	// concatenation of all its ranks' tokens, once the router's gradients
	// are summed over the token group and the experts' over the ranks that
	// hold the same experts. nil: the EP group.
	TokenGroup comm.Comm
	// MaxTokens sizes the expert path's persistent buffers for at most
	// MaxTokens tokens per rank and step, and refuses a step with more
	// (0: the buffers grow to the largest step seen). The pipelined and
	// fused expert paths and the device step need it.
	MaxTokens int
	// AuxGradScale multiplies the gradient of the auxiliary losses (not
	// their values); 0 means 1. With 1, summing the router gradients over
	// the EP group gives the gradient of the group's AuxLoss; if the
	// gradients are averaged over D ranks instead, and every rank adds
	// AuxLoss to its own loss, set the size of the token group (see the
	// package documentation).
	AuxGradScale float64
}

// MoE is the expert-parallel mixture-of-experts layer: the router
// replicated on every rank of the EP group, the experts spread over it.
// Forward and Backward take this rank's tokens; the layer is equivalent to
// layers.MoE over the tokens of the whole group, concatenated in rank order
// (see the package documentation).
type MoE struct {
	Name     string          // the layer's name, its parameters' prefix
	Router   *layers.Router  // replicated
	Experts  *layers.Experts // this rank's experts
	Dispatch ExpertPath      // the layer's communication site (*Dispatcher: collective)

	cfg   layers.MoEConfig
	b     tensor.Backend
	group comm.Comm // par.Group
	par   Parallel

	// The last Forward.
	n      int
	h      *Handle
	global layers.LoadStats
	recv   *tensor.Tensor // (M_recv, C) received rows
	xe, ye *tensor.Tensor // (M_recv, C) in expert order
	yr     *tensor.Tensor // (M_recv, C) expert outputs in received order
	// Backward scratch.
	dw       *tensor.Tensor // (N, K)
	dye, dxe *tensor.Tensor // (M_recv, C) expert order
	dxr      *tensor.Tensor // (M_recv, C) received order
	dev      *deviceStep    // the device step's (DeviceOffsets); nil before one
	closed   bool           // Close has released the expert path
}

// New registers the layer's parameters in ps under the names layers.NewMoE
// uses: name+".router.weight" (E, C), replicated, and name+".w_gate",
// ".w_up", ".w_down" as this rank's slice [r·E/P, (r+1)·E/P) of the stacked
// expert weights, initialised (layers.ShardInit) with exactly the values
// the unsharded layer gets from the same seed. cfg.Experts must divide by
// the group size.
func New(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg layers.MoEConfig) (*MoE, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ep: moe %q: %w", name, err)
	}
	if ps == nil {
		return nil, fmt.Errorf("ep: moe %q: nil parameter set", name)
	}
	if par.Group == nil || b == nil {
		return nil, fmt.Errorf("ep: moe %q: nil backend or EP group (Parallel.Group)", name)
	}
	switch {
	case par.MaxTokens < 0:
		return nil, fmt.Errorf("ep: moe %q: Parallel.MaxTokens = %d, expected ≥ 0 (0: no bound)", name, par.MaxTokens)
	case !(par.AuxGradScale >= 0) || math.IsInf(par.AuxGradScale, 0):
		return nil, fmt.Errorf("ep: moe %q: Parallel.AuxGradScale = %v, expected a finite value ≥ 0 (0 means 1)", name, par.AuxGradScale)
	case par.AuxGradScale == 0:
		par.AuxGradScale = 1
	}
	m := &MoE{Name: name, cfg: cfg, b: b, group: par.Group, par: par}
	var err error
	if m.Dispatch, err = newExpertPath(b, name, cfg.Experts, cfg.Dim, par); err != nil {
		return nil, fmt.Errorf("ep: moe %q: %w", name, err)
	}
	if m.Router, err = layers.NewRouter(b, ps, name+".router", layers.RouterConfig{Dim: cfg.Dim, Experts: cfg.Experts, TopK: cfg.TopK,
		Std: cfg.Std, AuxLossCoef: cfg.AuxLossCoef, ZLossCoef: cfg.ZLossCoef}); err != nil {
		return nil, err
	}
	m.Router.AuxGradScale = m.par.AuxGradScale
	first, count := m.Dispatch.LocalExperts()
	if m.Experts, err = layers.NewExperts(b, ps, name, layers.ExpertsConfig{Dim: cfg.Dim, Hidden: cfg.Hidden, Experts: cfg.Experts,
		First: first, Count: count, Std: cfg.Std, OutStd: cfg.OutStd}); err != nil {
		return nil, err
	}
	return m, nil
}

// Config returns the layer's configuration.
func (m *MoE) Config() layers.MoEConfig { return m.cfg }

// Params returns the router weight, then this rank's w_gate, w_up, w_down.
func (m *MoE) Params() []*layers.Param {
	return append([]*layers.Param{m.Router.W}, m.Experts.Params()...)
}

// SetAuxWeight weights the gradient of the router's auxiliary losses
// (layers.AuxWeighter: 1/k for each of a step's k micro-batches).
func (m *MoE) SetAuxWeight(w float64) { m.Router.SetAuxWeight(w) }

// ReplicatedParams returns the parameters every rank holds whole (the
// router weight).
func (m *MoE) ReplicatedParams() []*layers.Param { return []*layers.Param{m.Router.W} }

// ExpertParams returns this rank's expert weights.
func (m *MoE) ExpertParams() []*layers.Param { return m.Experts.Params() }

// Shards describes every parameter against the parameter of the same
// name in the unsharded layer (layers.MoE): the router weight replicated
// (its gradient covers this rank's tokens: reduce it like a dense weight's,
// over every rank that holds a copy and saw other tokens), the expert
// weights as the experts [Lo, Hi) of dimension 0, split over the EP group
// (their gradient covers every token of the group routed to them: reduce
// them over the ranks that hold the same experts in other EP groups,
// comm.Grid's EDP group, never over the EP group). parallel/grads reduces
// by these descriptions.
func (m *MoE) Shards() []shard.Shard {
	E := m.cfg.Experts
	out := []shard.Shard{shard.Replicated(m.Router.W, false)}
	for _, p := range m.Experts.Params() {
		full := p.Shape().Clone()
		full[0] = E
		out = append(out, shard.Shard{Param: p, Full: full, Over: shard.EP, Dim: 0, Lo: m.Experts.First, Hi: m.Experts.First + m.Experts.Count})
	}
	return out
}

func (m *MoE) what() string {
	return fmt.Sprintf("ep moe %s on %s rank %d", m.Name, m.group.Name(), m.group.Rank())
}

// AuxLoss is the auxiliary loss of the last Forward over the tokens of the
// whole EP group, or of the token group when set (the same value on every
// rank; 0 before a Forward).
func (m *MoE) AuxLoss() float64 {
	if m.n == 0 {
		return 0
	}
	if m.onDevice() {
		if err := m.resolve(); err != nil {
			return math.NaN()
		}
	}
	return m.Router.AuxLoss()
}

// Stats describes the routing of the last Forward over the whole EP group,
// or the token group when set (the same on every rank).
func (m *MoE) Stats() layers.MoEStats {
	if m.n == 0 {
		return layers.MoEStats{Name: m.Name}
	}
	if m.onDevice() {
		if err := m.resolve(); err != nil {
			return layers.MoEStats{Name: m.Name, AuxLoss: math.NaN()}
		}
		return layers.NewMoEStats(m.Name, m.Router, m.global, m.dev.cur.dropped)
	}
	return layers.NewMoEStats(m.Name, m.Router, m.global, m.h.Dropped())
}

// onDevice reports whether the last Forward was a device step.
func (m *MoE) onDevice() bool { return m.h != nil && m.h.Offsets != nil }

// Close releases the layer's expert path (its Close, when it has one: an
// io.Closer, such as the collective *Dispatcher, which frees its row
// buffers, or parallel/ep/peerep's path, which frees its symmetric
// buffers and its dispatch engine). It is collective over the EP group
// (freeing symmetric memory is): every rank closes its layers in the same
// order, after the device work that uses them. A second Close releases
// nothing and returns nil; Forward and Backward then refuse.
func (m *MoE) Close() error {
	if m.closed {
		return nil
	}
	m.closed, m.n = true, 0
	if c, ok := m.Dispatch.(io.Closer); ok {
		if err := c.Close(); err != nil {
			return fmt.Errorf("%s: closing its expert path: %w", m.what(), err)
		}
	}
	return nil
}

// Handle returns the protocol handle of the last Forward (nil before one):
// the counts exchanged, for metrics and tests.
func (m *MoE) Handle() *Handle { return m.h }

// Forward writes out (..., C) from this rank's tokens x (..., C), which
// must stay unchanged until Backward. It is collective over the EP group:
// every rank calls it, in the same order as its other collectives.
func (m *MoE) Forward(out, x *tensor.Tensor) error {
	m.n = 0
	if m.closed {
		return fmt.Errorf("%s: the layer is closed (Close)", m.what())
	}
	n, err := m.checkRows("input x", x, -1)
	if err != nil {
		return err
	}
	if _, err := m.checkRows("output", out, n); err != nil {
		return err
	}
	if overlaps(out, x) {
		return fmt.Errorf("%s: output overlaps input x, expected separate storage", m.what())
	}
	C, K := m.cfg.Dim, m.cfg.TopK
	x2, out2 := reshape(x, n, C), reshape(out, n, C)
	d := m.Dispatch
	d.Release(m.h) // the received rows are the path's buffer, reused by this step
	m.h, m.recv = nil, nil
	if dp := m.devicePath(); dp != nil {
		return m.forwardDevice(dp, out2, x2, n)
	}
	if fp, ok := d.(FusedOffsets); ok && fp.Fused() {
		return fmt.Errorf("%s: the fused expert path runs only as the MoE device step, which this layer cannot take: it needs the backend's grouped GEMM for its local experts (tensor.UseGroupedFor; cudabackend.WithGroupedGEMM(true)), a bound on the tokens per rank (Parallel.MaxTokens) and fp32 routing", m.what())
	}
	m.Router.DeviceStats = false

	// Route this rank's tokens (local), lay them out, dispatch them.
	tensor.MarkPhase(m.b, "moe.route")
	if err := m.Router.Forward(x2); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, "moe.dispatch")
	l, err := d.Layout(m.Router.Indices(), n, K, m.cfg.CapacityFactor)
	if err != nil {
		return fmt.Errorf("%s: %w", m.what(), err)
	}
	recv, h, work, err := d.Dispatch(x2, l)
	if err != nil {
		return err
	}
	m.h, m.recv = h, recv
	// While the rows move: the aux-loss statistics of the whole group.
	if err := m.globalStats(h); err != nil {
		work.Wait(m.par.Stream) // recv and the handle's buffers stay the transport's until then
		return err
	}
	if err := work.Wait(m.par.Stream); err != nil {
		return fmt.Errorf("%s: dispatch: %w", m.what(), err)
	}
	// Local experts on the received rows, in expert order.
	dt, M := x.DType(), h.RecvRows()
	m.xe = ensure(m.b, m.xe, dt, M, C)
	m.ye = ensure(m.b, m.ye, dt, M, C)
	m.yr = ensure(m.b, m.yr, dt, M, C)
	tensor.MarkPhase(m.b, "moe.experts")
	d.SortByExpert(m.xe, recv, h)
	if err := m.Experts.Forward(m.ye, m.xe, h.ExpertCounts); err != nil {
		return err
	}
	d.UnsortByExpert(m.yr, m.ye, h)
	tensor.MarkPhase(m.b, "moe.combine")
	if err := d.Combine(out2, m.yr, m.Router.Weights(), h); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, tensor.PhaseOther)
	if err := m.b.Err(); err != nil {
		return fmt.Errorf("%s: forward: %w", m.what(), err)
	}
	m.n = n
	return nil
}

// globalStats sums the router's load statistics over the token group (the
// EP group unless Parallel.TokenGroup widened it): the counts come from the
// dispatch's exchange, the probability sums and Σ lse² from an all-reduce.
// It hands them to the router.
func (m *MoE) globalStats(h *Handle) error {
	loc := m.Router.Local()
	E := m.cfg.Experts
	g := layers.LoadStats{Tokens: h.GlobalTokens, Routed: append([]int(nil), h.GlobalRouted...)}
	vals := append(append([]float64(nil), loc.ProbSums...), loc.LSESquares)
	group := m.Dispatch.TokenGroup()
	sdt := tensor.Float32
	if m.Router.W.W.DType() == tensor.Float64 {
		sdt = tensor.Float64
	}
	// All-reduce (sum) of the partial sums, the reduce-from-region's forward.
	if err := hostreduce.AllReduce(m.b, group, sdt, vals, comm.Sum, m.par.Stream); err != nil {
		return fmt.Errorf("%s: all-reduce of the router statistics: %w", m.what(), err)
	}
	g.ProbSums, g.LSESquares = vals[:E], vals[E]
	m.global = g
	return m.Router.SetGlobal(g)
}

// Backward overwrites dx (..., C) with ∂L/∂x for this rank's tokens, adds
// the gradients of this rank's parameters, from dout (..., C), and adds the
// gradient of AuxLoss through this rank's tokens. Collective, like Forward.
func (m *MoE) Backward(dx, dout *tensor.Tensor) error {
	if m.n == 0 {
		return errors.New(m.what() + ": Backward without a successful Forward")
	}
	n, C, K := m.n, m.cfg.Dim, m.cfg.TopK
	if _, err := m.checkRows("output gradient", dout, n); err != nil {
		return err
	}
	if _, err := m.checkRows("input gradient dx", dx, n); err != nil {
		return err
	}
	if overlaps(dx, dout) {
		return fmt.Errorf("%s: input gradient dx overlaps the output gradient, expected separate storage", m.what())
	}
	d, h := m.Dispatch, m.h
	dx2, dout2 := reshape(dx, n, C), reshape(dout, n, C)
	if m.onDevice() {
		return m.backwardDevice(m.dev.path, dx2, dout2)
	}
	dt, M := dout.DType(), h.RecvRows()
	m.dw = ensure(m.b, m.dw, dt, n, K)
	tensor.MarkPhase(m.b, "moe.bwd.combine")
	dy, work, err := d.CombineBackward(m.dw, dout2, m.Router.Weights(), h)
	if err != nil {
		return err
	}
	if err := work.Wait(m.par.Stream); err != nil {
		return fmt.Errorf("%s: combine backward: %w", m.what(), err)
	}
	m.dye = ensure(m.b, m.dye, dt, M, C)
	m.dxe = ensure(m.b, m.dxe, dt, M, C)
	m.dxr = ensure(m.b, m.dxr, dt, M, C)
	tensor.MarkPhase(m.b, "moe.bwd.experts")
	d.SortByExpert(m.dye, dy, h)
	if err := m.Experts.Backward(m.dxe, m.dye); err != nil {
		return err
	}
	d.UnsortByExpert(m.dxr, m.dxe, h)
	tensor.MarkPhase(m.b, "moe.bwd.dispatch")
	if err := d.DispatchBackward(dx2, m.dxr, h); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, "moe.bwd.route")
	if err := m.Router.Backward(dx2, m.dw, true); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, tensor.PhaseOther)
	if err := m.b.Err(); err != nil {
		return fmt.Errorf("%s: backward: %w", m.what(), err)
	}
	return nil
}

// checkRows checks t (..., C) of the parameters' dtype on the device, with
// n rows when n ≥ 0, and returns its rows.
func (m *MoE) checkRows(what string, t *tensor.Tensor, n int) (int, error) {
	if m.Router.W.W == nil {
		return 0, fmt.Errorf("%s: parameters not materialized (call ParamSet.Materialize first)", m.what())
	}
	dt, C := m.Router.W.W.DType(), m.cfg.Dim
	if t == nil || t.Device() != m.b.Device() || t.DType() != dt {
		return 0, fmt.Errorf("%s: %s is %v, expected a %v tensor on %v", m.what(), what, t, dt, m.b.Device())
	}
	s := t.Shape()
	if len(s) < 2 || s[len(s)-1] != C {
		return 0, fmt.Errorf("%s: %s has shape %v, expected (..., %d)", m.what(), what, s, C)
	}
	rows := s[:len(s)-1].Numel()
	switch {
	case n >= 0 && rows != n:
		return 0, fmt.Errorf("%s: %s has shape %v, expected %d rows of %d", m.what(), what, s, n, C)
	case rows == 0:
		return 0, fmt.Errorf("%s: %s has shape %v: no tokens, expected at least 1 row of %d (every rank of the group brings tokens to each step)", m.what(), what, s, C)
	}
	return rows, nil
}

// ensure returns t when it has dtype dt and shape, else a fresh tensor.
func ensure(b tensor.Backend, t *tensor.Tensor, dt tensor.DType, shape ...int) *tensor.Tensor {
	if t != nil && t.DType() == dt && t.Shape().Equal(shape) {
		return t
	}
	if t != nil {
		b.Free(t)
	}
	return b.Zeros(dt, shape...)
}

func reshape(t *tensor.Tensor, shape ...int) *tensor.Tensor {
	r, err := t.Reshape(shape...)
	if err != nil {
		panic("ep: internal error: " + err.Error())
	}
	return r
}

func overlaps(a, b *tensor.Tensor) bool {
	if a.Buffer() != b.Buffer() {
		return false
	}
	return a.Offset() < b.Offset()+b.Numel() && b.Offset() < a.Offset()+a.Numel()
}

var _ layers.Layer = (*MoE)(nil)
