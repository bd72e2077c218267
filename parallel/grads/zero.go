package grads

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/lane"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
)

// A distributed optimizer (Config.Shard; ZeRO stage 1, as Megatron-LM's)
// shards each bucket over the ranks of its group: a bucket [Lo, Hi) of L
// elements over D ranks is cut into D parts of R = ⌈L/D⌉ (the last ones
// shorter, or empty, when D does not divide L), and rank i of the group
// owns part i. Instead of an all-reduce, a bucket's sum is a
// reduce-scatter that leaves each rank the sum of its part (a bucket D
// does not divide goes through a buffer padded with zeros); the parts a
// rank owns are packed, in flat order, into its sharded gradients, which
// its optimizer reads (optim.NewShardedAdamW: master weights and moments
// of the owned parts only). After the update, GatherParams all-gathers
// each bucket's updated parameters from their owners, on a lane of their
// own beside the buckets' sums' (a second side stream on a GPU, a
// goroutine on the CPU), and WaitParams waits for them (parallel/model
// waits before the next forward). The partial gradients' sums over TP and
// the gradient norm run on the owned parts: the norm adds the parts' Σ g²
// over the bucket's group as well.

// zeroBucket is a bucket's part of the distributed optimizer.
type zeroBucket struct {
	own      span           // the part this rank owns (empty: lo == hi)
	k        int            // where its gradients start in the sharded gradients
	r        int            // a part's length, ⌈L/D⌉
	ragged   bool           // D does not divide the bucket: padded buffers
	src, dst *tensor.Tensor // the reduce-scatter's padded source and staged destination
	staged   bool           // the sum landed in dst, to copy into the sharded gradients
	gsrc     *tensor.Tensor // the all-gather's source: this rank's part of the parameters
	gbuf     *tensor.Tensor // the all-gather's padded destination (a ragged bucket)
	gwork    comm.Work      // the bucket's all-gather in flight
}

// zeroState is the Reducer's distributed optimizer.
type zeroState struct {
	buckets []zeroBucket
	sg      *tensor.Tensor // the sharded gradients, Σ of the owned parts (at least 1 element)
	k       int            // the owned elements
	lane    *lane.Lane     // the all-gathers of the parameters
	gather  []int          // the buckets whose all-gather is in flight
}

