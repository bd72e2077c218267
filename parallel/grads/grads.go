package grads

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"
	"sort"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/internal/lane"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// Groups are the process groups a model's gradients are reduced over, as
// comm.Grid makes them. A nil group stands for a group of one rank
// (nothing to reduce), so a model with tensor parallelism only needs TP,
// a data-parallel one DP.
type Groups struct {
	TP  comm.Comm // splits the TP-sharded parameters
	DP  comm.Comm // the data-parallel replicas of the dense parameters
	EP  comm.Comm // splits the expert weights
	EDP comm.Comm // the replicas of one rank's experts (the ranks with the same EP rank)
	// Stream is the backend's stream, on which every collective is queued
	// and waited for (nil on the CPU).
	Stream comm.Stream
}

// GridGroups returns the groups of g (all four of them), with stream s.
func GridGroups(g *comm.Grid, s comm.Stream) Groups {
	return Groups{TP: g.TPGroup, DP: g.DPGroup, EP: g.EPGroup, EDP: g.EDPGroup, Stream: s}
}

// size is the number of ranks of c (1 for nil).
func size(c comm.Comm) int {
	if c == nil {
		return 1
	}
	return c.Size()
}

// Reduction is a list of gradient tensors that are summed over one group:
// views of the flat main gradient (layers.ParamSet.MainGrads), each a run
// of neighbouring parameters of one kind, in flat order.
type Reduction struct {
	What  string           // what is reduced, for errors: "dense gradients over the DP group"
	Group comm.Comm        // never a group of one rank
	Grads []*tensor.Tensor // views of the flat gradient, summed in place
}

// span is a range [lo, hi) of the flat parameter buffers.
type span struct{ lo, hi int }

// Reducer reduces the gradients of one rank's parameters so that every rank
// holds, for each of its parameters, the gradient of the global loss, and
// computes the global gradient norm, each parameter counted once. It is
// driven by the shard descriptions of the parameters (shard.Shard):
//
//	parameter                  reduced over    Σ g² added over
//	replicated                 DP              (counted once)
//	replicated, PartialGrad    DP, then TP     (counted once)
//	split over TP              DP              TP
//	split over EP (experts)    EDP             EP
//
// The sums over a group are all-reduces of runs of neighbouring parameters
// of the flat gradient (one call on the whole buffer for a dense model).
type Reducer struct {
	b       tensor.Backend
	ps      *layers.ParamSet
	groups  Groups
	cfg     Config
	g       *tensor.Tensor // the flat main gradient (ParamSet.MainGrads): what is reduced and read
	pg      *tensor.Tensor // the flat parameter gradient (ParamSet.Flat's), where the backward adds
	redDT   tensor.DType   // the dtype the sums run in
	statDT  tensor.DType   // the dtype of the host sums' buffer (hostreduce)
	dense   []span         // every parameter but the experts: summed over DP
	partial []span         // replicated parameters with per-TP-rank partial gradients: summed over TP
	tp      []span         // parameters split over TP
	repl    []span         // parameters every rank holds whole
	expert  []span         // expert weights split over EP: summed over EDP
	parts   [3]*tensor.Tensor

	buckets []bucket
	byParam map[*layers.Param][]int // the buckets each parameter overlaps
	step    backwardState
	lane    *lane.Lane
	zero    *zeroState // a distributed optimizer's parts (Config.Shard), or nil
	closed  bool
}

// errClosing ends a backward that Close finds in progress.
var errClosing = errors.New("grads: closing")

// Close ends the Reducer's use of the device. It first waits for the
// collectives in flight, as the peers run them too: the sums started by a
// backward not ended (as EndBackward(err) waits for them, leaving that
// step's gradients incomplete) and the parameters' all-gathers
// (WaitParams, which puts them in place). Then it releases the side
// streams of its lanes (tensor.Streams.DestroyStream: the buckets' sums'
// and the all-gathers'; on a GPU the waits order the backend's stream, so
// no host sync is needed, and CUDA frees a destroyed stream once its work
// is done; the CPU's lanes are goroutines that end with each step). The
// Reducer holds no events: the fork of the side stream uses the backend's.
//
// It returns the first error of that work or of the release. After Close,
// BeginBackward and GatherParams refuse; a second Close does nothing and
// returns nil. The parameter set and the tensors the Reducer allocated
// stay with the backend.
func (r *Reducer) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	if r.step.on {
		if err := r.EndBackward(errClosing); err != errClosing {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.WaitParams())
	if r.lane != nil {
		errs = append(errs, closeLane(r.lane))
	}
	if r.zero != nil && r.zero.lane != nil {
		errs = append(errs, closeLane(r.zero.lane))
	}
	return errors.Join(errs...)
}

