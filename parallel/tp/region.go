package tp

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// entry is the way into a TP region for one or more column-parallel
// linears that read the same input x (q, k and v; w_gate and w_up):
//
//	forward:  x (n, In) ──copy (identity) / sequence all-gather──► xFull (N, In) ──► y_i = xFull·W_iᵀ
//	backward: dxFull = Σ_i dy_i·W_i ──all-reduce / reduce-scatter──► dx (n, In)
//
// (n = N, or N/P under sequence parallelism). It is one communication site
// of the overlap layer: under sequence parallelism an all-gather∘matmul
// site (the gather streamed into the matmuls of every linear), else a
// matmul∘all-reduce site for the backward, whose all-reduce of dx runs
// while the weight gradients compute.
type entry struct {
	what string
	b    tensor.Backend
	par  Parallel
	lins []*ColumnParallelLinear
	in   int

	agmm   overlap.AllGatherMatmul // SP
	mmar   overlap.MatmulAllReduce // without SP
	closed bool                    // close has released the site

	n        int            // rows of the last forward's x; 0 before a successful one
	x        *tensor.Tensor // (n, In): the caller's input, viewed 2-D
	xFull    *tensor.Tensor // (N, In): x, or gathered under SP
	gathered *tensor.Tensor // (N, In) owned buffer of the gathered input (SP)

	// stacked: the linears' weights (and gradients) lie one after another
	// in the flat buffers (they are registered so), and the entry runs them
	// as one weight [W_0; W_1; ...] (ΣLocalOut_i, In): one GEMM each way
	// and one output (N, ΣLocalOut_i), the packed rows that RoPEQKV and
	// SwiGLUPacked read. Its site is built for that one weight.
	stacked bool
	w, g    *tensor.Tensor // the stacked views (found at the first forward)
}

// newEntry builds the entry of the layer name (its site's name).
//
// Several linears (q, k, v; gate, up) are stacked: they must have no bias.
func newEntry(b tensor.Backend, par Parallel, what, name string, lins ...*ColumnParallelLinear) (*entry, error) {
	e := &entry{what: what, b: b, par: par, lins: lins, in: lins[0].In, stacked: len(lins) > 1}
	outs := make([]int, len(lins))
	for i, l := range lins {
		outs[i] = l.LocalOut
		if e.stacked && l.Bias != nil {
			return nil, fmt.Errorf("%s: %s has a bias: the stacked projections of a shared entry take none", what, l.Name)
		}
	}
	if e.stacked {
		total := 0
		for _, o := range outs {
			total += o
		}
		outs = []int{total}
	}
	sp := par.spec(b, name, e.in, outs...)
	var err error
	if par.SequenceParallel {
		e.agmm, err = par.chooser().AllGatherMatmul(sp)
	} else {
		e.mmar, err = par.chooser().MatmulAllReduce(sp)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return e, nil
}

func (e *entry) weights() []*tensor.Tensor {
	if e.stacked {
		return []*tensor.Tensor{e.w}
	}
	ws := make([]*tensor.Tensor, len(e.lins))
	for i, l := range e.lins {
		ws[i] = l.W.W
	}
	return ws
}

func (e *entry) grads() []*tensor.Tensor {
	if e.stacked {
		return []*tensor.Tensor{e.g}
	}
	gs := make([]*tensor.Tensor, len(e.lins))
	for i, l := range e.lins {
		gs[i] = l.W.G
	}
	return gs
}

// stack finds the stacked views of the linears' weights and gradients.
func (e *entry) stack() error {
	if !e.stacked || e.w != nil && e.w.Buffer() == e.lins[0].W.W.Buffer() {
		return nil
	}
	ps := make([]*layers.Param, len(e.lins))
	for i, l := range e.lins {
		ps[i] = l.W
	}
	var err error
	if e.w, e.g, err = layers.Stacked(ps...); err != nil {
		e.w, e.g = nil, nil
		return fmt.Errorf("%s: %w", e.what, err)
	}
	return nil
}

// forward computes outs[i] (N, LocalOut_i) from x (n, In), both 2-D and
// already checked; a stacked entry takes one output (N, ΣLocalOut_i), the
// linears' outputs side by side in each row.
func (e *entry) forward(x *tensor.Tensor, outs []*tensor.Tensor) error {
	e.n = 0
	if e.closed {
		return fmt.Errorf("%s: %w", e.what, errClosed)
	}
	b, dt := e.b, x.DType()
	n := x.Dim(0)
	if err := e.stack(); err != nil {
		return err
	}
	if want := len(e.weights()); len(outs) != want {
		return fmt.Errorf("%s: internal error: %d outputs for %d weights", e.what, len(outs), want)
	}
	if e.par.SequenceParallel {
		N := n * e.par.Size()
		e.gathered = layerkit.Ensure(b, e.gathered, dt, N, e.in)
		if err := layerkit.Sticky(b, e.what, "forward"); err != nil {
			return err
		}
		if err := e.agmm.Forward(outs, e.gathered, x, e.weights()); err != nil {
			return fmt.Errorf("%s forward: %w", e.what, err)
		}
		e.xFull = e.gathered
	} else {
		e.xFull = x
		for i, w := range e.weights() {
			b.MatMul(outs[i], x, w, false, true, 1, 0)
		}
	}
	if !e.stacked {
		for i, l := range e.lins {
			if l.Bias != nil {
				b.AddBias(outs[i], l.Bias.W)
			}
		}
	}
	e.x, e.n = x, n
	return layerkit.Sticky(b, e.what, "forward")
}

// backward overwrites dx (n, In) with ∂L/∂x and adds the weight gradients,
// from douts[i] (N, LocalOut_i) (one packed (N, ΣLocalOut_i) when stacked).
func (e *entry) backward(dx *tensor.Tensor, douts []*tensor.Tensor) error {
	b := e.b
	if e.closed {
		return fmt.Errorf("%s: %w", e.what, errClosed)
	}
	if len(douts) != len(e.weights()) {
		return fmt.Errorf("%s: internal error: %d output gradients for %d weights", e.what, len(douts), len(e.weights()))
	}
	if !e.stacked {
		for i, l := range e.lins {
			if l.Bias != nil {
				b.SumRows(l.Bias.G, douts[i])
			}
		}
	}
	if err := layerkit.Sticky(b, e.what, "backward"); err != nil {
		return err
	}
	var work comm.Work
	var err error
	if e.par.SequenceParallel {
		work, err = e.agmm.Backward(dx, e.grads(), douts, e.xFull, e.weights())
	} else {
		// dx = all-reduce(Σ_i dy_i·W_i), the weight gradients while it moves
		if work, err = e.mmar.Run(dx, douts, e.weights(), false); err == nil {
			for i, g := range e.grads() {
				b.MatMul(g, douts[i], e.xFull, true, false, 1, 1) // dW += dyᵀ·x
			}
		}
	}
	if err == nil {
		err = work.Wait(e.par.Stream)
	}
	if err != nil {
		return fmt.Errorf("%s backward: %w", e.what, err)
	}
	return layerkit.Sticky(b, e.what, "backward")
}
