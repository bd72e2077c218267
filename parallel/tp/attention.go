package tp

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// Attention is layers.Attention with the heads split over the TP group:
// rank r computes query heads [r·H/P, (r+1)·H/P) and holds key/value heads
// [r·Hkv/P, (r+1)·Hkv/P) (grouped-query attention, as Megatron splits it:
// P divides both, so each rank's query heads read only its own key/value
// heads). wq, wk and wv are column-parallel (their rows are the heads'
// features, so a rank's rows are whole heads) and share one entry into the
// TP region, where they run as one stacked weight [Wq_r; Wk_r; Wv_r] (one
// GEMM each way; the three stay separate shards); RoPE (RoPEQKV on the
// packed rows) and the attention op (layers.AttentionCore) run on the
// local heads as they are; wo is row-parallel and its partial products
// leave the region (all-reduce, or reduce-scatter under sequence
// parallelism).
type Attention struct {
	Name                         string                // the layer's name, its parameters' prefix
	Dim, Heads, KVHeads, HeadDim int                   // full sizes: width, query heads, key/value heads, Dim/Heads
	LocalHeads                   int                   // Heads/P
	LocalKVHeads                 int                   // KVHeads/P
	Theta                        float64               // base of the rotary embedding
	Wq                           *ColumnParallelLinear // Dim → Dim/P
	Wk, Wv                       *ColumnParallelLinear // Dim → KVHeads·HeadDim/P each
	Wo                           *RowParallelLinear    // Dim/P → Dim

	b    tensor.Backend
	par  Parallel
	e    *entry
	bt   [2]int                // B, T of the last Forward; zeros before a successful one
	core *layers.AttentionCore // on the local heads
}

// NewAttention registers name+".wq", ".wk", ".wv" and ".wo" with this
// rank's shards of the values layers.NewAttention gives them with the same
// seed. P must divide Heads and KVHeads.
func NewAttention(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg layers.AttentionConfig) (*Attention, error) {
	what := "tp: attention " + name
	if err := par.check(what); err != nil {
		return nil, err
	}
	if err := layers.CheckHeads(what, cfg); err != nil {
		return nil, err
	}
	hkv := cfg.KVHeads
	if hkv == 0 {
		hkv = cfg.Heads
	}
	if P := par.Size(); cfg.Heads%P != 0 || hkv%P != 0 {
		return nil, fmt.Errorf("%s: Heads = %d and KVHeads = %d, expected both divisible by the TP size %d (each rank computes whole query heads from its own whole key/value heads)", what, cfg.Heads, hkv, P)
	}
	hd := cfg.Dim / cfg.Heads
	if !(cfg.RopeTheta > 0) {
		return nil, fmt.Errorf("%s: RopeTheta = %v, expected > 0", what, cfg.RopeTheta)
	}
	P := par.Size()
	a := &Attention{Name: name, Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: hkv, HeadDim: hd, LocalHeads: cfg.Heads / P,
		LocalKVHeads: hkv / P, Theta: cfg.RopeTheta, b: b, par: par,
		core: layers.NewAttentionCore(b, cfg.Heads/P, hkv/P, hd, cfg.RopeTheta)}
	a.core.ShareKept(ps) // under activation recompute its kept activations are the model's shared buffers
	col := func(suffix string, out int) (*ColumnParallelLinear, error) {
		return NewColumnParallelLinear(b, ps, par.part(), name+"."+suffix, ColumnConfig{In: cfg.Dim, Out: out, Std: cfg.Std})
	}
	var err error
	if a.Wq, err = col("wq", cfg.Dim); err != nil {
		return nil, err
	}
	if a.Wk, err = col("wk", hkv*hd); err != nil {
		return nil, err
	}
	if a.Wv, err = col("wv", hkv*hd); err != nil {
		return nil, err
	}
	if a.Wo, err = NewRowParallelLinear(b, ps, par, name+".wo", RowConfig{In: cfg.Dim, Out: cfg.Dim, Std: cfg.OutStd}); err != nil {
		return nil, err
	}
	if a.e, err = newEntry(b, par, what, name+".qkv", a.Wq, a.Wk, a.Wv); err != nil {
		return nil, err
	}
	return a, nil
}

