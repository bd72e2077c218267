package layers

import (
	"fmt"
	"strings"
)

// Recompute says which activations a model's forward keeps for its
// backward and which the backward recomputes (activation recompute, or
// checkpointing): fewer kept activations for more forward work in the
// backward, and the same numbers bit for bit (the recomputation is the
// forward's own ops on the same inputs).
type Recompute int

const (
	// RecomputeNone keeps every activation the backward reads.
	RecomputeNone Recompute = iota
	// RecomputeAttention drops the attention core's output (the heads'
	// attention, the output projection's input) and its log-sum-exp; the
	// backward runs the attention again from the kept rotated q, k and v
	// (Megatron-LM's selective recompute of the core attention: with a
	// fused attention kernel, which keeps no score matrix, that output is
	// what the core keeps).
	RecomputeAttention
	// RecomputeBlock keeps only each block's input (the residual stream
	// between blocks); the backward of a block runs its forward again
	// first (Megatron-LM's full recompute, one block per checkpoint). The
	// last block's activations are still there when its backward starts
	// and are not recomputed.
	RecomputeBlock
)

// recomputeNames are the modes' names, as --recompute takes them.
var recomputeNames = []string{"none", "attention", "block"}

// String is the mode's name, as ParseRecompute takes it.
func (r Recompute) String() string {
	if r >= 0 && int(r) < len(recomputeNames) {
		return recomputeNames[r]
	}
	return fmt.Sprintf("recompute(%d)", int(r))
}

// ParseRecompute returns the mode of a name: none, attention or block.
func ParseRecompute(s string) (Recompute, error) {
	for i, n := range recomputeNames {
		if s == n {
			return Recompute(i), nil
		}
	}
	return 0, fmt.Errorf("layers: recompute %q, expected one of %s", s, strings.Join(recomputeNames, ", "))
}

// SetRecompute sets what the forwards keep (Recompute), for the blocks
// and their layers that share the model's buffers (this package's, and
// the other packages' cores that ShareKept): their kept activations that
// the mode drops go into buffers shared by all blocks, and the backward
// recomputes them. Call it before the first forward.
func (d *Decoder) SetRecompute(r Recompute) error {
	if r < RecomputeNone || r > RecomputeBlock {
		return fmt.Errorf("%s: %v, expected none, attention or block", d.p.What, r)
	}
	d.recompute = r
	for _, blk := range d.p.Blocks {
		if blk.kept != nil {
			blk.kept.mode = r
		}
	}
	return nil
}

// Recompute returns the mode SetRecompute set.
func (d *Decoder) Recompute() Recompute { return d.recompute }
