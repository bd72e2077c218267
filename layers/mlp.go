package layers

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// MLPConfig describes a SwiGLU MLP.
type MLPConfig struct {
	Dim, Hidden int
	Std         float64 // init std of w_gate and w_up
	OutStd      float64 // init std of w_down (the residual branch's output)
}

// MLP is the SwiGLU feed-forward layer:
// out = w_down(silu(w_gate(x)) · w_up(x)).
type MLP struct {
	Name        string
	Dim, Hidden int
	Gate, Up    *Linear // Dim → Hidden
	Down        *Linear // Hidden → Dim

	b   tensor.Backend
	n   int // rows of the last Forward; 0 before a successful one
	act *SwiGLUCore
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
}

// NewSwiGLUCore returns an activation that allocates on b.
func NewSwiGLUCore(b tensor.Backend) *SwiGLUCore { return &SwiGLUCore{b: b} }

// Inputs returns the (n, hidden) buffers the projections gate and up go
// into, before Forward.
func (s *SwiGLUCore) Inputs(dt tensor.DType, n, hidden int) (gate, up *tensor.Tensor) {
	s.gate = Ensure(s.b, s.gate, dt, n, hidden)
	s.up = Ensure(s.b, s.up, dt, n, hidden)
	s.h = Ensure(s.b, s.h, dt, n, hidden)
	return s.gate, s.up
}

// Forward returns h = silu(gate)·up (shaped like gate), the input of w_down.
func (s *SwiGLUCore) Forward() (h *tensor.Tensor) {
	if s.h.Numel() > 0 {
		s.b.SwiGLU(s.h, s.gate, s.up)
	}
	return s.h
}

// OutputGrad returns the buffer ∂L/∂h goes into (shaped like h), before
// Backward.
func (s *SwiGLUCore) OutputGrad() (dh *tensor.Tensor) {
	dt, shape := s.h.DType(), s.h.Shape()
	s.dh = Ensure(s.b, s.dh, dt, shape...)
	s.dgate = Ensure(s.b, s.dgate, dt, shape...)
	s.dup = Ensure(s.b, s.dup, dt, shape...)
	return s.dh
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
	m := &MLP{Name: name, Dim: cfg.Dim, Hidden: cfg.Hidden, b: b, act: NewSwiGLUCore(b)}
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
	if err := CheckParams(m.what(), m.Params()...); err != nil {
		return err
	}
	dt := m.Gate.W.W.DType()
	n, err := CheckRows(m.b, m.what(), "input x", x, dt, m.Dim)
	if err != nil {
		return err
	}
	if err := CheckShape(m.b, m.what(), "output", out, dt, x.Shape()...); err != nil {
		return err
	}
	if err := CheckApart(m.what(), "output", out, "input x", x); err != nil {
		return err
	}
	gate, up := m.act.Inputs(dt, n, m.Hidden)
	x2 := Reshape(x, n, m.Dim)
	if err := m.Gate.Forward(gate, x2); err != nil {
		return err
	}
	if err := m.Up.Forward(up, x2); err != nil {
		return err
	}
	h := m.act.Forward()
	if err := m.Down.Forward(Reshape(out, n, m.Dim), h); err != nil {
		return err
	}
	m.n = n
	return Sticky(m.b, m.what(), "forward")
}

// Backward overwrites dx (..., Dim) with ∂L/∂x and adds the weight
// gradients, from dout (..., Dim).
func (m *MLP) Backward(dx, dout *tensor.Tensor) error {
	if m.n == 0 {
		return errors.New(m.what() + ": Backward without a successful Forward")
	}
	dt, n := m.Gate.W.W.DType(), m.n
	if err := CheckRowsN(m.b, m.what(), "output gradient", dout, dt, m.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	if err := CheckRowsN(m.b, m.what(), "input gradient dx", dx, dt, m.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	if err := CheckApart(m.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	dh := m.act.OutputGrad()
	if err := m.Down.Backward(dh, Reshape(dout, n, m.Dim)); err != nil {
		return err
	}
	dgate, dup := m.act.Backward()
	dx2 := Reshape(dx, n, m.Dim)
	if err := m.Gate.Backward(dx2, dgate); err != nil {
		return err
	}
	if err := m.Up.BackwardAccumulate(dx2, dup); err != nil {
		return err
	}
	return Sticky(m.b, m.what(), "backward")
}
