package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// MLPConfig describes a SwiGLU MLP.
type MLPConfig struct {
	Dim, Hidden int     // the input and output features, and the hidden ones
	Std         float64 // init std of w_gate and w_up
	OutStd      float64 // init std of w_down (the residual branch's output)
}

// MLP is the SwiGLU feed-forward layer:
// out = w_down(silu(w_gate(x)) · w_up(x)).
type MLP struct {
	Name        string  // the layer's name, its parameters' prefix
	Dim, Hidden int     // the input and output features, and the hidden ones
	Gate, Up    *Linear // Dim → Hidden
	Down        *Linear // Hidden → Dim

	b   tensor.Backend
	n   int // rows of the last Forward; 0 before a successful one
	act *SwiGLUCore

	x        *tensor.Tensor // (n, Dim): the last forward's input (the stacked path)
	wgu, ggu *tensor.Tensor // (2·Hidden, Dim) views of w_gate, w_up and their gradients, or nil
	stacked  bool           // the last forward ran the stacked path
}

// stackedGateUp is Attention.stackedQKV for w_gate and w_up.
func (m *MLP) stackedGateUp() (w, g *tensor.Tensor) {
	if unstacked {
		return nil, nil
	}
	if m.wgu == nil || m.wgu.Buffer() != m.Gate.W.W.Buffer() {
		var err error
		if m.wgu, m.ggu, err = Stacked(m.Gate.W, m.Up.W); err != nil {
			m.wgu, m.ggu = nil, nil
		}
	}
	return m.wgu, m.ggu
}

// SwiGLUCore is the activation of a SwiGLU MLP, h = silu(gate)·up, and its
// backward, between the input projections w_gate, w_up and the output
// projection w_down. MLP runs it on all the hidden features, tp.MLP on the
// features of its rank, Experts on the rows of all its experts. It owns its
// buffers: the caller writes the projections into Inputs before Forward,
// and ∂L/∂h into OutputGrad before Backward.
type SwiGLUCore struct {
	b              tensor.Backend
	gate, up, h    *tensor.Tensor // (N, Hidden) w_gate(x), w_up(x), silu(gate)·up
	dh, dgate, dup *tensor.Tensor // (N, Hidden) backward scratch

	// The packed form (InputsPacked): one GEMM's [gate | up] rows in gu,
	// their gradient in dgu.
	packed  bool
	gu, dgu *tensor.Tensor // (N, 2·Hidden)

	ws   *workspace // shared backward buffers (NewMLP); nil: the core's own
	kept *workspace // where gate, up (or gu) and h go under RecomputeBlock (NewMLP, ShareKept); nil: the core's own
}

// ShareKept makes the core keep its activations in ps's shared buffers
// under RecomputeBlock (Decoder.SetRecompute), as the cores of NewMLP do:
// the block's forward run again recomputes them. For the cores of other
// packages' layers (parallel/tp), which keep their backward buffers their
// own.
func (s *SwiGLUCore) ShareKept(ps *ParamSet) { s.kept = ps.workspace(s.b) }

// NewSwiGLUCore returns an activation that allocates on b.
func NewSwiGLUCore(b tensor.Backend) *SwiGLUCore { return &SwiGLUCore{b: b} }

// Inputs returns the (n, hidden) buffers the projections gate and up go
// into, before Forward.
func (s *SwiGLUCore) Inputs(dt tensor.DType, n, hidden int) (gate, up *tensor.Tensor) {
	s.gate = s.kept.keep(wsKeepGate, RecomputeBlock, s.b, s.gate, dt, n, hidden)
	s.up = s.kept.keep(wsKeepUp, RecomputeBlock, s.b, s.up, dt, n, hidden)
	s.h = s.kept.keep(wsKeepH, RecomputeBlock, s.b, s.h, dt, n, hidden)
	s.packed = false
	return s.gate, s.up
}

// InputsPacked returns the (n, 2·hidden) buffer the packed projections
// [gate | up] of each row go into (one GEMM x·[W_gate;W_up]ᵀ), before
// Forward; then use BackwardPacked.
func (s *SwiGLUCore) InputsPacked(dt tensor.DType, n, hidden int) (gu *tensor.Tensor) {
	s.gu = s.kept.keep(wsKeepGU, RecomputeBlock, s.b, s.gu, dt, n, 2*hidden)
	s.h = s.kept.keep(wsKeepH, RecomputeBlock, s.b, s.h, dt, n, hidden)
	s.packed = true
	return s.gu
}

// Forward returns h = silu(gate)·up (shaped like gate), the input of w_down.
func (s *SwiGLUCore) Forward() (h *tensor.Tensor) {
	switch {
	case s.h.Numel() == 0:
	case s.packed:
		s.b.SwiGLUPacked(s.h, s.gu)
	default:
		s.b.SwiGLU(s.h, s.gate, s.up)
	}
	return s.h
}

// OutputGrad returns the buffer ∂L/∂h goes into (shaped like h), before
// Backward.
func (s *SwiGLUCore) OutputGrad() (dh *tensor.Tensor) {
	dt, shape := s.h.DType(), s.h.Shape()
	s.dh = s.ws.ensure(wsMLPDH, s.b, s.dh, dt, shape...)
	if s.packed {
		s.dgu = s.ws.ensure(wsMLPDGU, s.b, s.dgu, dt, s.gu.Shape()...)
		return s.dh
	}
	s.dgate = s.ws.ensure(wsMLPDGate, s.b, s.dgate, dt, shape...)
	s.dup = s.ws.ensure(wsMLPDUp, s.b, s.dup, dt, shape...)
	return s.dh
}

