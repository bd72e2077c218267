// Command tensorparallel trains a custom model, an MLP regressor, split
// over two tensor-parallel ranks (goroutines of this process) and on one
// rank, from the same seed, and checks that the two runs give the same
// losses and the same weights. It exits with status 1 when they differ.
//
// The model is y = down(gelu(up(x))): up is a column-parallel linear (each
// rank holds half of its output features), down a row-parallel one (each
// rank holds the matching half of its input features; their partial
// products are all-reduced). The training step is the library's: the
// layers' backward, the gradient reduction and the global gradient norm of
// parallel/grads (driven by the layers' shard descriptions), and
// optim.AdamW's clipped update.
package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const (
	in, hidden, out = 6, 16, 3
	rows            = 32 // samples per step
	steps           = 20
	seed            = 42
	dt              = tensor.Float64
	lr, clip        = 0.01, 1.0
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tensorparallel:", err)
		os.Exit(1)
	}
}

// batch returns the inputs and targets of a step, the same on every rank:
// targets from a fixed random "teacher" matrix.
func batch(step int) (x, t *tensor.Tensor) {
	rng := rand.New(rand.NewPCG(seed, uint64(step)))
	teacher := rand.New(rand.NewPCG(seed, 1<<40))
	w := make([]float64, in*out)
	for i := range w {
		w[i] = teacher.NormFloat64()
	}
	xv, tv := make([]float64, rows*in), make([]float64, rows*out)
	for r := range rows {
		for i := range in {
			xv[r*in+i] = rng.NormFloat64()
		}
		for o := range out {
			for i := range in {
				tv[r*out+o] += math.Tanh(xv[r*in+i] * w[i*out+o])
			}
		}
	}
	x, _ = tensor.FromFloat64(xv, rows, in)
	t, _ = tensor.FromFloat64(tv, rows, out)
	return x, t
}

// mseGrad returns the loss ½·mean((y − t)²) and writes its gradient into dy
// (host tensors: the CPU backend's).
func mseGrad(y, t, dy *tensor.Tensor) float64 {
	var loss float64
	n := float64(y.Numel())
	for i, v := range y.F64() {
		d := v - t.F64()[i]
		loss += 0.5 * d * d / n
		dy.F64()[i] = d / n
	}
	return loss
}

// model is the MLP on one rank: layers.Linear on a rank of its own, the
// tensor-parallel linears on a rank of a TP group.
type model struct {
	b        tensor.Backend
	ps       *layers.ParamSet
	up, down layers.Layer
	width    int           // this rank's hidden features
	shards   []shard.Shard // how its parameters relate to the full model's
}

func newModel(b tensor.Backend, group comm.Comm) (*model, error) {
	m := &model{b: b, ps: layers.NewParamSet(seed)}
	if group == nil {
		up, err := layers.NewLinear(b, m.ps, "up", layers.LinearConfig{In: in, Out: hidden, Bias: true, Std: 0.5})
		if err != nil {
			return nil, err
		}
		down, err := layers.NewLinear(b, m.ps, "down", layers.LinearConfig{In: hidden, Out: out, Bias: true, Std: 0.3})
		if err != nil {
			return nil, err
		}
		m.up, m.down, m.width = up, down, hidden
		m.shards = shard.Whole(m.ps.Params())
	} else {
		par := tp.Parallel{Group: group}
		up, err := tp.NewColumnParallelLinear(b, m.ps, par, "up", tp.ColumnConfig{In: in, Out: hidden, Bias: true, Std: 0.5})
		if err != nil {
			return nil, err
		}
		down, err := tp.NewRowParallelLinear(b, m.ps, par, "down", tp.RowConfig{In: hidden, Out: out, Bias: true, Std: 0.3})
		if err != nil {
			return nil, err
		}
		m.up, m.down, m.width = up, down, up.LocalOut
		m.shards = append(up.Shards(), down.Shards()...)
	}
	return m, m.ps.Materialize(b, dt)
}

