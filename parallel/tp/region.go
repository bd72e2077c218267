package tp

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// entry is the way into a TP region for one or more column-parallel
// linears that read the same input x (q, k and v; w_gate and w_up):
//
//	forward:  x (n, In) ──copy (identity) / sequence all-gather──► xFull (N, In) ──► y_i = xFull·W_iᵀ
//	backward: dxFull = Σ_i dy_i·W_i ──all-reduce / reduce-scatter──► dx (n, In)
//
// (n = N, or N/P under sequence parallelism). The all-gather runs fused
// with the first linear's matmul through the strategy (AllGatherMatmul),
// and the gathered input is kept for the others and for the backward. A
// single linear's backward under sequence parallelism goes through the
// strategy too (AllGatherMatmulBackward); several linears sum their input
// gradients first and reduce-scatter once (comm.SequenceGatherBackward).
type entry struct {
	what string
	b    tensor.Backend
	par  Parallel
	lins []*ColumnParallelLinear
	in   int

	n        int            // rows of the last forward's x; 0 before a successful one
	x        *tensor.Tensor // (n, In): the caller's input, viewed 2-D
	xFull    *tensor.Tensor // (N, In): x, or gathered under SP
	gathered *tensor.Tensor // (N, In) owned buffer of the gathered input (SP)
	dFull    *tensor.Tensor // (N, In) backward scratch: Σ_i dy_i·W_i (SP)
}

func newEntry(b tensor.Backend, par Parallel, what string, lins ...*ColumnParallelLinear) *entry {
	return &entry{what: what, b: b, par: par, lins: lins, in: lins[0].In}
}

// forward computes outs[i] (N, LocalOut_i) from x (n, In), both 2-D and
// already checked.
func (e *entry) forward(x *tensor.Tensor, outs []*tensor.Tensor) error {
	e.n = 0
	b, dt := e.b, x.DType()
	n := x.Dim(0)
	start := 0
	if e.par.SequenceParallel {
		N := n * e.par.Size()
		e.gathered = layers.Ensure(b, e.gathered, dt, N, e.in)
		if err := layers.Sticky(b, e.what, "forward"); err != nil {
			return err
		}
		if err := e.par.strategy().AllGatherMatmul(b, e.par.Group, x, e.lins[0].W.W, outs[0], e.gathered); err != nil {
			return fmt.Errorf("%s forward: %w", e.what, err)
		}
		e.xFull, start = e.gathered, 1
	} else {
		e.xFull = x
	}
	for i := start; i < len(e.lins); i++ {
		b.MatMul(outs[i], e.xFull, e.lins[i].W.W, false, true, 1, 0)
	}
	for i, l := range e.lins {
		if l.Bias != nil {
			b.AddBias(outs[i], l.Bias.W)
		}
	}
	e.x, e.n = x, n
	return layers.Sticky(b, e.what, "forward")
}

// backward overwrites dx (n, In) with ∂L/∂x and adds the weight gradients,
// from douts[i] (N, LocalOut_i).
func (e *entry) backward(dx *tensor.Tensor, douts []*tensor.Tensor) error {
	b, g, s := e.b, e.par.Group, e.par.Stream
	for i, l := range e.lins {
		if l.Bias != nil {
			b.SumRows(l.Bias.G, douts[i])
		}
	}
	if e.par.SequenceParallel && len(e.lins) == 1 {
		if err := layers.Sticky(b, e.what, "backward"); err != nil {
			return err
		}
		l := e.lins[0]
		if err := e.par.strategy().AllGatherMatmulBackward(b, g, douts[0], e.x, e.xFull, l.W.W, dx, l.W.G); err != nil {
			return fmt.Errorf("%s backward: %w", e.what, err)
		}
		return layers.Sticky(b, e.what, "backward")
	}
	target := dx
	if e.par.SequenceParallel {
		e.dFull = layers.Ensure(b, e.dFull, dx.DType(), e.xFull.Dim(0), e.in)
		target = e.dFull
	}
	for i, l := range e.lins {
		beta := float32(1)
		if i == 0 {
			beta = 0
		}
		b.MatMul(target, douts[i], l.W.W, false, false, 1, beta) // dxFull (+)= dy·W
		b.MatMul(l.W.G, douts[i], e.xFull, true, false, 1, 1)    // dW += dyᵀ·xFull
	}
	if err := layers.Sticky(b, e.what, "backward"); err != nil {
		return err
	}
	var err error
	if e.par.SequenceParallel {
		err = wait(s)(comm.SequenceGatherBackward(b, g, dx, e.dFull, s))
	} else {
		err = wait(s)(comm.CopyToRegionBackward(g, dx, s))
	}
	if err != nil {
		return fmt.Errorf("%s backward: %w", e.what, err)
	}
	return layers.Sticky(b, e.what, "backward")
}