// shardAlign is the bucket alignment of a distributed optimizer: a
// multiple of the sizes of the groups the buckets are summed over, so
// that only the last bucket of a run needs padding.
func shardAlign(g Groups) int {
	a := 1
	for _, c := range []comm.Comm{g.DP, g.EDP} {
		if d := size(c); d > 1 {
			a = lcm(a, d)
		}
	}
	return a
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// planShard finds the part of each bucket this rank owns and allocates
// the sharded gradients.
func (r *Reducer) planShard() error {
	z := &zeroState{buckets: make([]zeroBucket, len(r.buckets))}
	for i, b := range r.buckets {
		d, me := 1, 0
		if b.Group != nil {
			d, me = b.Group.Size(), b.Group.Rank()
		}
		n := b.Hi - b.Lo
		part := (n + d - 1) / d
		lo := min(b.Lo+me*part, b.Hi)
		z.buckets[i] = zeroBucket{own: span{lo, min(lo+part, b.Hi)}, k: z.k, r: part, ragged: n%d != 0}
		z.k += z.buckets[i].own.hi - lo
	}
	z.sg = r.b.Zeros(r.g.DType(), max(z.k, 1))
	if err := r.sticky("allocating the sharded gradients"); err != nil {
		return err
	}
	r.zero = z
	return nil
}

// Sharding is what the optimizer of a rank of a distributed optimizer
// needs (optim.NewShardedAdamW): the runs this rank owns, their reduced
// gradients, packed, and GatherParams. ok is false without Config.Shard.
func (r *Reducer) Sharding() (sh optim.Sharding, ok bool) {
	z := r.zero
	if z == nil {
		return optim.Sharding{}, false
	}
	for _, zb := range z.buckets {
		if zb.own.hi > zb.own.lo {
			sh.Ranges = append(sh.Ranges, optim.Range{Lo: zb.own.lo, Hi: zb.own.hi})
		}
	}
	if z.k > 0 {
		sh.Grads, _ = z.sg.View(0, z.k)
	}
	sh.Gather = r.GatherParams
	return sh, true
}

// ownedViews are the parts of spans this rank owns, as views of the
// sharded gradients.
func (r *Reducer) ownedViews(spans []span) ([]*tensor.Tensor, error) {
	var out []*tensor.Tensor
	for _, zb := range r.zero.buckets {
		for _, s := range spans {
			lo, hi := max(s.lo, zb.own.lo), min(s.hi, zb.own.hi)
			if lo >= hi {
				continue
			}
			v, err := r.zero.sg.View(zb.k+lo-zb.own.lo, hi-lo)
			if err != nil {
				return nil, fmt.Errorf("grads: sharded gradients of [%d, %d): %w", lo, hi, err)
			}
			out = append(out, v)
		}
	}
	return out, nil
}

// takeWhole puts the gradients of bucket i, summed over no group, into
// the sharded gradients (the rank owns all of it).
func (r *Reducer) takeWhole(i int) error {
	b, zb := r.buckets[i], r.zero.buckets[i]
	if zb.own.hi == zb.own.lo {
		return nil
	}
	src, err := r.g.View(b.Lo, b.Hi-b.Lo)
	if err != nil {
		return fmt.Errorf("grads: bucket [%d, %d): %w", b.Lo, b.Hi, err)
	}
	dst, err := r.zero.sg.View(zb.k, zb.own.hi-zb.own.lo)
	if err != nil {
		return fmt.Errorf("grads: bucket [%d, %d): %w", b.Lo, b.Hi, err)
	}
	r.b.Copy(dst, src)
	return r.sticky("taking a bucket into the sharded gradients")
}

// reduceScatterOp prepares bucket i's reduce-scatter of buf (its
// gradients in the reduction's dtype), queuing the copy into the padded
// buffer on the backend's stream now, and returns the collective to start.
func (r *Reducer) reduceScatterOp(i int, buf *tensor.Tensor) (func(s comm.Stream) (comm.Work, error), error) {
	b, zb := &r.buckets[i], &r.zero.buckets[i]
	d := b.Group.Size()
	src := buf
	if zb.ragged {
		if zb.src == nil {
			zb.src = r.b.Zeros(buf.DType(), zb.r*d)
		}
		head, err := zb.src.View(0, b.Hi-b.Lo)
		if err != nil {
			return nil, err
		}
		r.b.Copy(head, buf) // the tail stays zero
		src = zb.src
	}
	zb.staged = zb.ragged || buf.DType() != r.zero.sg.DType()
	var dst *tensor.Tensor
	var err error
	if zb.staged {
		if zb.dst == nil {
			zb.dst = r.b.Zeros(buf.DType(), zb.r)
		}
		dst = zb.dst
	} else if dst, err = r.zero.sg.View(zb.k, zb.r); err != nil {
		return nil, err
	}
	if err := r.sticky("preparing a bucket's reduce-scatter"); err != nil {
		return nil, err
	}
	group := b.Group
	return func(s comm.Stream) (comm.Work, error) {
		return group.ReduceScatter(dst, src, comm.Sum, s)
	}, nil
}

// landed copies bucket i's sum, once its reduce-scatter is waited for,
// from the staging buffer into the sharded gradients.
func (r *Reducer) landed(i int) error {
	zb := &r.zero.buckets[i]
	n := zb.own.hi - zb.own.lo
	if !zb.staged || n == 0 {
		return nil
	}
	src, err := zb.dst.View(0, n)
	if err != nil {
		return err
	}
	dst, err := r.zero.sg.View(zb.k, n)
	if err != nil {
		return err
	}
	r.b.Copy(dst, src)
	return r.sticky("landing a bucket's reduce-scatter")
}

// GatherParams starts the all-gather of every bucket's updated
// parameters over its group (a distributed optimizer's, Config.Shard):
// each rank gives its owned part, from its parameters (or a staging copy,
// where a bucket is padded), on the reduction's lane. WaitParams waits for
// them; the parameters outside this rank's parts must not be read before.
// With Config.AfterBackward they are queued on the backend's stream
// instead, as the buckets' sums are. Without Config.Shard it does
// nothing.
func (r *Reducer) GatherParams() error {
	if err := r.usable("GatherParams"); err != nil {
		return err
	}
	z := r.zero
	if z == nil {
		return nil
	}
	if err := r.WaitParams(); err != nil {
		return err
	}
	w, _ := r.ps.Flat()
	var ops []func(s comm.Stream) (comm.Work, error)
	var which []int
	for i := range r.buckets {
		b, zb := &r.buckets[i], &z.buckets[i]
		if b.Group == nil {
			continue
		}
		d := b.Group.Size()
		n := zb.own.hi - zb.own.lo
		if zb.gsrc == nil {
			zb.gsrc = r.b.Zeros(w.DType(), zb.r)
		}
		src := zb.gsrc
		if n > 0 {
			mine, err := w.View(zb.own.lo, n)
			if err != nil {
				return err
			}
			head, err := src.View(0, n)
			if err != nil {
				return err
			}
			r.b.Copy(head, mine)
		}
		dst, err := w.View(b.Lo, b.Hi-b.Lo)
		if err != nil {
			return err
		}
		if zb.ragged {
			if zb.gbuf == nil {
				zb.gbuf = r.b.Zeros(w.DType(), zb.r*d)
			}
			dst = zb.gbuf
		}
		group := b.Group
		ops = append(ops, func(s comm.Stream) (comm.Work, error) { return group.AllGather(dst, src, s) })
		which = append(which, i)
	}
	if err := r.sticky("staging the parameters' all-gather"); err != nil {
		return err
	}
	if len(ops) == 0 {
		return nil
	}
	z.gather = which
	if r.cfg.AfterBackward {
		// The sums ran after the backward, on the backend's stream: so do
		// the gathers (queued now, waited for by WaitParams).
		for k, op := range ops {
			w, err := op(r.groups.Stream)
			if err != nil {
				w = lane.Failed(err)
			}
			z.buckets[which[k]].gwork = w
		}
		return nil
	}
	if z.lane == nil {
		var err error
		if z.lane, err = newLane(r.b, r.groups.Stream); err != nil {
			return err
		}
	}
	z.lane.Begin()
	for k, op := range ops {
		z.buckets[which[k]].gwork = z.lane.Run(op)
	}
	return nil
}

// WaitParams waits for the all-gathers GatherParams started and puts the
// padded buckets' parameters in place; a no-op when none is in flight.
func (r *Reducer) WaitParams() error {
	z := r.zero
	if z == nil || len(z.gather) == 0 {
		return nil
	}
	var first error
	if z.lane != nil {
		first = z.lane.End().Wait(r.groups.Stream)
	}
	w, _ := r.ps.Flat()
	for _, i := range z.gather {
		b, zb := &r.buckets[i], &z.buckets[i]
		if err := zb.gwork.Wait(r.groups.Stream); err != nil && first == nil {
			first = fmt.Errorf("grads: the all-gather of the parameters of bucket [%d, %d) over %s: %w", b.Lo, b.Hi, b.Group.Name(), err)
		}
		zb.gwork = nil
		if first == nil && zb.ragged {
			src, err := zb.gbuf.View(0, b.Hi-b.Lo)
			if err != nil {
				return err
			}
			dst, err := w.View(b.Lo, b.Hi-b.Lo)
			if err != nil {
				return err
			}
			r.b.Copy(dst, src)
		}
	}
	z.gather = z.gather[:0]
	if first != nil {
		return first
	}
	return r.sticky("gathering the parameters")
}
