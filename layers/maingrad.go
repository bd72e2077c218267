package layers

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/tensor"
)

// Main gradients: where a step's gradients add up over its micro-batches
// and what the gradient reduction and the optimizer read.
//
// The backward adds every parameter's gradient into its G (+=), in the
// parameters' dtype. For f32 and f64 parameters that is where the
// micro-batches of a step accumulate, and MainGrads is the flat gradient
// buffer itself. A bf16 set keeps, after UseMainGrads, a flat fp32 buffer
// beside it (Megatron-LM's main_grad): each micro-batch's backward writes
// G in bf16 (each micro-batch's gradient rounded once), AccumulateGrads
// adds it into the fp32 buffer and clears G for the next micro-batch, so
// the sum over the micro-batches is fp32, and the reduction over the
// replicas and the optimizer (with its fp32 master weights) read fp32.

// UseMainGrads gives a set of bf16 parameters its fp32 main gradients
// (zeroed), once; for f32 and f64 parameters it does nothing (their own
// gradients are the main ones). Call it after Materialize and before the
// optimizer is made: the optimizer and the gradient reduction read
// MainGrads as it is when they are made.
func (s *ParamSet) UseMainGrads() error {
	if s.g == nil {
		return errors.New("layers: UseMainGrads: the parameter set is not materialized (Materialize)")
	}
	if s.main != nil || s.g.DType() != tensor.BFloat16 {
		return nil
	}
	s.main = s.b.Zeros(tensor.Float32, s.g.Numel())
	if err := s.b.Err(); err != nil {
		s.main = nil
		return fmt.Errorf("layers: allocating the fp32 main gradients of %d parameters: %w", s.g.Numel(), err)
	}
	return nil
}

// MainGrads returns the flat (Numel) gradients the reduction and the
// optimizer read: the fp32 main gradients after UseMainGrads on a bf16
// set, else the flat gradient buffer (Flat's g). nil before Materialize.
func (s *ParamSet) MainGrads() *tensor.Tensor {
	if s.main != nil {
		return s.main
	}
	return s.g
}

// SeparateMainGrads reports whether the main gradients are a buffer of
// their own (UseMainGrads on a bf16 set), into which AccumulateGrads adds.
func (s *ParamSet) SeparateMainGrads() bool { return s.main != nil }

// AccumulateGrads moves the gradients of the flat range [lo, hi) into the
// main gradients after a micro-batch's backward: main = G there when first
// (the step's first micro-batch; the conversion to fp32 is exact), main +=
// G otherwise, then G = 0 there when clear (another micro-batch's backward
// follows). Without separate main gradients it does nothing: the backward
// already added into them. Like the ops it queues, it does not wait.
func (s *ParamSet) AccumulateGrads(lo, hi int, first, clear bool) error {
	if s.main == nil {
		return nil
	}
	if lo < 0 || hi > s.g.Numel() || lo > hi {
		return fmt.Errorf("layers: AccumulateGrads of [%d, %d), expected a range of the %d parameters", lo, hi, s.g.Numel())
	}
	if lo == hi {
		return nil
	}
	g, err := s.g.View(lo, hi-lo)
	if err != nil {
		return fmt.Errorf("layers: AccumulateGrads: %w", err)
	}
	m, err := s.main.View(lo, hi-lo)
	if err != nil {
		return fmt.Errorf("layers: AccumulateGrads: %w", err)
	}
	if first {
		s.b.Copy(m, g)
	} else {
		if s.scratch == nil || s.scratch.Numel() < hi-lo {
			if s.scratch != nil {
				s.b.Free(s.scratch)
			}
			s.scratch = s.b.Zeros(tensor.Float32, hi-lo)
		}
		t, err := s.scratch.View(0, hi-lo)
		if err != nil {
			return fmt.Errorf("layers: AccumulateGrads: %w", err)
		}
		s.b.Copy(t, g)
		s.b.Add(m, m, t)
	}
	if clear {
		s.b.Fill(g, 0)
	}
	return layerkit.Sticky(s.b, "layers", "accumulating the main gradients")
}

// mainGrads is the GradSync of a model of one rank with fp32 main
// gradients: after each micro-batch's backward, the whole gradient goes
// into them (AccumulateGrads), cleared for the next one.
type mainGrads struct {
	ps            *ParamSet
	micro, micros int // the backward in progress
}

func (g *mainGrads) BeginBackward(micro, micros int) error {
	g.micro, g.micros = micro, micros
	return nil
}

func (*mainGrads) Ready([]*Param) error { return nil }

func (g *mainGrads) EndBackward(failed error) error {
	if failed != nil {
		return failed
	}
	return g.ps.AccumulateGrads(0, g.ps.Numel(), g.micro == 0, g.micro < g.micros-1)
}
