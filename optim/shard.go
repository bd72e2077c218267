package optim

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// Range is a run [Lo, Hi) of a parameter set's flat buffers.
type Range struct {
	Lo int // the run's first element
	Hi int // one past its last
}

// Sharding is the part of a parameter set's flat buffers one rank of a
// data-parallel group updates with a distributed optimizer (ZeRO stage 1,
// Megatron-LM's distributed optimizer): the gradient reduction leaves the
// reduced gradients of Ranges in Grads (a reduce-scatter), the rank
// updates the weights of Ranges alone, holding the fp32 master weights and
// the moments of Ranges only, and Gather brings every rank's updated
// weights to every rank (an all-gather). grads.Reducer makes one
// (Config.Shard).
type Sharding struct {
	// Ranges are the runs this rank updates, in increasing order, not
	// overlapping (empty runs allowed).
	Ranges []Range
	// Grads holds the reduced gradients of Ranges one after the other
	// (Σ Hi − Lo elements), in the main gradients' dtype.
	Grads *tensor.Tensor
	// Gather is called after each update, and after SyncParams: it makes
	// every rank's parameters whole again from the ranks' updated runs.
	// It may start the work and return (the caller's model waits for it
	// before it reads the parameters).
	Gather func() error
}

// NewShardedAdamW is NewAdamWWithConfig for a rank of a distributed
// optimizer: its moments (and fp32 master weights, for bf16 parameters)
// cover sh.Ranges only, packed (Σ Hi − Lo elements each), and an update
// changes the parameters of sh.Ranges from sh.Grads, then calls
// sh.Gather. The state of a rank is that of the whole optimizer on its
// ranges, and its update of an element the same as the whole optimizer's,
// so the ranks together update as one AdamW. The per-parameter views
// (Moments, MasterView) cover whole parameters and are refused: a rank
// holds runs of them (StatePieces).
func NewShardedAdamW(b tensor.Backend, ps *layers.ParamSet, cfg AdamWConfig, sh Sharding) (*AdamW, error) {
	if b == nil || ps == nil {
		return nil, errors.New("optim: NewShardedAdamW needs a backend and a parameter set")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w, _ := ps.Flat()
	g := ps.MainGrads()
	if w == nil || g == nil {
		return nil, errors.New("optim: NewShardedAdamW: the parameter set is not materialized (ParamSet.Materialize)")
	}
	n := w.Numel()
	if err := checkLayout(ps, w); err != nil {
		return nil, err
	}
	k, at := 0, 0
	for _, r := range sh.Ranges {
		if r.Lo < at || r.Hi < r.Lo || r.Hi > n {
			return nil, fmt.Errorf("optim: NewShardedAdamW: ranges %v, expected increasing runs of the %d parameters that do not overlap", sh.Ranges, n)
		}
		at, k = r.Hi, k+r.Hi-r.Lo
	}
	if sh.Grads == nil || sh.Grads.Numel() != k || sh.Grads.DType() != g.DType() {
		return nil, fmt.Errorf("optim: NewShardedAdamW: gradients %v for ranges of %d elements, expected %d of the main gradients' %v", sh.Grads, k, k, g.DType())
	}
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("optim: NewShardedAdamW: the backend already holds an error: %w", err)
	}
	o := &AdamW{b: b, ps: ps, cfg: cfg, w: w, g: sh.Grads, sharded: &sh}
	mdt, parts := tensor.Float32, 2
	switch w.DType() {
	case tensor.Float64:
		mdt = tensor.Float64
	case tensor.Float32:
	case tensor.BFloat16:
		parts = 3 // and the fp32 master weights
	default:
		return nil, fmt.Errorf("optim: NewShardedAdamW: parameters of dtype %v, expected a float dtype", w.DType())
	}
	// m, v (and the master weights) in one block: a rank's parts are a
	// fraction of the model, and three blocks of it would each round up to
	// the allocator's size class (up to a quarter each below 64 MiB).
	kk := max(k, 1)
	state := b.Zeros(mdt, parts*kk)
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("optim: allocating the AdamW state of %d of %d parameters: %w", k, n, err)
	}
	var err error
	if o.m, err = state.View(0, kk); err == nil {
		if o.v, err = state.View(kk, kk); err == nil && parts == 3 {
			o.master, err = state.View(2*kk, kk)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("optim: NewShardedAdamW: %w", err)
	}
	dn := ps.DecayNumel()
	off := 0
	for _, r := range sh.Ranges {
		// A run is cut where the decayed parameters end.
		for _, s := range []segment{{lo: r.Lo, hi: min(r.Hi, dn), decay: true}, {lo: max(r.Lo, dn), hi: r.Hi}} {
			if s.hi <= s.lo {
				continue
			}
			at := off + s.lo - r.Lo
			var err error
			if s.w, err = w.View(s.lo, s.hi-s.lo); err == nil {
				if s.g, err = sh.Grads.View(at, s.hi-s.lo); err == nil {
					if s.m, err = o.m.View(at, s.hi-s.lo); err == nil {
						s.v, err = o.v.View(at, s.hi-s.lo)
					}
				}
			}
			if err == nil && o.master != nil {
				if s.master, err = o.master.View(at, s.hi-s.lo); err == nil {
					b.Copy(s.master, s.w)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("optim: AdamW run [%d, %d): %w", s.lo, s.hi, err)
			}
			o.segs = append(o.segs, s)
		}
		off += r.Hi - r.Lo
	}
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("optim: NewShardedAdamW: %w", err)
	}
	return o, nil
}

