package ep

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// The device step of the MoE layer: when its expert path has
// DeviceOffsets, the backend the grouped GEMM, and the layer a bound on
// the tokens per rank (Parallel.MaxTokens), Forward and Backward read nothing
// back to the host. The router keeps its choices and statistics on the
// device; one device all-reduce over the token group sums the statistics
// together with a token mask (P, maxTokens) — 0 for each rank's tokens,
// −1e30 past them — whose softmax is 1/T at every token, so the
// auxiliary losses' gradients (which need the group's routed counts and
// 1/T) are made on the device. Their values (AuxLoss, Stats) come from a
// read of the summed statistics queued with tensor.ReadAsync and waited
// for only when asked (by then, in a training loop, long done): they are
// the values of the host-count step. StatsAsync hands a step's read to its
// caller (layers.Decoder.LossAsync and RouterStatsAsync), who waits for it
// after the next step is queued; the next Forward then leaves it alone.

// deviceStep holds the device step's buffers and its pending read.
type deviceStep struct {
	path    DeviceOffsets
	buf     *tensor.Tensor // (2E+1 + P·Mt) f32: the statistics, then the token mask
	mask    *tensor.Tensor // (P·Mt) this rank's part of the mask
	maskN   int            // the tokens mask was made for
	inv     *tensor.Tensor // (1, P·Mt) the mask's softmax
	ye, dxe *tensor.Tensor // (Bound, C) expert-major
	cur     *statsRead     // the last Forward's statistics
}

// statsRead is one step's read of the summed statistics and what they
// give once read.
type statsRead struct {
	what    string
	read    tensor.HostRead
	cf      float64
	E, K    int
	taken   bool // handed out by StatsAsync: its caller waits for it
	done    bool
	stats   layers.LoadStats
	dropped int
	err     error
}

// resolve waits for the read (once) and makes the statistics of it.
func (r *statsRead) resolve() error {
	if r.done {
		return r.err
	}
	r.done = true
	vals, err := r.read.Wait()
	r.read = nil
	if err != nil {
		r.err = fmt.Errorf("%s: reading the router statistics: %w", r.what, err)
		return r.err
	}
	E, K := r.E, r.K
	g := layers.LoadStats{Routed: make([]int, E), ProbSums: append([]float64(nil), vals[E:2*E]...), LSESquares: vals[2*E]}
	slots := 0
	for e := range E {
		g.Routed[e] = int(math.Round(vals[e]))
		slots += g.Routed[e]
	}
	g.Tokens = slots / K
	if c := layerkit.Capacity(r.cf, g.Tokens, K, E); c > 0 {
		for _, n := range g.Routed {
			r.dropped += max(0, n-c)
		}
	}
	r.stats = g
	return nil
}

// DeviceStep reports whether Forward and Backward run the device step:
// the expert path has DeviceOffsets, the experts take the backend's
// grouped GEMM (tensor.UseGroupedFor), the layer has a bound
// (Parallel.MaxTokens) and routes in fp32. Otherwise the step reads the
// routing and the exchanged counts back to the host.
func (m *MoE) DeviceStep() bool { return m.devicePath() != nil }

// devicePath returns the layer's device-step capability, or nil when the
// step runs on host counts.
func (m *MoE) devicePath() DeviceOffsets {
	dp, ok := m.Dispatch.(DeviceOffsets)
	if !ok || !m.Experts.Grouped() || m.par.MaxTokens <= 0 || layerkit.RouterDType(m.Router.W.W.DType()) != tensor.Float32 {
		return nil
	}
	return dp
}

func (m *MoE) forwardDevice(dp DeviceOffsets, out2, x2 *tensor.Tensor, n int) error {
	if m.dev == nil {
		m.dev = &deviceStep{}
	}
	s := m.dev
	s.finish()
	s.path = dp
	m.Router.DeviceStats = true
	tensor.MarkPhase(m.b, "moe.route")
	if err := m.Router.Forward(x2); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, "moe.dispatch")
	var (
		xe    *tensor.Tensor
		h     *Handle
		hooks *layers.GroupedHooks
		err   error
	)
	if fp, ok := dp.(FusedOffsets); ok {
		xe, h, hooks, err = fp.DispatchFused(x2, m.Router.IndicesDevice(), m.cfg.CapacityFactor)
	} else {
		xe, h, err = dp.DispatchDevice(x2, m.Router.IndicesDevice(), m.cfg.CapacityFactor)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", m.what(), err)
	}
	m.h = h
	tensor.MarkPhase(m.b, "moe.stats")
	if err := m.deviceStats(n); err != nil {
		return err
	}
	dt, C := x2.DType(), m.cfg.Dim
	s.ye = ensure(m.b, s.ye, dt, h.Bound, C)
	if err := m.Experts.ForwardOffsetsHooked(s.ye, xe, h.Offsets, hooks); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, "moe.combine")
	if err := dp.CombineDevice(out2, s.ye, m.Router.Weights(), h); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, tensor.PhaseOther)
	if err := m.b.Err(); err != nil {
		return fmt.Errorf("%s: forward: %w", m.what(), err)
	}
	m.n = n
	return nil
}

