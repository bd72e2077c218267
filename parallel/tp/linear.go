package tp

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// ColumnConfig describes a column-parallel linear layer: y = x·Wᵀ (+ bias)
// with W (Out, In) split by rows (output features) over the TP group.
type ColumnConfig struct {
	In, Out int  // the full (unsharded) sizes; P must divide Out
	Bias    bool // a bias split like the outputs (initialised to 0, no weight decay)
	// Std is the standard deviation of the full weight's initial values,
	// drawn from N(0, Std²) as layers.Linear draws them: finite and > 0.
	Std float64
	// Init, when set, initialises the full weight instead (Std must then
	// be 0): layers.Constant(0) for zero weights.
	Init layers.InitFunc
	// GatherOutput all-gathers the output along the last dim, so every rank
	// gets y (N, Out) instead of its own columns (N, Out/P).
	GatherOutput bool
}

// ColumnParallelLinear is layers.Linear with the weight's rows split over
// the TP group: rank r holds rows [r·Out/P, (r+1)·Out/P) and computes those
// output features. Its input enters the TP region: copied (forward identity,
// backward all-reduce), or, under sequence parallelism, all-gathered along
// the tokens through the strategy (forward AllGatherMatmul, backward
// AllGatherMatmulBackward: a reduce-scatter).
type ColumnParallelLinear struct {
	Name         string        // the layer's name, its parameters' prefix
	In, Out      int           // full sizes
	LocalOut     int           // Out/P
	Lo           int           // first output feature of this rank
	W            *layers.Param // (Out/P, In): rows [Lo, Lo+Out/P) of the full weight, weight decay
	Bias         *layers.Param // (Out/P) or nil
	GatherOutput bool          // the output is all-gathered: (N, Out) on every rank

	b      tensor.Backend
	par    Parallel
	shards []shard.Shard
	e      *entry
	yl     *tensor.Tensor // (N, Out/P) local output when GatherOutput (owned)
	dyl    *tensor.Tensor // (N, Out/P) local output gradient when GatherOutput (owned)
}

// NewColumnParallelLinear registers name+".weight" (and name+".bias") in ps
// with this rank's shard of the values layers.NewLinear gives the full
// parameters with the same seed.
func NewColumnParallelLinear(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg ColumnConfig) (*ColumnParallelLinear, error) {
	w, ws, err := addLinearWeight(b, ps, par, "tp: column-parallel linear "+name, "ColumnConfig", name, cfg.In, cfg.Out, 0, cfg.Std, cfg.Init)
	if err != nil {
		return nil, err
	}
	shards := []shard.Shard{ws}
	var bias *layers.Param
	if cfg.Bias {
		var bs shard.Shard
		if bias, bs, err = addShard(ps, name+".bias", []int{cfg.Out}, 0, ws.Lo, ws.Hi, false, layers.Constant(0)); err != nil {
			return nil, err
		}
		shards = append(shards, bs)
	}
	l, err := NewColumnParallelLinearFromParams(b, par, name, w, bias, cfg.Out, cfg.GatherOutput)
	if err != nil {
		return nil, err
	}
	l.shards = shards
	return l, nil
}

