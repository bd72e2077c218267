package tp

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// Parallel is how a tensor-parallel layer communicates: the TP group it
// spans, the chooser of the strategies of its communication sites, whether sequence parallelism is on, and the
// stream of the backend. It is passed by value to every constructor; nothing
// is read from globals.
type Parallel struct {
	// Group is the TP group (required): P = Group.Size() ranks share each
	// layer's weights.
	Group comm.Comm
	// Overlap chooses the strategy of each communication site of the
	// layers (overlap.Chooser); nil gives every site overlap.Collective.
	Overlap *overlap.Chooser
	// SequenceParallel splits the activations outside the TP regions (the
	// residual stream, the norms) along the token dim: each rank holds N/P
	// of the N = B·T rows, in rank order.
	SequenceParallel bool
	// Stream is the stream the backend queues its ops on (nil on the CPU).
	Stream comm.Stream

	// shared marks the column-parallel linears of a layer whose input
	// enters the region once for all of them (attention's q, k, v; the
	// MLP's gate and up): they get no entry site of their own.
	shared bool
}

// Size is the number of ranks of the TP group.
func (p Parallel) Size() int { return p.Group.Size() }

// Rank is this rank's index in the TP group.
func (p Parallel) Rank() int { return p.Group.Rank() }

var collectiveOnly = overlap.Single(overlap.Collective{})

// chooser returns the chooser of the layers' sites.
func (p Parallel) chooser() *overlap.Chooser {
	if p.Overlap != nil {
		return p.Overlap
	}
	return collectiveOnly
}

// spec is the spec of a site of the layer name on p's group.
func (p Parallel) spec(b tensor.Backend, name string, k int, outs ...int) overlap.Spec {
	return overlap.Spec{Name: name, Group: p.Group, Backend: b, Stream: p.Stream, K: k, Outs: outs}
}

// check validates p for a layer.
func (p Parallel) check(what string) error {
	if p.Group == nil {
		return fmt.Errorf("%s: nil TP group", what)
	}
	if p.Group.Size() < 1 || p.Group.Rank() < 0 || p.Group.Rank() >= p.Group.Size() {
		return fmt.Errorf("%s: TP group %s has rank %d of %d", what, p.Group.Name(), p.Group.Rank(), p.Group.Size())
	}
	return nil
}

// split returns [lo, hi) of this rank's part of n, which must divide by P.
func (p Parallel) split(what, dimName string, n int) (lo, hi int, err error) {
	P := p.Size()
	if n <= 0 || n%P != 0 {
		return 0, 0, fmt.Errorf("%s: %s = %d is not divisible by the TP size %d", what, dimName, n, P)
	}
	w := n / P
	return p.Rank() * w, (p.Rank() + 1) * w, nil
}

// addShard registers the shard [lo, hi) along dim of the full parameter
// name, initialised with exactly the values the unsharded model gives that
// slice (layers.ShardInit).
func addShard(ps *layers.ParamSet, name string, full []int, dim, lo, hi int, decay bool, init layers.InitFunc) (*layers.Param, shard.Shard, error) {
	if init == nil {
		init = layers.Constant(0)
	}
	si, err := layers.ShardInit(init, full, dim, lo, hi)
	if err != nil {
		return nil, shard.Shard{}, fmt.Errorf("tp: parameter %q: %w", name, err)
	}
	shape := tensor.Shape(full).Clone()
	shape[dim] = hi - lo
	p, err := ps.Add(name, shape, decay, si)
	if err != nil {
		return nil, shard.Shard{}, err
	}
	return p, shard.Shard{Param: p, Full: tensor.Shape(full).Clone(), Over: shard.TP, Dim: dim, Lo: lo, Hi: hi}, nil
}

// wait waits for a mapping's Work on the stream s.
func wait(s comm.Stream) func(comm.Work, error) error {
	return func(w comm.Work, err error) error {
		if err != nil {
			return err
		}
		return w.Wait(s)
	}
}

// seqRows returns the rows this rank holds of n tokens: n, or n/P under
// sequence parallelism (n must then divide by P).
func (p Parallel) seqRows(layer string, n int) (int, error) {
	if !p.SequenceParallel {
		return n, nil
	}
	if n%p.Size() != 0 {
		return 0, fmt.Errorf("%s: %d tokens are not divisible by the TP size %d (sequence parallelism splits the tokens evenly)", layer, n, p.Size())
	}
	return n / p.Size(), nil
}

var errNoForward = errors.New("Backward without a successful Forward")

// part is p for the column-parallel parts of a layer with a shared entry.
func (p Parallel) part() Parallel {
	p.shared = true
	return p
}

// checkParams fails when a layer's parameters are not materialized yet.
func checkParams(layer string, ps ...*layers.Param) error {
	for _, p := range ps {
		if p != nil {
			if err := layerkit.CheckMaterialized(layer, p.Name, p.W); err != nil {
				return err
			}
		}
	}
	return nil
}
