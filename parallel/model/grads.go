package model

import (
	"fmt"
	"sort"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
)

// span is a range [lo, hi) of the flat parameter buffers.
type span struct{ lo, hi int }

// gradPlan groups the flat gradient buffer into spans of parameters of one
// kind, merging neighbours, so each reduction is a few large calls.
type gradPlan struct {
	dense      []span // every parameter but the experts: summed over DP
	partial    []span // replicated parameters with per-TP-rank partial gradients: summed over TP
	sharded    []span // parameters split over TP: a distinct slice on each TP rank
	replicated []span // parameters every TP rank holds whole (partial or not)
	expert     []span // expert weights split over EP: summed over EDP
}

func newGradPlan(ps *layers.ParamSet, shards []tp.Shard, experts []*layers.Param) (gradPlan, error) {
	byParam := map[*layers.Param]tp.Shard{}
	for _, s := range shards {
		byParam[s.Param] = s
	}
	isExpert := map[*layers.Param]bool{}
	for _, p := range experts {
		isExpert[p] = true
	}
	var plan gradPlan
	params := ps.Params()
	sort.Slice(params, func(i, j int) bool { return params[i].Offset() < params[j].Offset() })
	for _, p := range params {
		s, ok := byParam[p]
		if !ok {
			return gradPlan{}, fmt.Errorf("model: internal error: parameter %q has no shard description", p.Name)
		}
		sp := span{p.Offset(), p.Offset() + p.Numel()}
		switch {
		case isExpert[p]:
			plan.expert = appendSpan(plan.expert, sp)
			continue
		case s.Replicated():
			plan.replicated = appendSpan(plan.replicated, sp)
		default:
			plan.sharded = appendSpan(plan.sharded, sp)
		}
		plan.dense = appendSpan(plan.dense, sp)
		if s.PartialGrad {
			plan.partial = appendSpan(plan.partial, sp)
		}
	}
	return plan, nil
}

// appendSpan adds s, merging it with the last span when they touch.
func appendSpan(spans []span, s span) []span {
	if n := len(spans); n > 0 && spans[n-1].hi == s.lo {
		spans[n-1].hi = s.hi
		return spans
	}
	return append(spans, s)
}

// views returns the spans of the flat tensor t.
func views(t *tensor.Tensor, spans []span) ([]*tensor.Tensor, error) {
	out := make([]*tensor.Tensor, len(spans))
	for i, s := range spans {
		v, err := t.View(s.lo, s.hi-s.lo)
		if err != nil {
			return nil, fmt.Errorf("model: gradient span [%d, %d): %w", s.lo, s.hi, err)
		}
		out[i] = v
	}
	return out, nil
}

// reduceGrads makes every gradient the gradient of the global mean loss:
// the dense spans summed over the DP group (one all-reduce on the whole
// flat buffer in a dense model), the expert spans over the EDP group, and
// the partial spans over the TP group.
func (m *Model) reduceGrads() error {
	_, g := m.ps.Flat()
	if len(m.plan.expert) == 0 {
		if err := m.allReduce(m.grid.DPGroup, "gradients over the DP group", g); err != nil {
			return err
		}
	} else {
		if err := m.allReduceSpans(m.grid.DPGroup, "gradients over the DP group", g, m.plan.dense); err != nil {
			return err
		}
		if err := m.allReduceSpans(m.grid.EDPGroup, "expert gradients over the EDP group", g, m.plan.expert); err != nil {
			return err
		}
	}
	if err := m.allReduceSpans(m.grid.TPGroup, "partial gradients over the TP group", g, m.plan.partial); err != nil {
		return err
	}
	return sticky(m.b, "gradient reduction")
}

// allReduceSpans sums the spans of the flat tensor g over group c (nothing
// on a group of one rank).
func (m *Model) allReduceSpans(c comm.Comm, what string, g *tensor.Tensor, spans []span) error {
	if c.Size() == 1 || len(spans) == 0 {
		return nil
	}
	vs, err := views(g, spans)
	if err != nil {
		return err
	}
	for _, v := range vs {
		if err := m.allReduce(c, what, v); err != nil {
			return err
		}
	}
	return nil
}