// train runs the steps and returns the loss of each and the weights.
func (m *model) train(groups grads.Groups) (losses []float64, pieces []shard.Piece, err error) {
	b := m.b
	opt, err := optim.NewAdamW(b, m.ps)
	if err != nil {
		return nil, nil, err
	}
	red, err := grads.NewReducer(b, m.ps, m.shards, groups)
	if err != nil {
		return nil, nil, err
	}
	defer func() { // the reduction's side stream on a GPU
		if cerr := red.Close(); err == nil {
			err = cerr
		}
	}()
	sched := optim.WarmupCosine{Peak: lr, Min: lr / 10, Warmup: 2, Steps: steps}
	h, a := b.Zeros(dt, rows, m.width), b.Zeros(dt, rows, m.width)
	y, dy := b.Zeros(dt, rows, out), b.Zeros(dt, rows, out)
	da, dh, dx := b.Zeros(dt, rows, m.width), b.Zeros(dt, rows, m.width), b.Zeros(dt, rows, in)
	for step := 1; step <= steps; step++ {
		x, t := batch(step)
		m.ps.ZeroGrad()
		if err := m.up.Forward(h, x); err != nil {
			return nil, nil, err
		}
		b.GELU(a, h)
		if err := m.down.Forward(y, a); err != nil {
			return nil, nil, err
		}
		losses = append(losses, mseGrad(y, t, dy))
		if err := m.down.Backward(da, dy); err != nil {
			return nil, nil, err
		}
		b.GELUBackward(dh, da, h)
		if err := m.up.Backward(dx, dh); err != nil {
			return nil, nil, err
		}
		if err := red.Reduce(); err != nil {
			return nil, nil, err
		}
		norm, err := opt.ClipStep(step, sched.LR(step), clip, red)
		if err != nil {
			return nil, nil, err
		}
		if ss, err := norm.Wait(); err != nil || math.IsNaN(ss[0]) {
			return nil, nil, fmt.Errorf("step %d: gradient norm² %v (%v)", step, ss, err)
		}
	}
	for _, s := range m.shards {
		w, err := tensor.Host(dt, s.Param.W.Shape()...)
		if err != nil {
			return nil, nil, err
		}
		b.Download(w, s.Param.W)
		pieces = append(pieces, shard.Piece{Name: s.Param.Name, Slice: s.Slice(), Tensor: w})
	}
	return losses, pieces, b.Err()
}

func run() error {
	// One rank.
	m, err := newModel(cpu.New(), nil)
	if err != nil {
		return err
	}
	want, pieces, err := m.train(grads.Groups{})
	if err != nil {
		return err
	}
	ref, err := shard.Merge(pieces)
	if err != nil {
		return err
	}
	// Two tensor-parallel ranks.
	const P = 2
	losses := make([][]float64, P)
	var mu sync.Mutex
	var all []shard.Piece
	err = local.Run(P, func(c comm.Comm) error {
		m, err := newModel(cpu.New(), c)
		if err != nil {
			return err
		}
		l, p, err := m.train(grads.Groups{TP: c})
		mu.Lock()
		defer mu.Unlock()
		losses[c.Rank()], all = l, append(all, p...)
		return err
	})
	if err != nil {
		return err
	}
	full, err := shard.Merge(all) // the ranks' shards put together
	if err != nil {
		return err
	}
	worst := 0.0
	for r := range P {
		for i, l := range losses[r] {
			worst = max(worst, math.Abs(l-want[i])/want[i])
		}
	}
	for name, w := range ref {
		for i, v := range w.F64() {
			worst = max(worst, math.Abs(full[name].F64()[i]-v)/(math.Abs(v)+1e-12))
		}
	}
	fmt.Printf("loss %.6f → %.6f in %d steps; TP 2 against one rank: largest relative difference %.1e\n", want[0], want[steps-1], steps, worst)
	if !(worst <= 1e-9) || !(want[steps-1] < want[0]) {
		return fmt.Errorf("TP 2 differs from one rank by %.3g (expected ≤ 1e-9), or the loss did not fall (%v → %v)", worst, want[0], want[steps-1])
	}
	return nil
}
