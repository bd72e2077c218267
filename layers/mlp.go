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

	b    tensor.Backend
	n    int            // rows of the last Forward; 0 before a successful one
	gate *tensor.Tensor // (N, Hidden) w_gate(x)
	up   *tensor.Tensor // (N, Hidden) w_up(x)
	h    *tensor.Tensor // (N, Hidden) silu(gate)·up, the input of w_down
	// backward scratch
	dh, dgate, dup *tensor.Tensor // (N, Hidden)
}

// NewMLP registers name+".w_gate", name+".w_up" and name+".w_down".
func NewMLP(b tensor.Backend, ps *ParamSet, name string, cfg MLPConfig) (*MLP, error) {
	if cfg.Dim <= 0 || cfg.Hidden <= 0 {
		return nil, fmt.Errorf("layers: mlp %q: Dim = %d, Hidden = %d, expected positive sizes", name, cfg.Dim, cfg.Hidden)
	}
	m := &MLP{Name: name, Dim: cfg.Dim, Hidden: cfg.Hidden, b: b}
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

func (m *MLP) what() string { return "mlp " + m.Name }

// Forward writes out (..., Dim) from x (..., Dim).
func (m *MLP) Forward(out, x *tensor.Tensor) error {
	m.n = 0
	if err := checkParams(m.what(), m.Params()...); err != nil {
		return err
	}
	dt := m.Gate.W.W.DType()
	n, err := checkRows(m.b, m.what(), "input x", x, dt, m.Dim)
	if err != nil {
		return err
	}
	if err := checkShape(m.b, m.what(), "output", out, dt, x.Shape()...); err != nil {
		return err
	}
	if err := checkApart(m.what(), "output", out, "input x", x); err != nil {
		return err
	}
	m.gate = ensure(m.b, m.gate, dt, n, m.Hidden)
	m.up = ensure(m.b, m.up, dt, n, m.Hidden)
	m.h = ensure(m.b, m.h, dt, n, m.Hidden)
	x2 := reshape(x, n, m.Dim)
	if err := m.Gate.Forward(m.gate, x2); err != nil {
		return err
	}
	if err := m.Up.Forward(m.up, x2); err != nil {
		return err
	}
	m.b.SwiGLU(m.h, m.gate, m.up)
	if err := m.Down.Forward(reshape(out, n, m.Dim), m.h); err != nil {
		return err
	}
	m.n = n
	return sticky(m.b, m.what(), "forward")
}

// Backward overwrites dx (..., Dim) with ∂L/∂x and adds the weight
// gradients, from dout (..., Dim).
func (m *MLP) Backward(dx, dout *tensor.Tensor) error {
	if m.n == 0 {
		return errors.New("layers: " + m.what() + ": Backward without a successful Forward")
	}
	dt, n := m.Gate.W.W.DType(), m.n
	if err := checkRowsN(m.b, m.what(), "output gradient", dout, dt, m.Dim, n); err != nil {
		return err
	}
	if err := checkRowsN(m.b, m.what(), "input gradient dx", dx, dt, m.Dim, n); err != nil {
		return err
	}
	if err := checkApart(m.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	m.dh = ensure(m.b, m.dh, dt, n, m.Hidden)
	m.dgate = ensure(m.b, m.dgate, dt, n, m.Hidden)
	m.dup = ensure(m.b, m.dup, dt, n, m.Hidden)
	if err := m.Down.Backward(m.dh, reshape(dout, n, m.Dim)); err != nil {
		return err
	}
	m.b.SwiGLUBackward(m.dgate, m.dup, m.dh, m.gate, m.up)
	dx2 := reshape(dx, n, m.Dim)
	if err := m.Gate.Backward(dx2, m.dgate); err != nil {
		return err
	}
	if err := m.Up.BackwardAccumulate(dx2, m.dup); err != nil {
		return err
	}
	return sticky(m.b, m.what(), "backward")
}