// Params returns wq, wk, wv, wo (this rank's shards).
func (a *Attention) Params() []*layers.Param {
	return []*layers.Param{a.Wq.W, a.Wk.W, a.Wv.W, a.Wo.W}
}

// Shards describes the parameters of the layer.
func (a *Attention) Shards() []shard.Shard {
	var s []shard.Shard
	for _, l := range []*ColumnParallelLinear{a.Wq, a.Wk, a.Wv} {
		s = append(s, l.Shards()...)
	}
	return append(s, a.Wo.Shards()...)
}

// Scale is the factor of the scores, 1/sqrt(HeadDim).
func (a *Attention) Scale() float32 { return a.core.Scale() }

func (a *Attention) what() string { return "tp: attention " + a.Name }

// Forward writes out from x, both (B·T, Dim) — or (B·T/P, Dim), this
// rank's tokens of the flattened batch, under sequence parallelism.
// Position t attends to positions [0, t] of its own sequence.
func (a *Attention) Forward(out, x *tensor.Tensor, batch, seq int) error {
	a.bt = [2]int{}
	if err := checkParams(a.what(), a.Params()...); err != nil {
		return err
	}
	if batch <= 0 || seq <= 0 {
		return fmt.Errorf("%s: batch %d, seq %d, expected positive sizes", a.what(), batch, seq)
	}
	dt := a.Wq.W.W.DType()
	B, T, C := batch, seq, a.Dim
	n, err := a.par.seqRows(a.what(), B*T)
	if err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(a.b, a.what(), "input x", x, dt, C, n, fmt.Sprintf("this rank's tokens of batch %d × seq %d", B, T)); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(a.b, a.what(), "output", out, dt, C, n, "like the input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(a.what(), "output", out, "input x", x); err != nil {
		return err
	}
	qkv := a.core.InputsPacked(dt, B, T) // [q | k | v] of the local heads, one GEMM (the entry is stacked)
	if err := a.e.forward(layerkit.Reshape(x, n, C), []*tensor.Tensor{qkv}); err != nil {
		return err
	}
	att := a.core.Forward()
	if err := a.Wo.Forward(layerkit.Reshape(out, n, C), att); err != nil {
		return err
	}
	a.bt = [2]int{B, T}
	return layerkit.Sticky(a.b, a.what(), "forward")
}

// ForwardSeq is Forward, the form of a layers.Mixer (the shared block's
// attention part).
func (a *Attention) ForwardSeq(out, x *tensor.Tensor, batch, seq int) error {
	return a.Forward(out, x, batch, seq)
}

// Backward overwrites dx (shaped like the forward's x) with ∂L/∂x and adds
// the weight gradients, from dout (shaped like out).
func (a *Attention) Backward(dx, dout *tensor.Tensor) error {
	if a.bt[0] == 0 {
		return fmt.Errorf("%s: %w", a.what(), errNoForward)
	}
	dt := a.Wq.W.W.DType()
	C := a.Dim
	n, _ := a.par.seqRows(a.what(), a.bt[0]*a.bt[1])
	if err := layerkit.CheckRowsN(a.b, a.what(), "output gradient", dout, dt, C, n, "like the forward's output"); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(a.b, a.what(), "input gradient dx", dx, dt, C, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(a.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	datt := a.core.OutputGrad()
	if err := a.Wo.Backward(datt, layerkit.Reshape(dout, n, C)); err != nil {
		return err
	}
	return a.e.backward(layerkit.Reshape(dx, n, C), []*tensor.Tensor{a.core.BackwardPacked()})
}