// NewColumnParallelLinearFromParams makes a column-parallel linear over
// existing shards: w (out/P, In), the rows of this rank, and an optional
// bias (out/P). It is how a vocab-parallel LM head shares the
// vocab-parallel token embedding (the same rows on the same rank). Its
// Shards are empty: the parameters belong to their owner.
func NewColumnParallelLinearFromParams(b tensor.Backend, par Parallel, name string, w, bias *layers.Param, out int, gatherOutput bool) (*ColumnParallelLinear, error) {
	what := "tp: column-parallel linear " + name
	if b == nil || w == nil {
		return nil, fmt.Errorf("%s: nil backend or weight", what)
	}
	if err := par.check(what); err != nil {
		return nil, err
	}
	lo, hi, err := par.split(what, "Out", out)
	if err != nil {
		return nil, err
	}
	s := w.Shape()
	if len(s) != 2 || s[0] != hi-lo {
		return nil, fmt.Errorf("%s: weight %q has shape %v, expected (%d, In) = (Out %d / TP %d, In)", what, w.Name, s, hi-lo, out, par.Size())
	}
	if bias != nil && !bias.Shape().Equal(tensor.Shape{hi - lo}) {
		return nil, fmt.Errorf("%s: bias %q has shape %v, expected (%d)", what, bias.Name, bias.Shape(), hi-lo)
	}
	l := &ColumnParallelLinear{Name: name, In: s[1], Out: out, LocalOut: hi - lo, Lo: lo, W: w, Bias: bias,
		GatherOutput: gatherOutput, b: b, par: par}
	if !par.shared {
		if l.e, err = newEntry(b, par, what, name, l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Params returns the weight, then the bias if any.
func (l *ColumnParallelLinear) Params() []*layers.Param {
	if l.Bias != nil {
		return []*layers.Param{l.W, l.Bias}
	}
	return []*layers.Param{l.W}
}

// Shards describes the parameters this layer registered.
func (l *ColumnParallelLinear) Shards() []shard.Shard { return l.shards }

func (l *ColumnParallelLinear) what() string { return "tp: column-parallel linear " + l.Name }

// outWidth is the width of y: Out when gathered, else Out/P.
func (l *ColumnParallelLinear) outWidth() int {
	if l.GatherOutput {
		return l.Out
	}
	return l.LocalOut
}

// Forward computes y (N, Out/P) — or (N, Out) with GatherOutput — from x
// (N, In), or x (N/P, In), this rank's tokens, under sequence parallelism.
// Leading dims of x and y are flattened into rows.
func (l *ColumnParallelLinear) Forward(y, x *tensor.Tensor) error {
	if l.e == nil {
		return fmt.Errorf("%s: a part of a layer with a shared entry (attention, MLP): call the layer", l.what())
	}
	l.e.n = 0
	if err := checkParams(l.what(), l.Params()...); err != nil {
		return err
	}
	dt := l.W.W.DType()
	n, err := layerkit.CheckRows(l.b, l.what(), "input x", x, dt, l.In)
	if err != nil {
		return err
	}
	N := n
	if l.par.SequenceParallel {
		N = n * l.par.Size()
	}
	if err := layerkit.CheckRowsN(l.b, l.what(), "output y", y, dt, l.outWidth(), N, "the tokens of the region"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(l.what(), "output y", y, "input x", x); err != nil {
		return err
	}
	y2 := layerkit.Reshape(y, N, l.outWidth())
	yl := y2
	if l.GatherOutput {
		l.yl = layerkit.Ensure(l.b, l.yl, dt, N, l.LocalOut)
		yl = l.yl
	}
	if err := l.e.forward(layerkit.Reshape(x, n, l.In), []*tensor.Tensor{yl}); err != nil {
		return err
	}
	if l.GatherOutput {
		s := l.par.Stream
		if err := wait(s)(overlap.GatherFromRegionForward(l.b, l.par.Group, y2, yl, s)); err != nil {
			l.e.n = 0
			return fmt.Errorf("%s forward: %w", l.what(), err)
		}
	}
	return layerkit.Sticky(l.b, l.what(), "forward")
}

// Backward overwrites dx (shaped like the forward's x) with ∂L/∂x and adds
// the parameters' gradients, from dy (shaped like y).
func (l *ColumnParallelLinear) Backward(dx, dy *tensor.Tensor) error {
	if l.e == nil || l.e.n == 0 {
		return fmt.Errorf("%s: %w", l.what(), errNoForward)
	}
	dt, n, N := l.W.W.DType(), l.e.n, l.e.xFull.Dim(0)
	if err := layerkit.CheckRowsN(l.b, l.what(), "output gradient dy", dy, dt, l.outWidth(), N, "like the forward's output"); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(l.b, l.what(), "input gradient dx", dx, dt, l.In, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(l.what(), "input gradient dx", dx, "output gradient dy", dy); err != nil {
		return err
	}
	dyl := layerkit.Reshape(dy, N, l.outWidth())
	if l.GatherOutput {
		l.dyl = layerkit.Ensure(l.b, l.dyl, dt, N, l.LocalOut)
		s := l.par.Stream
		if err := wait(s)(overlap.GatherFromRegionBackward(l.b, l.par.Group, l.dyl, dyl, s)); err != nil {
			return fmt.Errorf("%s backward: %w", l.what(), err)
		}
		dyl = l.dyl
	}
	return l.e.backward(layerkit.Reshape(dx, n, l.In), []*tensor.Tensor{dyl})
}

// RowConfig describes a row-parallel linear layer: y = x·Wᵀ (+ bias) with
// W (Out, In) split by columns (input features) over the TP group.
type RowConfig struct {
	In, Out int  // the full (unsharded) sizes; P must divide In
	Bias    bool // a bias replicated on every rank, added after the reduction (0, no decay)
	// Std is the standard deviation of the full weight's initial values,
	// drawn from N(0, Std²) as layers.Linear draws them: finite and > 0.
	Std float64
	// Init, when set, initialises the full weight instead (Std must then
	// be 0): layers.Constant(0) for zero weights.
	Init layers.InitFunc
}

// RowParallelLinear is layers.Linear with the weight's columns split over
// the TP group: rank r holds columns [r·In/P, (r+1)·In/P) and gets the
// matching slice of the input's last dim (the output of a column-parallel
// layer). Each rank's product is a partial sum that leaves the TP region:
// all-reduced (forward all-reduce, backward identity), or, under sequence
// parallelism, reduce-scattered along the tokens through the strategy
// (forward MatmulReduceScatter, backward its all-gather).
type RowParallelLinear struct {
	Name    string        // the layer's name, its parameters' prefix
	In, Out int           // full sizes
	LocalIn int           // In/P
	Lo      int           // first input feature of this rank
	W       *layers.Param // (Out, In/P): columns [Lo, Lo+In/P) of the full weight, weight decay
	Bias    *layers.Param // (Out), replicated, or nil

	b      tensor.Backend
	par    Parallel
	shards []shard.Shard
	mmrs   overlap.MatmulReduceScatter // SP: the exit site
	mmar   overlap.MatmulAllReduce     // without SP: the exit site
	n      int                         // tokens N of the last Forward; 0 before a successful one
	x      *tensor.Tensor              // (N, In/P): the input of the last Forward (the caller's)
	closed bool                        // Close has released the site
}

// NewRowParallelLinear registers name+".weight" (and name+".bias") in ps
// with this rank's shard of the values layers.NewLinear gives the full
// parameters with the same seed.
func NewRowParallelLinear(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, cfg RowConfig) (*RowParallelLinear, error) {
	w, ws, err := addLinearWeight(b, ps, par, "tp: row-parallel linear "+name, "RowConfig", name, cfg.In, cfg.Out, 1, cfg.Std, cfg.Init)
	if err != nil {
		return nil, err
	}
	l := &RowParallelLinear{Name: name, In: cfg.In, Out: cfg.Out, LocalIn: ws.Hi - ws.Lo, Lo: ws.Lo, W: w, b: b, par: par,
		shards: []shard.Shard{ws}}
	sp := par.spec(b, name, l.LocalIn, cfg.Out)
	if par.SequenceParallel {
		l.mmrs, err = par.chooser().MatmulReduceScatter(sp)
	} else {
		l.mmar, err = par.chooser().MatmulAllReduce(sp)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.what(), err)
	}
	if cfg.Bias {
		if l.Bias, err = ps.Add(name+".bias", []int{cfg.Out}, false, layers.Constant(0)); err != nil {
			return nil, err
		}
		l.shards = append(l.shards, shard.Replicated(l.Bias, par.SequenceParallel))
	}
	return l, nil
}

// Params returns the weight, then the bias if any.
func (l *RowParallelLinear) Params() []*layers.Param {
	if l.Bias != nil {
		return []*layers.Param{l.W, l.Bias}
	}
	return []*layers.Param{l.W}
}

// Shards describes the parameters of the layer.
func (l *RowParallelLinear) Shards() []shard.Shard { return l.shards }

func (l *RowParallelLinear) what() string { return "tp: row-parallel linear " + l.Name }

// Forward computes y (N, Out) — or (N/P, Out), this rank's tokens, under
// sequence parallelism — from x (N, In/P). Leading dims are flattened.
func (l *RowParallelLinear) Forward(y, x *tensor.Tensor) error {
	l.n = 0
	if l.closed {
		return fmt.Errorf("%s: %w", l.what(), errClosed)
	}
	if err := checkParams(l.what(), l.Params()...); err != nil {
		return err
	}
	dt := l.W.W.DType()
	N, err := layerkit.CheckRows(l.b, l.what(), "input x", x, dt, l.LocalIn)
	if err != nil {
		return err
	}
	n, err := l.par.seqRows(l.what(), N)
	if err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(l.b, l.what(), "output y", y, dt, l.Out, n, "this rank's tokens"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(l.what(), "output y", y, "input x", x); err != nil {
		return err
	}
	x2, y2 := layerkit.Reshape(x, N, l.LocalIn), layerkit.Reshape(y, n, l.Out)
	if err := layerkit.Sticky(l.b, l.what(), "forward"); err != nil {
		return err
	}
	if l.par.SequenceParallel {
		if err := l.mmrs.Forward(y2, x2, l.W.W); err != nil {
			return fmt.Errorf("%s forward: %w", l.what(), err)
		}
	} else if err := wait(l.par.Stream)(l.mmar.Run(y2, []*tensor.Tensor{x2}, []*tensor.Tensor{l.W.W}, true)); err != nil {
		return fmt.Errorf("%s forward: %w", l.what(), err)
	}
	if l.Bias != nil {
		l.b.AddBias(y2, l.Bias.W)
	}
	l.x, l.n = x2, N
	return layerkit.Sticky(l.b, l.what(), "forward")
}

// Backward overwrites dx (N, In/P) with ∂L/∂x and adds the parameters'
// gradients, from dy (shaped like y).
func (l *RowParallelLinear) Backward(dx, dy *tensor.Tensor) error {
	if l.n == 0 {
		return fmt.Errorf("%s: %w", l.what(), errNoForward)
	}
	dt, N := l.W.W.DType(), l.n
	n, _ := l.par.seqRows(l.what(), N)
	if err := layerkit.CheckRowsN(l.b, l.what(), "output gradient dy", dy, dt, l.Out, n, "like the forward's output"); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(l.b, l.what(), "input gradient dx", dx, dt, l.LocalIn, N, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(l.what(), "input gradient dx", dx, "output gradient dy", dy); err != nil {
		return err
	}
	dx2, dy2 := layerkit.Reshape(dx, N, l.LocalIn), layerkit.Reshape(dy, n, l.Out)
	if l.Bias != nil {
		l.b.SumRows(l.Bias.G, dy2) // partial under SP: this rank's tokens
	}
	if err := layerkit.Sticky(l.b, l.what(), "backward"); err != nil {
		return err
	}
	if l.par.SequenceParallel {
		if err := wait(l.par.Stream)(l.mmrs.Backward(dx2, l.W.G, dy2, l.x, l.W.W)); err != nil {
			return fmt.Errorf("%s backward: %w", l.what(), err)
		}
		return layerkit.Sticky(l.b, l.what(), "backward")
	}
	// the all-reduce's adjoint is the identity: the local matmuls alone
	l.b.MatMul(dx2, dy2, l.W.W, false, false, 1, 0) // dx = dy·W
	l.b.MatMul(l.W.G, dy2, l.x, true, false, 1, 1)  // dW += dyᵀ·x
	return layerkit.Sticky(l.b, l.what(), "backward")
}

// addLinearWeight checks the arguments of a parallel linear layer of In =
// in, Out = out features and registers this rank's shard of its weight
// (Out, In) in ps, split along dim: 0, the output features (column
// parallel), or 1, the input features (row parallel), initialised from std
// or init (layers.WeightInit; config names the config type in errors).
func addLinearWeight(b tensor.Backend, ps *layers.ParamSet, par Parallel, what, config, name string, in, out, dim int, std float64, init layers.InitFunc) (*layers.Param, shard.Shard, error) {
	if b == nil || ps == nil {
		return nil, shard.Shard{}, fmt.Errorf("%s: nil backend or parameter set", what)
	}
	if err := par.check(what); err != nil {
		return nil, shard.Shard{}, err
	}
	if in <= 0 || out <= 0 {
		return nil, shard.Shard{}, fmt.Errorf("%s: In = %d, Out = %d, expected positive sizes", what, in, out)
	}
	dimName, n := "Out", out
	if dim == 1 {
		dimName, n = "In", in
	}
	lo, hi, err := par.split(what, dimName, n)
	if err != nil {
		return nil, shard.Shard{}, err
	}
	wi, err := layers.WeightInit(what+": "+config+".", std, init)
	if err != nil {
		return nil, shard.Shard{}, err
	}
	return addShard(ps, name+".weight", []int{out, in}, dim, lo, hi, true, wi)
}
