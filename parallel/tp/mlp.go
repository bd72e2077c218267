package tp

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// MLP is layers.MLP (SwiGLU) with the hidden features split over the TP
// group: w_gate and w_up are column-parallel and share one entry into the
// TP region (one stacked weight [W_gate_r; W_up_r], one GEMM each way), the
// activation (layers.SwiGLUCore, SwiGLUPacked on the packed rows) runs on
// the local features, w_down is row-parallel and its partial products leave the region
// (all-reduce, or reduce-scatter under sequence parallelism). P must divide
// Hidden.
type MLP struct {
	Name        string                // the layer's name, its parameters' prefix
	Dim, Hidden int                   // full sizes: input and output features, hidden features
	LocalHidden int                   // Hidden/P
	Gate, Up    *ColumnParallelLinear // Dim → Hidden/P
	Down        *RowParallelLinear    // Hidden/P → Dim

	b   tensor.Backend
	par Parallel
	e   *entry
	n   int                // rows of the last Forward's x; 0 before a successful one
	act *layers.SwiGLUCore // on the local features
}

// NewMLP registers name+".w_gate", ".w_up" and ".w_down" with this rank's
// shards of the values layers.NewMLP gives them with the same seed.
func NewMLP(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg layers.MLPConfig) (*MLP, error) {
	what := "tp: mlp " + name
	if err := par.check(what); err != nil {
		return nil, err
	}
	if cfg.Dim <= 0 || cfg.Hidden <= 0 {
		return nil, fmt.Errorf("%s: Dim = %d, Hidden = %d, expected positive sizes", what, cfg.Dim, cfg.Hidden)
	}
	if cfg.Hidden%par.Size() != 0 {
		return nil, fmt.Errorf("%s: Hidden = %d is not divisible by the TP size %d", what, cfg.Hidden, par.Size())
	}
	m := &MLP{Name: name, Dim: cfg.Dim, Hidden: cfg.Hidden, LocalHidden: cfg.Hidden / par.Size(), b: b, par: par,
		act: layers.NewSwiGLUCore(b)}
	m.act.ShareKept(ps) // under activation recompute its kept activations are the model's shared buffers
	var err error
	if m.Gate, err = NewColumnParallelLinear(b, ps, par.part(), name+".w_gate", ColumnConfig{In: cfg.Dim, Out: cfg.Hidden, Std: cfg.Std}); err != nil {
		return nil, err
	}
	if m.Up, err = NewColumnParallelLinear(b, ps, par.part(), name+".w_up", ColumnConfig{In: cfg.Dim, Out: cfg.Hidden, Std: cfg.Std}); err != nil {
		return nil, err
	}
	if m.Down, err = NewRowParallelLinear(b, ps, par, name+".w_down", RowConfig{In: cfg.Hidden, Out: cfg.Dim, Std: cfg.OutStd}); err != nil {
		return nil, err
	}
	if m.e, err = newEntry(b, par, what, name+".gate_up", m.Gate, m.Up); err != nil {
		return nil, err
	}
	return m, nil
}

// Params returns w_gate, w_up, w_down (this rank's shards).
func (m *MLP) Params() []*layers.Param {
	return []*layers.Param{m.Gate.W, m.Up.W, m.Down.W}
}

// Shards describes the parameters of the layer.
func (m *MLP) Shards() []shard.Shard {
	var s []shard.Shard
	for _, part := range [][]shard.Shard{m.Gate.Shards(), m.Up.Shards(), m.Down.Shards()} {
		s = append(s, part...)
	}
	return s
}

func (m *MLP) what() string { return "tp: mlp " + m.Name }

// Forward writes out from x, both (N, Dim) — or (N/P, Dim), this rank's
// tokens, under sequence parallelism. Leading dims are flattened.
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
	if err := layerkit.CheckRowsN(m.b, m.what(), "output", out, dt, m.Dim, n, "like the input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(m.what(), "output", out, "input x", x); err != nil {
		return err
	}
	N := n
	if m.par.SequenceParallel {
		N = n * m.par.Size()
	}
	gu := m.act.InputsPacked(dt, N, m.LocalHidden) // [gate | up] of the local features, one GEMM (the entry is stacked)
	if err := m.e.forward(layerkit.Reshape(x, n, m.Dim), []*tensor.Tensor{gu}); err != nil {
		return err
	}
	h := m.act.Forward()
	if err := m.Down.Forward(layerkit.Reshape(out, n, m.Dim), h); err != nil {
		return err
	}
	m.n = n
	return layerkit.Sticky(m.b, m.what(), "forward")
}

// Backward overwrites dx (shaped like the forward's x) with ∂L/∂x and adds
// the weight gradients, from dout (shaped like out).
func (m *MLP) Backward(dx, dout *tensor.Tensor) error {
	if m.n == 0 {
		return fmt.Errorf("%s: %w", m.what(), errNoForward)
	}
	dt, n := m.Gate.W.W.DType(), m.n
	if err := layerkit.CheckRowsN(m.b, m.what(), "output gradient", dout, dt, m.Dim, n, "like the forward's output"); err != nil {
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
	return m.e.backward(layerkit.Reshape(dx, n, m.Dim), []*tensor.Tensor{m.act.BackwardPacked()})
}