// BackwardPacked returns ∂L/∂gu (n, 2·hidden), the packed [dgate | dup]
// rows, from the ∂L/∂h in OutputGrad, after InputsPacked.
func (s *SwiGLUCore) BackwardPacked() (dgu *tensor.Tensor) {
	if s.h.Numel() > 0 {
		s.b.SwiGLUPackedBackward(s.dgu, s.dh, s.gu)
	}
	return s.dgu
}

// Backward returns ∂L/∂gate and ∂L/∂up from the ∂L/∂h in OutputGrad.
func (s *SwiGLUCore) Backward() (dgate, dup *tensor.Tensor) {
	if s.h.Numel() > 0 {
		s.b.SwiGLUBackward(s.dgate, s.dup, s.dh, s.gate, s.up)
	}
	return s.dgate, s.dup
}

// NewMLP registers name+".w_gate", name+".w_up" and name+".w_down".
func NewMLP(b tensor.Backend, ps *ParamSet, name string, cfg MLPConfig) (*MLP, error) {
	if cfg.Dim <= 0 || cfg.Hidden <= 0 {
		return nil, fmt.Errorf("layers: mlp %q: Dim = %d, Hidden = %d, expected positive sizes", name, cfg.Dim, cfg.Hidden)
	}
	if err := checkStds(fmt.Sprintf("layers: mlp %q: MLPConfig", name), cfg.Std, cfg.OutStd); err != nil {
		return nil, err
	}
	m := &MLP{Name: name, Dim: cfg.Dim, Hidden: cfg.Hidden, b: b, act: NewSwiGLUCore(b)}
	m.act.ws = ps.workspace(b)
	m.act.kept = m.act.ws
	var err error
	if m.Gate, err = NewLinear(b, ps, name+".w_gate", LinearConfig{In: cfg.Dim, Out: cfg.Hidden, Std: cfg.Std}); err != nil {
		return nil, err
	}
	if m.Up, err = NewLinear(b, ps, name+".w_up", LinearConfig{In: cfg.Dim, Out: cfg.Hidden, Std: cfg.Std}); err != nil {
		return nil, err
	}
	if m.Down, err = NewLinear(b, ps, name+".w_down", LinearConfig{In: cfg.Hidden, Out: cfg.Dim, Std: cfg.OutStd}); err != nil {
		return nil, err
	}
	return m, nil
}

// Params returns w_gate, w_up, w_down.
func (m *MLP) Params() []*Param {
	return []*Param{m.Gate.W, m.Up.W, m.Down.W}
}

func (m *MLP) what() string { return "layers: mlp " + m.Name }

// Forward writes out (..., Dim) from x (..., Dim).
func (m *MLP) Forward(out, x *tensor.Tensor) error {
	m.n = 0
	if err := checkParams(m.what(), m.Params()...); err != nil {
		return err
	}
	dt := m.Gate.W.W.DType()
	n, err := layerkit.CheckRows(m.b, m.what(), "input x", x, dt, m.Dim)
	if err != nil {
		return err
	}
	if err := layerkit.CheckShape(m.b, m.what(), "output", out, dt, x.Shape()...); err != nil {
		return err
	}
	if err := layerkit.CheckApart(m.what(), "output", out, "input x", x); err != nil {
		return err
	}
	x2 := layerkit.Reshape(x, n, m.Dim)
	m.stacked = false
	if w, _ := m.stackedGateUp(); w != nil {
		gu := m.act.InputsPacked(dt, n, m.Hidden)
		m.b.MatMul(gu, x2, w, false, true, 1, 0) // one GEMM for gate and up
		if err := m.Down.Forward(layerkit.Reshape(out, n, m.Dim), m.act.Forward()); err != nil {
			return err
		}
		m.x, m.stacked, m.n = x2, true, n
		return layerkit.Sticky(m.b, m.what(), "forward")
	}
	gate, up := m.act.Inputs(dt, n, m.Hidden)
	if err := m.Gate.Forward(gate, x2); err != nil {
		return err
	}
	if err := m.Up.Forward(up, x2); err != nil {
		return err
	}
	h := m.act.Forward()
	if err := m.Down.Forward(layerkit.Reshape(out, n, m.Dim), h); err != nil {
		return err
	}
	m.n = n
	return layerkit.Sticky(m.b, m.what(), "forward")
}

// Backward overwrites dx (..., Dim) with ∂L/∂x and adds the weight
// gradients, from dout (..., Dim).
func (m *MLP) Backward(dx, dout *tensor.Tensor) error {
	if m.n == 0 {
		return errors.New(m.what() + ": Backward without a successful Forward")
	}
	dt, n := m.Gate.W.W.DType(), m.n
	if err := layerkit.CheckRowsN(m.b, m.what(), "output gradient", dout, dt, m.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(m.b, m.what(), "input gradient dx", dx, dt, m.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(m.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	dh := m.act.OutputGrad()
	if err := m.Down.Backward(dh, layerkit.Reshape(dout, n, m.Dim)); err != nil {
		return err
	}
	dx2 := layerkit.Reshape(dx, n, m.Dim)
	if m.stacked {
		dgu := m.act.BackwardPacked()
		m.b.MatMul(dx2, dgu, m.wgu, false, false, 1, 0) // dx = dgu·[W_gate;W_up]
		m.b.MatMul(m.ggu, dgu, m.x, true, false, 1, 1)  // d[W_gate;W_up] += dguᵀ·x
		return layerkit.Sticky(m.b, m.what(), "backward")
	}
	dgate, dup := m.act.Backward()
	if err := m.Gate.Backward(dx2, dgate); err != nil {
		return err
	}
	if err := m.Up.BackwardAccumulate(dx2, dup); err != nil {
		return err
	}
	return layerkit.Sticky(m.b, m.what(), "backward")
}
