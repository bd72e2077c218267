package ep

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Dispatcher runs the dispatch/combine protocol of one MoE layer over an EP
// group: Experts experts spread evenly over the group's P ranks, rank r
// holding experts [r·E/P, (r+1)·E/P). It holds no per-step state; each
// Dispatch returns a Handle with it.
type Dispatcher struct {
	b         tensor.Backend
	ops       tensor.MoEOps
	group     comm.Comm
	tokens    comm.Comm // the token group (SetTokenGroup); nil: the EP group
	stream    comm.Stream
	experts   int
	maxTokens int // SetMaxTokens; 0: the buffers grow to the largest step

	// The step's row buffers, persistent across steps (one step in flight).
	send, recv, back, dback, dsend, dy rowBuffer
}

// NewDispatcher returns the protocol of a layer of experts experts over
// group, whose ops the backend b queues on stream (nil on the CPU).
// experts must divide by the group size.
func NewDispatcher(b tensor.Backend, group comm.Comm, experts int, stream comm.Stream) (*Dispatcher, error) {
	if b == nil || group == nil {
		return nil, fmt.Errorf("ep: dispatcher with a nil backend or group")
	}
	P := group.Size()
	if experts <= 0 || P <= 0 || experts%P != 0 {
		return nil, fmt.Errorf("ep: %d experts over the EP group %s of %d ranks: expected a positive number of experts divisible by the group size", experts, group.Name(), P)
	}
	ops, err := tensor.MoEOpsOf(b)
	if err != nil {
		return nil, fmt.Errorf("ep: %w", err)
	}
	return &Dispatcher{b: b, ops: ops, group: group, stream: stream, experts: experts}, nil
}

// SetTokenGroup widens the step's tokens from the EP group to tokens: a
// group of Q ranks (Q a multiple of the EP group's P) that all bring
// different tokens and whose consecutive runs of P ranks are EP groups, EP
// rank = tokens.Rank() % P — comm.Grid's World when every rank holds its own
// slice of the batch. The count exchange then spans the token group, so the
// capacity, the drops (in token-group rank order) and the routing
// statistics are those of every token of the step, while the rows still
// move within the EP group only. nil restores the EP group. The group's
// shape is checked here; that its runs are the EP groups is the caller's
// promise (every rank must pass the same kind of group).
func (d *Dispatcher) SetTokenGroup(tokens comm.Comm) error {
	if tokens == nil {
		d.tokens = nil
		return nil
	}
	P, Q := d.group.Size(), tokens.Size()
	if Q < P || Q%P != 0 || tokens.Rank()%P != d.group.Rank() {
		return fmt.Errorf("ep: token group %s (rank %d of %d) over the EP group %s (rank %d of %d): expected a multiple of the EP size whose rank modulo %d is the EP rank",
			tokens.Name(), tokens.Rank(), Q, d.group.Name(), d.group.Rank(), P, P)
	}
	d.tokens = tokens
	return nil
}

// Close frees the dispatcher's persistent row buffers (an io.Closer, so
// that MoE.Close and the shadowed path release them with the layer). The
// handles of earlier steps must have been released; a later step
// allocates the buffers again. A second Close frees nothing.
func (d *Dispatcher) Close() error {
	for _, r := range []*rowBuffer{&d.send, &d.recv, &d.back, &d.dback, &d.dsend, &d.dy} {
		r.free(d.b)
	}
	return nil
}

// SetMaxTokens bounds the tokens per rank of a step: Dispatch refuses more,
// naming both numbers. The row buffers persist across steps either way;
// with a bound they never grow past max·TopK rows sent and P·max·TopK
// received.
func (d *Dispatcher) SetMaxTokens(max int) { d.maxTokens = max }

// TokenGroup is the group whose tokens make the step: the token group, or
// the EP group.
func (d *Dispatcher) TokenGroup() comm.Comm { return d.tokenGroup() }

func (d *Dispatcher) tokenGroup() comm.Comm {
	if d.tokens != nil {
		return d.tokens
	}
	return d.group
}

// LocalExperts returns the range [first, first+count) of experts this rank
// holds.
func (d *Dispatcher) LocalExperts() (first, count int) {
	count = d.experts / d.group.Size()
	return d.group.Rank() * count, count
}

// owner is the rank that holds expert e.
func (d *Dispatcher) owner(e int) int { return e / (d.experts / d.group.Size()) }

// Layout is the local routing of one step (DeepEP's dispatch layout): the
// router's choices for this rank's tokens and the counts they make, per
// expert and per destination rank. Computing it communicates nothing.
//
// Counts are of token-slots (a token sent to two experts of one rank is sent
// twice; DeepEP sends it once and lets the receiver fan it out, an
// optimisation left for the fused transport) and are taken before any
// capacity, which Dispatch applies once it knows the other ranks' counts.
type Layout struct {
	Tokens, TopK, Experts int     // N tokens of this rank, K experts per token, E experts of the group
	CapacityFactor        float64 // each expert keeps ceil(factor·tokens·K/E) slots of the group (0: dropless)
	Idx                   []int32 // (N·K) the chosen experts, row-major (N, K); kept by reference
	PerExpert             []int   // (E) slots this rank routes to each expert
	PerRank               []int   // (P) slots this rank routes to the experts of each rank
}

// Layout counts the routing of tokens tokens whose topK choices are idx
// (host int32, (N·K) row-major, from the router). capacityFactor 0 is
// dropless; otherwise each expert keeps ceil(CF·T·K/E) slots of the T tokens
// of the whole group (the token group, when set), dropping the overflow in
// group token order (rank 0's tokens first).
func (d *Dispatcher) Layout(idx []int32, tokens, topK int, capacityFactor float64) (*Layout, error) {
	E, P := d.experts, d.group.Size()
	if tokens < 0 || topK < 1 || topK > E || len(idx) != tokens*topK {
		return nil, fmt.Errorf("ep: layout of %d expert indices for %d tokens, top-%d of %d experts: expected tokens·K indices and 1 ≤ K ≤ E", len(idx), tokens, topK, E)
	}
	if !(capacityFactor >= 0) || math.IsInf(capacityFactor, 0) {
		return nil, fmt.Errorf("ep: layout: capacity factor %v, expected a finite value ≥ 0", capacityFactor)
	}
	l := &Layout{Tokens: tokens, TopK: topK, Experts: E, CapacityFactor: capacityFactor, Idx: idx,
		PerExpert: make([]int, E), PerRank: make([]int, P)}
	for i, e := range idx {
		if e < 0 || int(e) >= E {
			return nil, fmt.Errorf("ep: layout: token %d choice %d is expert %d, expected [0, %d)", i/topK, i%topK, e, E)
		}
		l.PerExpert[e]++
		l.PerRank[d.owner(int(e))]++
	}
	return l, nil
}