// usable is nil, or why op cannot run: the Reducer is closed.
func (r *Reducer) usable(op string) error {
	if r.closed {
		return fmt.Errorf("grads: %s on a closed Reducer (Close)", op)
	}
	return nil
}

// NewReducer is NewReducerWith the default Config: the sums in the main
// gradients' dtype, buckets of DefaultBucketBytes, each reduced as soon as
// the backward has completed it.
func NewReducer(b tensor.Backend, ps *layers.ParamSet, shards []shard.Shard, groups Groups) (*Reducer, error) {
	return NewReducerWith(b, ps, shards, groups, Config{})
}

// NewReducerWith plans the reduction of the materialized set ps, whose
// every parameter shards describes exactly once, over groups, as cfg says.
// The descriptions are checked against the parameters and the groups: a
// slice of a parameter split over TP (EP) must be 1/size of the full
// dimension, and a parameter split over EP needs the EP group. The
// reduction reads and writes ps.MainGrads(): give a bf16 set its fp32 main
// gradients (ParamSet.UseMainGrads) before.
func NewReducerWith(b tensor.Backend, ps *layers.ParamSet, shards []shard.Shard, groups Groups, cfg Config) (*Reducer, error) {
	if b == nil || ps == nil {
		return nil, errors.New("grads: NewReducer needs a backend and a parameter set")
	}
	_, pg := ps.Flat()
	g := ps.MainGrads()
	if g == nil || pg == nil {
		return nil, errors.New("grads: NewReducer: the parameter set is not materialized (ParamSet.Materialize)")
	}
	redDT, err := cfg.reduceDType(g, pg, ps.SeparateMainGrads())
	if err != nil {
		return nil, err
	}
	byParam := map[*layers.Param]shard.Shard{}
	for _, s := range shards {
		if err := s.Check(); err != nil {
			return nil, fmt.Errorf("grads: %w", err)
		}
		if ps.Lookup(s.Param.Name) != s.Param {
			return nil, fmt.Errorf("grads: parameter %q is described, but the set holds no such parameter", s.Param.Name)
		}
		if _, dup := byParam[s.Param]; dup {
			return nil, fmt.Errorf("grads: parameter %q is described twice", s.Param.Name)
		}
		var over comm.Comm
		switch s.Over {
		case shard.TP:
			over = groups.TP
		case shard.EP:
			over = groups.EP
		}
		if !s.Replicated() && (s.Hi-s.Lo)*size(over) != s.Full[s.Dim] {
			return nil, fmt.Errorf("grads: parameter %q holds [%d, %d) of dimension %d of %v, split over %v, but the %v group has %d ranks, expected 1/%d of the dimension each",
				s.Param.Name, s.Lo, s.Hi, s.Dim, s.Full, s.Over, s.Over, size(over), size(over))
		}
		byParam[s.Param] = s
	}
	r := &Reducer{b: b, ps: ps, groups: groups, cfg: cfg, g: g, pg: pg, redDT: redDT, statDT: layerkit.StatDType(g.DType())}
	params := ps.Params()
	sort.Slice(params, func(i, j int) bool { return params[i].Offset() < params[j].Offset() })
	for _, p := range params {
		s, ok := byParam[p]
		if !ok {
			return nil, fmt.Errorf("grads: parameter %q has no shard description (shard.Shard; shard.Whole describes a model of one rank)", p.Name)
		}
		sp := span{p.Offset(), p.Offset() + p.Numel()}
		switch s.Over {
		case shard.EP:
			r.expert = appendSpan(r.expert, sp)
			continue
		case shard.TP:
			r.tp = appendSpan(r.tp, sp)
		default:
			r.repl = appendSpan(r.repl, sp)
		}
		r.dense = appendSpan(r.dense, sp)
		if s.PartialGrad {
			r.partial = appendSpan(r.partial, sp)
		}
	}
	if cfg.Shard && cfg.ReduceBucket != nil {
		return nil, errors.New("grads: Config.Shard and Config.ReduceBucket: the distributed optimizer's reduce-scatter replaces the buckets' sums; give one of them")
	}
	if cfg.Shard && r.cfg.BucketAlign == 0 {
		r.cfg.BucketAlign = shardAlign(groups)
	}
	if err := r.planBuckets(params); err != nil {
		return nil, err
	}
	if cfg.Shard {
		if err := r.planShard(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// appendSpan adds s, merging it with the last span when they touch.
func appendSpan(spans []span, s span) []span {
	if n := len(spans); n > 0 && spans[n-1].hi == s.lo {
		spans[n-1].hi = s.hi
		return spans
	}
	return append(spans, s)
}

// views returns the spans of the flat gradient.
func (r *Reducer) views(spans []span) ([]*tensor.Tensor, error) {
	out := make([]*tensor.Tensor, len(spans))
	for i, s := range spans {
		v, err := r.g.View(s.lo, s.hi-s.lo)
		if err != nil {
			return nil, fmt.Errorf("grads: gradient span [%d, %d): %w", s.lo, s.hi, err)
		}
		out[i] = v
	}
	return out, nil
}

// Reductions lists the sums Reduce makes, in its order (a Reducer
// without Config.Shard): the dense
// gradients over DP (the whole flat buffer in a model without experts),
// the experts' over EDP, the partial gradients over TP. Groups of one rank
// and kinds without parameters are left out.
func (r *Reducer) Reductions() ([]Reduction, error) {
	if r.zero != nil {
		return nil, errors.New("grads: Reductions of a distributed optimizer's Reducer (Config.Shard), whose sums are reduce-scatters into its parts: call Reduce")
	}
	type item struct {
		what  string
		group comm.Comm
		spans []span
	}
	items := []item{{"dense gradients over the DP group", r.groups.DP, r.dense}}
	if len(r.expert) == 0 {
		items[0] = item{"gradients over the DP group", r.groups.DP, []span{{0, r.g.Numel()}}}
	} else {
		items = append(items, item{"expert gradients over the EDP group", r.groups.EDP, r.expert})
	}
	items = append(items, item{"partial gradients over the TP group", r.groups.TP, r.partial})
	var out []Reduction
	for _, it := range items {
		if size(it.group) == 1 || len(it.spans) == 0 {
			continue
		}
		vs, err := r.views(it.spans)
		if err != nil {
			return nil, err
		}
		out = append(out, Reduction{What: it.what, Group: it.group, Grads: vs})
	}
	return out, nil
}

// Reduce sums the gradients over their groups after a backward that ran
// without the Reducer's GradSync calls: the bucket's sums over DP (EDP
// for the experts), bucket by bucket, then the partial gradients' over
// TP, in place, each queued on the groups' stream and waited for there;
// with separate main gradients (a bf16 set) the backward's gradients are
// first copied into them. It is a step of one micro-batch whose buckets
// all become complete at its end, so its sums are those of a backward
// with the GradSync calls, bit for bit. Every rank of the groups calls it
// after its backward.
func (r *Reducer) Reduce() error {
	if err := r.BeginBackward(0, 1); err != nil {
		return err
	}
	return r.EndBackward(nil)
}

// allReduce sums t over group c in place and waits for it on the stream.
func (r *Reducer) allReduce(c comm.Comm, what string, t *tensor.Tensor) error {
	if size(c) == 1 {
		return nil
	}
	s := r.groups.Stream
	w, err := c.AllReduce(t, comm.Sum, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("grads: %s: %w", what, err)
	}
	return nil
}

func (r *Reducer) sticky(pass string) error {
	if err := r.b.Err(); err != nil {
		return fmt.Errorf("grads: %s: %w", pass, err)
	}
	return nil
}

// kinds are the spans whose Σ g² is summed apart: split over TP (added
// over TP), replicated (counted once), split over EP (added over EP).
func (r *Reducer) kinds() [3][]span { return [3][]span{r.tp, r.repl, r.expert} }

// GradSumSquares returns Σ g² over the whole model's gradients, each
// parameter counted once: the TP shards' sums added over the TP group, the
// expert shards' over the EP group (whose ranks hold distinct experts), the
// replicated parameters (the same on every rank after Reduce) taken once,
// and nothing added over DP or EDP (the replicas hold the same reduced
// gradients). It is the same on every rank, so clipping keeps the ranks in
// step. Call it after Reduce; it is collective over the TP group and, with
// experts, the EP group.
func (r *Reducer) GradSumSquares() (float64, error) {
	var parts [3]float64
	for i, spans := range r.kinds() {
		vs, err := r.kindViews(spans)
		if err != nil {
			return 0, err
		}
		for _, v := range vs {
			parts[i] += r.b.SumSquares(v)
		}
	}
	if err := r.sticky("gradient norm"); err != nil {
		return 0, err
	}
	if r.zero != nil { // each rank holds its parts: add them over the buckets' groups
		var err error
		for i, c := range r.kindGroups() {
			if parts[i], err = r.sumOver(c, "gradient norm over the replicas' parts", parts[i]); err != nil {
				return 0, err
			}
		}
	}
	tp, err := r.sumOver(r.groups.TP, "gradient norm over the TP group", parts[0])
	if err != nil {
		return 0, err
	}
	expert := parts[2]
	if len(r.expert) > 0 {
		if expert, err = r.sumOver(r.groups.EP, "gradient norm over the EP group", expert); err != nil {
			return 0, err
		}
	}
	return tp + parts[1] + expert, nil
}

// kindViews are the gradients of spans the norm reads: the main
// gradients, or a distributed optimizer's sharded ones (the parts this
// rank owns).
func (r *Reducer) kindViews(spans []span) ([]*tensor.Tensor, error) {
	if r.zero != nil {
		return r.ownedViews(spans)
	}
	return r.views(spans)
}

// kindGroups are the groups whose ranks own the parts of each kind of
// kinds with a distributed optimizer: the dense parameters' buckets are
// split over DP, the experts' over EDP.
func (r *Reducer) kindGroups() [3]comm.Comm {
	return [3]comm.Comm{r.groups.DP, r.groups.DP, r.groups.EDP}
}

// sumOver returns the sum of v over group c (v on a group of one rank).
func (r *Reducer) sumOver(c comm.Comm, what string, v float64) (float64, error) {
	if size(c) == 1 {
		return v, nil
	}
	vals := []float64{v}
	if err := hostreduce.AllReduce(r.b, c, r.statDT, vals, comm.Sum, r.groups.Stream); err != nil {
		return 0, fmt.Errorf("grads: %s: %w", what, err)
	}
	return vals[0], nil
}

// GradNorm is sqrt(GradSumSquares()): the global gradient norm.
func (r *Reducer) GradNorm() (float64, error) {
	ss, err := r.GradSumSquares()
	if err != nil {
		return 0, err
	}
	return math.Sqrt(ss), nil
}

// GradSumSquaresTo is GradSumSquares without the host: dst (one element,
// Float32, or Float64 for f64 parameters: the optimizer's moment dtype) +=
// Σ g² of the whole model, computed and all-reduced on the device (each
// kind in its own scalar, kept across calls), so a training step can clip
// on the device (optim.AdamW.ClipStep) without waiting for the backward. It
// is collective like GradSumSquares (optim.DeviceGradSumSquarer).
func (r *Reducer) GradSumSquaresTo(dst *tensor.Tensor) error {
	if dst == nil || dst.Numel() != 1 {
		return fmt.Errorf("grads: gradient norm: dst %v, expected a tensor of one element", dst)
	}
	for i, spans := range r.kinds() {
		if r.parts[i] == nil || r.parts[i].DType() != dst.DType() {
			r.parts[i] = r.b.Zeros(dst.DType(), 1)
		}
		part := r.parts[i]
		r.b.Fill(part, 0)
		vs, err := r.kindViews(spans)
		if err != nil {
			return err
		}
		for _, v := range vs {
			r.b.SumSquaresTo(part, v)
		}
	}
	if err := r.sticky("gradient norm"); err != nil {
		return err
	}
	if r.zero != nil { // each rank holds its parts: add them over the buckets' groups
		for i, c := range r.kindGroups() {
			if err := r.allReduce(c, "gradient norm over the replicas' parts", r.parts[i]); err != nil {
				return err
			}
		}
	}
	if err := r.allReduce(r.groups.TP, "gradient norm over the TP group", r.parts[0]); err != nil {
		return err
	}
	if len(r.expert) > 0 {
		if err := r.allReduce(r.groups.EP, "gradient norm over the EP group", r.parts[2]); err != nil {
			return err
		}
	}
	for _, part := range r.parts {
		r.b.Add(dst, dst, part)
	}
	return r.sticky("gradient norm")
}

// ClipGrads scales every gradient of this rank by min(1, maxNorm/(norm +
// 1e-6)), norm being the global gradient norm (GradNorm), and returns the
// norm: clipping for a loop that updates with an unclipped step. maxNorm
// 0 leaves the gradients as they are. A non-finite norm is returned with
// an error, the gradients untouched. Collective like GradSumSquares.
func (r *Reducer) ClipGrads(maxNorm float64) (float64, error) {
	if !(maxNorm >= 0) || math.IsInf(maxNorm, 0) {
		return 0, fmt.Errorf("grads: clipping to a norm of %v, expected a finite value ≥ 0 (0: no clipping)", maxNorm)
	}
	ss, err := r.GradSumSquares()
	if err != nil {
		return 0, err
	}
	norm := math.Sqrt(ss)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm, fmt.Errorf("grads: the global gradient norm is %v", norm)
	}
	if f := tensor.ClipFactor(ss, maxNorm); f < 1 {
		g := r.g
		if r.zero != nil {
			g = r.zero.sg
		}
		r.b.Scale(g, g, float32(f))
	}
	return norm, r.sticky("clipping")
}