// deviceStats sums the router's statistics and the token mask over the
// token group on the device, hands them to the router, and queues their
// read.
func (m *MoE) deviceStats(n int) error {
	s, E := m.dev, m.cfg.Experts
	group := m.Dispatch.TokenGroup()
	P, me, Mt := group.Size(), group.Rank(), m.par.MaxTokens
	if n > Mt {
		return fmt.Errorf("%s: %d tokens, expected at most %d (Parallel.MaxTokens)", m.what(), n, Mt)
	}
	S := 2*E + 1
	f32 := tensor.Float32
	s.buf = ensure(m.b, s.buf, f32, S+P*Mt)
	s.inv = ensure(m.b, s.inv, f32, 1, P*Mt)
	if s.mask == nil || s.maskN != n || s.mask.Numel() != P*Mt {
		vals := make([]float64, P*Mt)
		for i := Mt * me; i < Mt*(me+1); i++ {
			if i-Mt*me >= n {
				vals[i] = -1e30
			}
		}
		h, err := tensor.FromFloat64(vals, P*Mt)
		if err != nil {
			return err
		}
		s.mask = ensure(m.b, s.mask, f32, P*Mt)
		m.b.Upload(s.mask, h)
		s.maskN = n
	}
	stats, maskPart := view(s.buf, 0, S), view(s.buf, S, P*Mt)
	m.b.Copy(stats, m.Router.LocalDevice())
	m.b.Copy(maskPart, s.mask)
	w, err := group.AllReduce(s.buf, comm.Sum, m.par.Stream)
	if err == nil {
		err = w.Wait(m.par.Stream)
	}
	if err != nil {
		return fmt.Errorf("%s: all-reduce of the router statistics: %w", m.what(), err)
	}
	m.b.Softmax(s.inv, reshape(maskPart, 1, P*Mt))
	if err := m.Router.SetGlobalDevice(stats, view(s.inv, 0, 1, 1)); err != nil {
		return err
	}
	s.cur = &statsRead{what: m.what(), read: tensor.ReadAsync(m.b, stats), cf: m.cfg.CapacityFactor, E: E, K: m.cfg.TopK}
	return nil
}

func view(t *tensor.Tensor, off int, shape ...int) *tensor.Tensor {
	v, err := t.View(off, shape...)
	if err != nil {
		panic("ep: internal error: " + err.Error())
	}
	return v
}

// finish drops the last step's read: one nobody asked for is waited for
// (a copy long done, whose pinned buffer goes back), one handed out by
// StatsAsync is its caller's.
func (s *deviceStep) finish() {
	if s.cur != nil && !s.cur.taken {
		s.cur.resolve()
	}
	s.cur = nil
}

// resolve waits for the step's statistics and sets the router's losses.
func (m *MoE) resolve() error {
	r := m.dev.cur
	if err := r.resolve(); err != nil {
		return err
	}
	m.global = r.stats
	m.Router.SetLosses(r.stats)
	return nil
}

// StatsAsync implements layers.StatsReader: the returned function gives
// what Stats returns now (its AuxLoss field is AuxLoss's value). On the
// device step the statistics' read is waited for by the function, not
// now, and the next Forward leaves that read to it; otherwise the values
// are the host's, taken now. The function may be called more than once.
func (m *MoE) StatsAsync() func() (layers.MoEStats, error) {
	if m.n == 0 || !m.onDevice() {
		st := m.Stats()
		return func() (layers.MoEStats, error) { return st, nil }
	}
	r, name, router := m.dev.cur, m.Name, m.Router
	r.taken = true
	return func() (layers.MoEStats, error) {
		if err := r.resolve(); err != nil {
			return layers.MoEStats{Name: name, AuxLoss: math.NaN()}, err
		}
		return layers.NewMoEStatsOf(name, router, r.stats, r.dropped), nil
	}
}

func (m *MoE) backwardDevice(dp DeviceOffsets, dx2, dout2 *tensor.Tensor) error {
	s, h := m.dev, m.h
	dt, n, C, K := dout2.DType(), m.n, m.cfg.Dim, m.cfg.TopK
	m.dw = ensure(m.b, m.dw, dt, n, K)
	var (
		dye   *tensor.Tensor
		hooks *layers.GroupedBackwardHooks
		err   error
	)
	tensor.MarkPhase(m.b, "moe.bwd.combine")
	if fp, ok := dp.(FusedOffsets); ok {
		dye, hooks, err = fp.CombineBackwardFused(m.dw, dout2, m.Router.Weights(), h)
	} else {
		dye, err = dp.CombineBackwardDevice(m.dw, dout2, m.Router.Weights(), h)
	}
	if err != nil {
		return err
	}
	s.dxe = ensure(m.b, s.dxe, dt, h.Bound, C)
	if err := m.Experts.BackwardHooked(s.dxe, dye, hooks); err != nil {
		return err
	}
	tensor.MarkPhase(m.b, "moe.bwd.dispatch")
	if err := dp.DispatchBackwardDevice(dx2, s.dxe, h); err != nil {
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
