package grads

import (
	"fmt"
	"sort"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// DefaultBucketBytes is the size of a bucket when Config.BucketBytes is 0:
// 25 MiB, PyTorch DDP's bucket_cap_mb default.
const DefaultBucketBytes = 25 << 20

// Config says how a Reducer reduces. The zero value is the default: the
// sums in the main gradients' dtype, buckets of DefaultBucketBytes, each
// bucket's sum started as soon as the backward has completed it.
type Config struct {
	// DType is the dtype the sums over the replicas run in: 0 means the
	// main gradients' own (fp32 for a bf16 set with fp32 main gradients,
	// layers.ParamSet.UseMainGrads; else the parameters' dtype).
	// tensor.BFloat16 with fp32 main gradients rounds each bucket to the
	// bf16 parameter gradients' buffer, sums it there and widens the sum
	// back (what the reduction of a bf16 model was before it had main
	// gradients). Any other value must be the main gradients' dtype.
	DType tensor.DType
	// BucketBytes is the size of a bucket, in bytes of DType: each run
	// of the flat gradient summed over one group is cut into buckets of
	// that many bytes (the run's last may be smaller), each summed by
	// one collective. 0 means DefaultBucketBytes.
	BucketBytes int
	// BucketAlign, when > 1, rounds the buckets' size down to a multiple
	// of this many elements (at least one multiple): a reduce-scatter of
	// a bucket over D ranks (ReduceBucket) wants it divisible by D.
	BucketAlign int
	// AfterBackward sums every bucket after the whole backward (in the
	// same buckets, order and dtype, so with the same bits) instead of
	// starting each bucket's sum as soon as its gradients are complete.
	AfterBackward bool
	// ReduceBucket, when not nil, replaces a bucket's all-reduce: it is
	// given the bucket and buf, its gradients in the reduction's dtype,
	// queues the sum over bkt.Group on stream s and returns its Work (a
	// sharded optimizer's reduce-scatter of the bucket into this rank's
	// part, ZeRO-1). The Reducer waits for the Work before the step's
	// end. nil: an all-reduce (comm.Sum) of buf over bkt.Group.
	ReduceBucket func(bkt Bucket, buf *tensor.Tensor, s comm.Stream) (comm.Work, error)
	// Shard makes the reduction a distributed optimizer's (ZeRO stage 1,
	// Megatron-LM's distributed optimizer; zero.go): each bucket is split
	// over the ranks of its group, its sum is a reduce-scatter that leaves
	// each rank its part, the parts a rank owns are its sharded gradients
	// (Sharding, for optim.NewShardedAdamW), the partial gradients' sums
	// over TP and the gradient norm run on them, and GatherParams
	// all-gathers the updated parameters. BucketAlign defaults to the
	// groups' sizes.
	Shard bool
}

// reduceDType checks c.DType against the main gradients g and the
// parameter gradients pg, and returns the dtype the sums run in.
func (c Config) reduceDType(g, pg *tensor.Tensor, separate bool) (tensor.DType, error) {
	switch {
	case c.BucketBytes < 0:
		return 0, fmt.Errorf("grads: Config.BucketBytes = %d, expected ≥ 0 (0: %d)", c.BucketBytes, DefaultBucketBytes)
	case c.BucketAlign < 0:
		return 0, fmt.Errorf("grads: Config.BucketAlign = %d, expected ≥ 0", c.BucketAlign)
	case c.DType == tensor.Invalid || c.DType == g.DType():
		return g.DType(), nil
	case c.DType == tensor.BFloat16 && separate && pg.DType() == tensor.BFloat16:
		return tensor.BFloat16, nil
	case c.DType == tensor.BFloat16:
		return 0, fmt.Errorf("grads: a reduction in bf16 of %v gradients, expected bf16 parameters with fp32 main gradients (layers.ParamSet.UseMainGrads) or the gradients' own dtype", g.DType())
	case pg.DType() == tensor.BFloat16:
		return 0, fmt.Errorf("grads: a reduction in %v of bf16 gradients without fp32 main gradients: give the parameter set its main gradients (layers.ParamSet.UseMainGrads) first, or reduce in bf16", c.DType)
	}
	return 0, fmt.Errorf("grads: a reduction in %v of %v gradients, expected their own dtype (or bf16 with fp32 main gradients)", c.DType, g.DType())
}

// Bucket is a run [Lo, Hi) of the flat gradient (element offsets, the
// parameters' layout) whose sum over Group one collective makes.
type Bucket struct {
	Lo    int       // the bucket's first element of the flat gradient
	Hi    int       // one past its last
	Group comm.Comm // DP for the dense parameters, EDP for the experts; nil: a group of one rank
	What  string    // "dense gradients over the DP group", for errors
}

// bucket is a Bucket and its state in the backward in progress.
type bucket struct {
	Bucket
	params  int       // parameters that overlap it
	pending int       // of those, the ones not complete yet
	done    bool      // complete: its gradients are in the main gradients
	work    comm.Work // its sum, once started
	rbuf    *tensor.Tensor
}

// backwardState is the micro-batch whose backward is in progress.
type backwardState struct {
	micro, micros int
	on            bool
	order         []int // the buckets whose sum started, in order
	failed        error // the first error of the step's sums
}

func (st *backwardState) last() bool { return st.micro == st.micros-1 }

// Buckets lists the buckets in flat order: the runs of neighbouring
// parameters summed over DP (every parameter but the experts) and over EDP
// (the experts), cut at Config.BucketBytes. Together they cover every
// parameter once. A bucket over a group of one rank is summed by nothing,
// but its gradients still go through the main gradients.
func (r *Reducer) Buckets() []Bucket {
	out := make([]Bucket, len(r.buckets))
	for i, b := range r.buckets {
		out[i] = b.Bucket
	}
	return out
}

// planBuckets cuts the dense and expert runs into buckets and maps every
// parameter (params, in flat order) to the buckets it overlaps.
func (r *Reducer) planBuckets(params []*layers.Param) error {
	bytes := r.cfg.BucketBytes
	if bytes == 0 {
		bytes = DefaultBucketBytes
	}
	per := max(bytes/r.redDT.Size(), 1)
	if a := r.cfg.BucketAlign; a > 1 {
		per = max(per/a, 1) * a
	}
	add := func(spans []span, group comm.Comm, what string) {
		if size(group) == 1 {
			group = nil
		}
		for _, sp := range spans {
			for lo := sp.lo; lo < sp.hi; lo += per {
				r.buckets = append(r.buckets, bucket{Bucket: Bucket{Lo: lo, Hi: min(lo+per, sp.hi), Group: group, What: what}})
			}
		}
	}
	add(r.dense, r.groups.DP, "dense gradients over the DP group")
	add(r.expert, r.groups.EDP, "expert gradients over the EDP group")
	sort.Slice(r.buckets, func(i, j int) bool { return r.buckets[i].Lo < r.buckets[j].Lo })
	r.byParam = map[*layers.Param][]int{}
	for _, p := range params {
		lo, hi := p.Offset(), p.Offset()+p.Numel()
		first := sort.Search(len(r.buckets), func(i int) bool { return r.buckets[i].Hi > lo })
		for i := first; i < len(r.buckets) && r.buckets[i].Lo < hi; i++ {
			r.byParam[p] = append(r.byParam[p], i)
			r.buckets[i].params++
		}
	}
	covered := 0
	for _, b := range r.buckets {
		covered += b.Hi - b.Lo
	}
	if covered != r.g.Numel() {
		return fmt.Errorf("grads: internal error: the buckets cover %d of the %d gradients", covered, r.g.Numel())
	}
	return nil
}

// BeginBackward starts the backward of micro-batch micro (from 0) of a
// step's micros (layers.GradSync): on the last one, each bucket's
// gradients go into the main gradients and their sum starts as soon as
// Ready has completed them.
func (r *Reducer) BeginBackward(micro, micros int) error {
	if micros < 1 || micro < 0 || micro >= micros {
		return fmt.Errorf("grads: the backward of micro-batch %d of %d, expected 0 ≤ micro < micros", micro, micros)
	}
	if err := r.usable("BeginBackward"); err != nil {
		return err
	}
	if r.step.on {
		return fmt.Errorf("grads: BeginBackward of micro-batch %d while the backward of micro-batch %d has not ended (EndBackward)", micro, r.step.micro)
	}
	r.step = backwardState{micro: micro, micros: micros, on: true, order: r.step.order[:0]}
	for i := range r.buckets {
		b := &r.buckets[i]
		b.pending, b.done, b.work = b.params, false, nil
	}
	if r.step.last() && !r.cfg.AfterBackward && r.needsLane() {
		if r.lane == nil {
			var err error
			if r.lane, err = newLane(r.b, r.groups.Stream); err != nil {
				return err
			}
		}
		r.lane.Begin()
	}
	return nil
}

// needsLane reports whether a bucket is summed over a group of more than
// one rank.
func (r *Reducer) needsLane() bool {
	for _, b := range r.buckets {
		if b.Group != nil {
			return true
		}
	}
	return false
}

// Ready marks params' gradients complete for the micro-batch
// (layers.GradSync). On the step's last micro-batch, every bucket whose
// parameters are all complete goes into the main gradients and its sum
// starts on the side lane (the side stream on a GPU, a goroutine on the
// CPU), the buckets completed by one call from the last in flat order
// (the backward's order). Every rank of a group completes its buckets in
// the same order, so their collectives match.
func (r *Reducer) Ready(params []*layers.Param) error {
	if !r.step.on {
		return fmt.Errorf("grads: Ready outside a backward (BeginBackward)")
	}
	if !r.step.last() || r.cfg.AfterBackward {
		return nil // the buckets are taken at EndBackward
	}
	var complete []int
	for _, p := range params {
		for _, i := range r.byParam[p] {
			b := &r.buckets[i]
			if b.pending--; b.pending == 0 {
				complete = append(complete, i)
			}
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(complete)))
	for _, i := range complete {
		if err := r.complete(i); err != nil {
			return err
		}
	}
	return nil
}

// complete takes bucket i's gradients into the main gradients and, on the
// step's last micro-batch, starts its sum.
func (r *Reducer) complete(i int) error {
	b := &r.buckets[i]
	if b.done {
		return nil
	}
	b.done = true
	st := &r.step
	if err := r.ps.AccumulateGrads(b.Lo, b.Hi, st.micro == 0, !st.last()); err != nil {
		return fmt.Errorf("grads: %w", err)
	}
	if !st.last() {
		return nil
	}
	if b.Group == nil {
		if r.zero != nil {
			return r.takeWhole(i)
		}
		return nil
	}
	buf, err := r.bucketBuf(b)
	if err != nil {
		return err
	}
	b.rbuf = buf
	st.order = append(st.order, i)
	op := func(s comm.Stream) (comm.Work, error) {
		if r.cfg.ReduceBucket != nil {
			return r.cfg.ReduceBucket(b.Bucket, buf, s)
		}
		return b.Group.AllReduce(buf, comm.Sum, s)
	}
	if r.zero != nil {
		if op, err = r.reduceScatterOp(i, buf); err != nil {
			return fmt.Errorf("grads: %s: %w", b.What, err)
		}
	}
	if r.lane != nil && r.lane.Active() {
		b.work = r.lane.Run(op)
		return nil
	}
	w, err := op(r.groups.Stream)
	if err == nil {
		err = w.Wait(r.groups.Stream)
	}
	if err != nil {
		return fmt.Errorf("grads: %s: %w", b.What, err)
	}
	b.work = comm.Done
	return nil
}

// bucketBuf is the tensor bucket b's sum runs on: its main gradients, or,
// with a bf16 reduction of fp32 main gradients, the parameter gradients'
// run, into which the main gradients are rounded first.
func (r *Reducer) bucketBuf(b *bucket) (*tensor.Tensor, error) {
	m, err := r.g.View(b.Lo, b.Hi-b.Lo)
	if err != nil {
		return nil, fmt.Errorf("grads: bucket [%d, %d): %w", b.Lo, b.Hi, err)
	}
	if r.redDT == r.g.DType() {
		return m, nil
	}
	pg, err := r.pg.View(b.Lo, b.Hi-b.Lo)
	if err != nil {
		return nil, fmt.Errorf("grads: bucket [%d, %d): %w", b.Lo, b.Hi, err)
	}
	r.b.Copy(pg, m)
	return pg, r.sticky("rounding a bucket to the reduction's dtype")
}

// EndBackward ends the micro-batch's backward (layers.GradSync): every
// bucket that Ready has not completed is completed now (from the last in
// flat order), and after the step's last micro-batch every bucket's sum is
// waited for (on the groups' stream), then the partial gradients are
// summed over TP. With failed, it only waits for the sums already started
// and returns failed.
func (r *Reducer) EndBackward(failed error) error {
	st := &r.step
	if !st.on {
		if failed != nil {
			return failed
		}
		return fmt.Errorf("grads: EndBackward outside a backward (BeginBackward)")
	}
	err := failed
	if err == nil {
		for i := len(r.buckets) - 1; i >= 0 && err == nil; i-- {
			err = r.complete(i)
		}
	}
	if werr := r.waitBuckets(); err == nil {
		err = werr
	}
	st.on = false
	if err != nil || !st.last() {
		return err
	}
	if err := r.sticky("gradient reduction"); err != nil {
		return err
	}
	rs, err := r.partialViews()
	if err != nil {
		return err
	}
	for _, t := range rs {
		if err := r.reduceIn(r.groups.TP, "partial gradients over the TP group", t); err != nil {
			return err
		}
	}
	return r.sticky("gradient reduction")
}

// waitBuckets waits for the sums started (on the groups' stream) and, for a
// bf16 reduction, widens them back into the main gradients; it returns the
// first error.
func (r *Reducer) waitBuckets() error {
	var first error
	if r.lane != nil && r.lane.Active() {
		first = r.lane.End().Wait(r.groups.Stream)
	}
	for _, i := range r.step.order {
		b := &r.buckets[i]
		if b.work == nil {
			continue
		}
		if err := b.work.Wait(r.groups.Stream); err != nil && first == nil {
			first = fmt.Errorf("grads: %s: %w", b.What, err)
		}
		b.work = nil
		if r.zero != nil {
			if first == nil {
				first = r.landed(i)
			}
			continue
		}
		if first == nil && b.rbuf != nil && b.rbuf.DType() != r.g.DType() {
			m, err := r.g.View(b.Lo, b.Hi-b.Lo)
			if err != nil {
				return err
			}
			r.b.Copy(m, b.rbuf)
		}
	}
	return first
}

// partialViews are the runs of the main gradient summed over TP.
func (r *Reducer) partialViews() ([]*tensor.Tensor, error) {
	if size(r.groups.TP) == 1 {
		return nil, nil
	}
	if r.zero != nil {
		// The parts this rank owns (the TP ranks of a replica own the same).
		return r.ownedViews(r.partial)
	}
	return r.views(r.partial)
}

// reduceIn sums the main-gradient run t over c in the reduction's dtype
// (through the parameter gradients' buffer for a bf16 one) and waits.
func (r *Reducer) reduceIn(c comm.Comm, what string, t *tensor.Tensor) error {
	if r.redDT == t.DType() || r.zero != nil { // a distributed optimizer's parts: in their own dtype
		return r.allReduce(c, what, t)
	}
	off := t.Offset() - r.g.Offset()
	pg, err := r.pg.View(off, t.Numel())
	if err != nil {
		return fmt.Errorf("grads: %s: %w", what, err)
	}
	r.b.Copy(pg, t)
	if err := r.allReduce(c, what, pg); err != nil {
		return err
	}
	r.b.Copy(t, pg)
	return nil
}
