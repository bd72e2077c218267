package model

import (
	"fmt"
	"sort"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
)

// span is a range [lo, hi) of the flat parameter buffers.
type span struct{ lo, hi int }

// gradPlan groups the flat gradient buffer into spans of parameters of one
// kind, merging neighbours, so each reduction is a few large calls.
type gradPlan struct {
	partial    []span // replicated parameters with per-TP-rank partial gradients: summed over TP
	sharded    []span // parameters split over TP: a distinct slice on each TP rank
	replicated []span // parameters every TP rank holds whole (partial or not)
}

func newGradPlan(ps *layers.ParamSet, shards []tp.Shard) (gradPlan, error) {
	byParam := map[*layers.Param]tp.Shard{}
	for _, s := range shards {
		byParam[s.Param] = s
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
		if s.Replicated() {
			plan.replicated = appendSpan(plan.replicated, sp)
		} else {
			plan.sharded = appendSpan(plan.sharded, sp)
		}
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
// the whole flat buffer summed over the DP group (one all-reduce), and the
// partial spans summed over the TP group.
func (m *Model) reduceGrads() error {
	_, g := m.ps.Flat()
	s := m.par.Stream
	if m.grid.DP > 1 {
		w, err := m.grid.DPGroup.AllReduce(g, comm.Sum, s)
		if err == nil {
			err = w.Wait(s)
		}
		if err != nil {
			return fmt.Errorf("model: gradients over the DP group: %w", err)
		}
	}
	if m.grid.TP > 1 && len(m.plan.partial) > 0 {
		vs, err := views(g, m.plan.partial)
		if err != nil {
			return err
		}
		for _, v := range vs {
			w, err := m.grid.TPGroup.AllReduce(v, comm.Sum, s)
			if err == nil {
				err = w.Wait(s)
			}
			if err != nil {
				return fmt.Errorf("model: sequence-parallel partial gradients over the TP group: %w", err)
			}
		}
	}
	return sticky(m.b, "gradient reduction")
}

// GradSumSquares returns Σ g² over the whole model's gradients, each
// parameter counted once: the TP shards' sums added over the TP group, the
// replicated parameters (the same on every TP rank after Backward) taken
// once, and nothing added over DP (every replica holds the same reduced
// gradients). It is the same on every rank, so clipping keeps the ranks in
// step. train.Run uses it for the gradient norm (train.GradSumSquarer).
// Call it after Backward; it is collective over the TP group.
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
	sharded, err := sum(m.plan.sharded)
	if err != nil {
		return 0, m.fail(err)
	}
	repl, err := sum(m.plan.replicated)
	if err != nil {
		return 0, m.fail(err)
	}
	if err := sticky(m.b, "gradient norm"); err != nil {
		return 0, m.fail(err)
	}
	if m.grid.TP > 1 {
		m.normBuf = ensure(m.b, m.normBuf, statDType(m.dt), 1)
		h := tensor.MustHost(tensor.Float64, 1)
		h.F64()[0] = sharded
		m.b.Upload(m.normBuf, h)
		if err := sticky(m.b, "gradient norm"); err != nil {
			return 0, m.fail(err)
		}
		s := m.par.Stream
		w, err := m.grid.TPGroup.AllReduce(m.normBuf, comm.Sum, s)
		if err == nil {
			err = w.Wait(s)
		}
		if err != nil {
			return 0, m.fail(fmt.Errorf("model: gradient norm over the TP group: %w", err))
		}
		m.b.Download(h, m.normBuf)
		if err := sticky(m.b, "gradient norm"); err != nil {
			return 0, m.fail(err)
		}
		sharded = h.F64()[0]
	}
	return sharded + repl, nil
}