// Sharded reports whether the optimizer is one rank of a distributed
// optimizer (NewShardedAdamW), and its sharding.
func (o *AdamW) Sharded() (Sharding, bool) {
	if o.sharded == nil {
		return Sharding{}, false
	}
	return *o.sharded, true
}

// StatePiece is a part of one parameter's optimizer state that this rank
// holds: the flat run [Lo, Hi) of the parameter's elements (0 and Numel:
// all of it) and views of the weights the update is computed on (the fp32
// master copy when there is one, else the parameter), of m and of v,
// shaped like the parameter when the piece is all of it, else flat.
type StatePiece struct {
	Param *layers.Param  // the parameter
	Lo    int            // the run's first element of the parameter (row-major)
	Hi    int            // one past its last
	W     *tensor.Tensor // the weights the update is computed on: the master copy, or the parameter
	M     *tensor.Tensor // the first moment
	V     *tensor.Tensor // the second moment
}

// Whole reports whether the piece is all of its parameter.
func (p StatePiece) Whole() bool { return p.Lo == 0 && p.Hi == p.Param.Numel() }

// StatePieces lists the optimizer state this rank holds, by parameter
// (in the order of Params().Params()) and, within one, by run: for a
// whole optimizer every parameter whole, for a rank of a distributed one
// the runs of its ranges (what its checkpoints save and load).
func (o *AdamW) StatePieces() ([]StatePiece, error) {
	var out []StatePiece
	for _, p := range o.ps.Params() {
		lo, hi := p.Offset(), p.Offset()+p.Numel()
		if o.sharded == nil {
			sp := StatePiece{Param: p, Lo: 0, Hi: p.Numel(), W: p.W}
			var err error
			if o.master != nil {
				if sp.W, err = o.master.View(lo, p.W.Shape()...); err != nil {
					return nil, fmt.Errorf("optim: master view of %q: %w", p.Name, err)
				}
			}
			if sp.M, err = o.m.View(lo, p.W.Shape()...); err == nil {
				sp.V, err = o.v.View(lo, p.W.Shape()...)
			}
			if err != nil {
				return nil, fmt.Errorf("optim: moment view of %q: %w", p.Name, err)
			}
			out = append(out, sp)
			continue
		}
		off := 0
		for _, r := range o.sharded.Ranges {
			a, z := max(r.Lo, lo), min(r.Hi, hi)
			if a < z {
				at := off + a - r.Lo
				sp := StatePiece{Param: p, Lo: a - lo, Hi: z - lo}
				var err error
				src, sat := o.w, a
				if o.master != nil {
					src, sat = o.master, at
				}
				shape := []int{z - a}
				if sp.Whole() { // all of the parameter: shaped like it
					shape = p.W.Shape()
				}
				if sp.W, err = src.View(sat, shape...); err == nil {
					if sp.M, err = o.m.View(at, shape...); err == nil {
						sp.V, err = o.v.View(at, shape...)
					}
				}
				if err != nil {
					return nil, fmt.Errorf("optim: state of %q [%d, %d): %w", p.Name, sp.Lo, sp.Hi, err)
				}
				out = append(out, sp)
			}
			off += r.Hi - r.Lo
		}
	}
	return out, nil
}

// StateBytes is the size of the optimizer's state on its backend: the
// moments and the fp32 master weights (for a rank of a distributed
// optimizer, of its ranges).
func (o *AdamW) StateBytes() int64 {
	n := int64(o.m.Numel()+o.v.Numel()) * int64(o.m.DType().Size())
	if o.master != nil {
		n += int64(o.master.Numel()) * int64(o.master.DType().Size())
	}
	return n
}