// allReduce sums t over group c, in place, and waits for it (nothing on a
// group of one rank).
func (m *Model) allReduce(c comm.Comm, what string, t *tensor.Tensor) error {
	if c.Size() == 1 {
		return nil
	}
	s := m.par.Stream
	w, err := c.AllReduce(t, comm.Sum, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("model: %s: %w", what, err)
	}
	return nil
}

// GradSumSquares returns Σ g² over the whole model's gradients, each
// parameter counted once: the TP shards' sums added over the TP group, the
// expert shards' over the EP group (whose ranks hold distinct experts), the
// replicated parameters (the same on every rank after Backward) taken once,
// and nothing added over DP or EDP (the replicas hold the same reduced
// gradients). It is the same on every rank, so clipping keeps the ranks in
// step. train.Run uses it for the gradient norm (train.GradSumSquarer).
// Call it after Backward; it is collective over the TP group and, in an
// MoE model, the EP group.
func (m *Model) GradSumSquares() (float64, error) {
	_, g := m.ps.Flat()
	sum := func(spans []span) (float64, error) {
		vs, err := views(g, spans)
		if err != nil {
			return 0, err
		}
		var ss float64
		for _, v := range vs {
			ss += m.b.SumSquares(v)
		}
		return ss, nil
	}
	var parts [3]float64
	for i, spans := range [][]span{m.plan.sharded, m.plan.replicated, m.plan.expert} {
		v, err := sum(spans)
		if err != nil {
			return 0, m.fail(err)
		}
		parts[i] = v
	}
	if err := sticky(m.b, "gradient norm"); err != nil {
		return 0, m.fail(err)
	}
	sharded, err := m.sumOver(m.grid.TPGroup, "gradient norm over the TP group", parts[0])
	if err != nil {
		return 0, m.fail(err)
	}
	expert := parts[2]
	if len(m.plan.expert) > 0 {
		if expert, err = m.sumOver(m.grid.EPGroup, "gradient norm over the EP group", expert); err != nil {
			return 0, m.fail(err)
		}
	}
	return sharded + parts[1] + expert, nil
}

// GradSumSquaresTo is GradSumSquares without the host: dst (one element,
// the model's stat dtype, Float32 for bf16) += Σ g² of the whole model,
// computed and all-reduced on the device (each part in its own scalar, the
// TP shards' summed over the TP group and the experts' over the EP group,
// on the backend's stream), so a training step can clip on the device
// (tensor.AdamW's NormSq) without waiting for the backward. It is collective
// like GradSumSquares (train.DeviceGradSumSquarer).
func (m *Model) GradSumSquaresTo(dst *tensor.Tensor) error {
	if dst == nil || dst.Numel() != 1 {
		return m.fail(fmt.Errorf("model: gradient norm: dst %v, expected a tensor of one element", dst))
	}
	_, g := m.ps.Flat()
	for i, spans := range [][]span{m.plan.sharded, m.plan.replicated, m.plan.expert} {
		m.ssParts[i] = layers.Ensure(m.b, m.ssParts[i], dst.DType(), 1)
		part := m.ssParts[i]
		m.b.Fill(part, 0)
		vs, err := views(g, spans)
		if err != nil {
			return m.fail(err)
		}
		for _, v := range vs {
			m.b.SumSquaresTo(part, v)
		}
	}
	if err := sticky(m.b, "gradient norm"); err != nil {
		return m.fail(err)
	}
	if err := m.allReduce(m.grid.TPGroup, "gradient norm over the TP group", m.ssParts[0]); err != nil {
		return m.fail(err)
	}
	if len(m.plan.expert) > 0 {
		if err := m.allReduce(m.grid.EPGroup, "gradient norm over the EP group", m.ssParts[2]); err != nil {
			return m.fail(err)
		}
	}
	for _, part := range m.ssParts {
		m.b.Add(dst, dst, part)
	}
	if err := sticky(m.b, "gradient norm"); err != nil {
		return m.fail(err)
	}
	return nil
}

// sumOver returns the sum of v over group c (v on a group of one rank).
func (m *Model) sumOver(c comm.Comm, what string, v float64) (float64, error) {
	vals := []float64{v}
	if err := hostreduce.AllReduce(m.b, c, layers.StatDType(m.dt), vals, comm.Sum, m.par.Stream); err != nil {
		return 0, fmt.Errorf("model: %s: %w", what, err)
	}
	return vals[0], nil
}
