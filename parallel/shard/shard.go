package shard

import (
	"fmt"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// Group names the process group a parameter is split over.
type Group uint8

const (
	// None: every rank holds the whole parameter (replicated).
	None Group = iota
	// TP: the ranks of the tensor-parallel group hold distinct slices.
	TP
	// EP: the ranks of the expert-parallel group hold distinct slices
	// (the experts of a stacked expert weight).
	EP
)

// String is "none", "tp" or "ep".
func (g Group) String() string {
	switch g {
	case None:
		return "none"
	case TP:
		return "tp"
	case EP:
		return "ep"
	}
	return fmt.Sprintf("Group(%d)", uint8(g))
}

// Shard says how a parameter of a rank relates to the parameter of the
// same name in the unsharded model: the rank holds the slice [Lo, Hi) of
// dimension Dim of the full tensor, split over the group Over, or, with
// Over = None (and Dim = -1), all of it. The TP and EP layers describe
// their parameters this way (their Shards methods); the gradient reduction
// (parallel/grads) and the merge, cut, save and load of weights here are
// driven by it.
type Shard struct {
	Param *layers.Param // this rank's parameter
	Full  tensor.Shape  // the unsharded shape
	Over  Group         // the group whose ranks hold distinct slices; None: replicated
	Dim   int           // the split dimension, or -1 when replicated
	Lo    int           // this rank's range [Lo, Hi) along Dim (0 and Full[0] when replicated)
	Hi    int           // (exclusive)
	// PartialGrad marks a replicated parameter whose gradient on each TP
	// rank covers only that rank's tokens (norm weights and row-parallel
	// biases under sequence parallelism, the router of an MoE layer over a
	// TP group): the gradients must be summed over the TP group before the
	// optimizer step.
	PartialGrad bool
}

// Replicated describes a parameter every rank holds whole; partial marks a
// gradient that covers only this TP rank's tokens (Shard.PartialGrad).
func Replicated(p *layers.Param, partial bool) Shard {
	s := Shard{Param: p, Dim: -1, PartialGrad: partial}
	if p != nil {
		s.Full = p.Shape().Clone()
		s.Hi = s.Full[0]
	}
	return s
}

// Whole describes every parameter of a model of one rank: each replicated.
func Whole(params []*layers.Param) []Shard {
	out := make([]Shard, len(params))
	for i, p := range params {
		out[i] = Replicated(p, false)
	}
	return out
}

// Replicated reports whether every rank holds the whole parameter.
func (s Shard) Replicated() bool { return s.Over == None }

// Slice is where the shard lies in the full parameter.
func (s Shard) Slice() Slice {
	if s.Replicated() {
		return Slice{Full: s.Full.Clone(), Dim: -1}
	}
	return Slice{Full: s.Full.Clone(), Dim: s.Dim, Lo: s.Lo, Hi: s.Hi}
}

// Check reports a description that does not fit its parameter: no
// parameter, a replicated one whose shape is not Full, a split one whose
// shape is not Full with Hi − Lo along Dim, or a range outside Full.
func (s Shard) Check() error {
	if s.Param == nil {
		return fmt.Errorf("shard: a description without a parameter")
	}
	shape := s.Param.Shape()
	if s.Replicated() {
		if s.Dim != -1 || !shape.Equal(s.Full) {
			return fmt.Errorf("shard: parameter %q of shape %v is described as replicated with Dim %d and full shape %v, expected Dim -1 and its own shape", s.Param.Name, shape, s.Dim, s.Full)
		}
		return nil
	}
	if s.Over != TP && s.Over != EP {
		return fmt.Errorf("shard: parameter %q is split over %v, expected none, tp or ep", s.Param.Name, s.Over)
	}
	if err := s.Slice().check(); err != nil {
		return fmt.Errorf("shard: parameter %q: %w", s.Param.Name, err)
	}
	if !s.Slice().Shape().Equal(shape) {
		return fmt.Errorf("shard: parameter %q has shape %v, but its slice [%d, %d) of dimension %d of %v has shape %v", s.Param.Name, shape, s.Lo, s.Hi, s.Dim, s.Full, s.Slice().Shape())
	}
	return nil
}

// Slice is a part of a full tensor of shape Full: the range [Lo, Hi) of
// dimension Dim, or all of it when Dim = -1.
type Slice struct {
	Full tensor.Shape `json:"full"` // the full tensor's shape
	Dim  int          `json:"dim"`  // the sliced dimension, or -1 for the whole tensor
	Lo   int          `json:"lo"`   // the range [Lo, Hi) along Dim
	Hi   int          `json:"hi"`   // (exclusive)
}

// Whole reports whether the slice is the whole tensor.
func (s Slice) Whole() bool { return s.Dim < 0 }

// Shape is the shape of the slice.
func (s Slice) Shape() tensor.Shape {
	out := s.Full.Clone()
	if !s.Whole() && s.Dim < len(out) {
		out[s.Dim] = s.Hi - s.Lo
	}
	return out
}

// Equal reports whether two slices are the same part of the same shape.
func (s Slice) Equal(o Slice) bool {
	if s.Whole() || o.Whole() {
		return s.Whole() == o.Whole() && s.Full.Equal(o.Full)
	}
	return s.Full.Equal(o.Full) && s.Dim == o.Dim && s.Lo == o.Lo && s.Hi == o.Hi
}

// check reports a slice that is not inside its full shape.
func (s Slice) check() error {
	for _, d := range s.Full {
		if d <= 0 {
			return fmt.Errorf("full shape %v, expected positive dimensions", s.Full)
		}
	}
	if len(s.Full) == 0 {
		return fmt.Errorf("a full shape with no dimensions")
	}
	if s.Whole() {
		return nil
	}
	if s.Dim >= len(s.Full) || s.Lo < 0 || s.Hi <= s.Lo || s.Hi > s.Full[s.Dim] {
		return fmt.Errorf("slice [%d, %d) of dimension %d of %v, expected a non-empty range inside it", s.Lo, s.Hi, s.Dim, s.Full)
	}
	return nil
}
