package layers

import (
	"fmt"
)

// RoutingPlan is the host-side table of one MoE forward: where each
// token-slot goes in the expert-contiguous buffer of rows that the expert
// GEMMs read. Slot s = n·K + j is choice j of token n.
//
// Rows are grouped by expert (expert 0's rows first), and within an expert
// ordered by token. With a capacity, each expert keeps at most Capacity
// slots over all the tokens of the step; the overflow is dropped in token
// order (the latest tokens lose their slot) and contributes zero to the
// output.
//
// The table is built on the host from the router's top-k indices (a GPU
// backend downloads them, N·K int32: the counts are needed on the host
// anyway, to size the GEMMs and the all-to-all).
type RoutingPlan struct {
	Tokens, TopK, Experts int     // N tokens, K experts each, E experts
	Capacity              int     // slots kept per expert; 0: dropless
	Routed                []int   // (E) slots routed to each expert, before the capacity
	Kept                  []int   // (E) slots kept
	Order                 []int32 // (M) the slot s = n·K + j of each row
	Pos                   []int32 // (N·K) the row of each slot, −1 when dropped
}

// NewRoutingPlan builds the plan of tokens tokens from idx (tokens·topK
// expert indices, row-major (N, K), each in [0, experts) and distinct within
// a token). capacity 0 is dropless. used, when not nil, gives for each
// expert the capacity already taken by tokens that come before these (the
// tokens of lower ranks of an expert-parallel group), so that dropping
// follows the order of the whole step.
func NewRoutingPlan(idx []int32, tokens, topK, experts, capacity int, used []int) (*RoutingPlan, error) {
	if tokens < 0 || topK < 1 || experts < topK || capacity < 0 {
		return nil, fmt.Errorf("layers: routing plan of %d tokens, top-%d of %d experts, capacity %d: expected tokens ≥ 0, 1 ≤ K ≤ E, capacity ≥ 0", tokens, topK, experts, capacity)
	}
	if len(idx) != tokens*topK {
		return nil, fmt.Errorf("layers: routing plan: %d expert indices, expected tokens·K = %d·%d", len(idx), tokens, topK)
	}
	if used != nil && len(used) != experts {
		return nil, fmt.Errorf("layers: routing plan: %d used capacities, expected one per expert (%d)", len(used), experts)
	}
	p := &RoutingPlan{Tokens: tokens, TopK: topK, Experts: experts, Capacity: capacity,
		Routed: make([]int, experts), Kept: make([]int, experts), Pos: make([]int32, len(idx))}
	for s, e := range idx {
		if e < 0 || int(e) >= experts {
			return nil, fmt.Errorf("layers: routing plan: token %d choice %d is expert %d, expected [0, %d)", s/topK, s%topK, e, experts)
		}
		for j := s - s%topK; j < s; j++ {
			if idx[j] == e {
				return nil, fmt.Errorf("layers: routing plan: token %d chooses expert %d twice", s/topK, e)
			}
		}
		p.Routed[e]++
		p.Pos[s] = -1
		u := p.Kept[e]
		if used != nil {
			u += used[e]
		}
		if capacity == 0 || u < capacity {
			p.Kept[e]++
			p.Pos[s] = 0 // kept; the row is set below
		}
	}
	off := p.Offsets()
	p.Order = make([]int32, off[experts])
	next := append([]int(nil), off[:experts]...)
	for s, e := range idx { // token order: rows of one expert stay in token order
		if p.Pos[s] < 0 {
			continue
		}
		p.Pos[s] = int32(next[e])
		p.Order[next[e]] = int32(s)
		next[e]++
	}
	return p, nil
}

// Rows is the number of kept slots M, the rows of the expert buffer.
func (p *RoutingPlan) Rows() int { return len(p.Order) }

// Offsets returns the E+1 row offsets of the experts in the buffer: expert
// e has rows [off[e], off[e+1]).
func (p *RoutingPlan) Offsets() []int {
	off := make([]int, p.Experts+1)
	for e, k := range p.Kept {
		off[e+1] = off[e] + k
	}
	return off
}

// Dropped is the number of slots over capacity.
func (p *RoutingPlan) Dropped() int { return p.Tokens*p.TopK - p.Rows() }

// TokenOf returns, for each row of the buffer, its token (Order[i] / K):
// the gather index of the permutation.
func (p *RoutingPlan) TokenOf() []int32 {
	tok := make([]int32, len(p.Order))
	for i, s := range p.Order {
		tok[i] = s / int32(p.TopK)
	}
	return tok
}
