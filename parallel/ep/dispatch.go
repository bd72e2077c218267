package ep

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Handle is what one Dispatch leaves for Combine and the two backwards: the
// counts exchanged, the local routing plan and the index tensors of the
// permutations. It belongs to one step; Release gives its buffers back.
type Handle struct {
	Layout *Layout // this rank's counts, from Layout
	// Plan is this rank's routing plan: its kept slots in expert order,
	// which is also destination-rank order (rank r's experts are
	// contiguous). Capacity and drops follow the group's token order.
	Plan         *layers.RoutingPlan
	Capacity     int   // slots kept per expert over the group; 0: dropless
	GlobalTokens int   // tokens of the whole group (the token group, when set)
	GlobalRouted []int // (E) slots routed to each expert by the whole group (likewise)
	SendCounts   []int // (P) rows sent to each rank
	RecvCounts   []int // (P) rows received from each rank
	// RecvPerExpert[s][e] is the number of rows received from rank s for
	// local expert e: the received buffer holds them source by source, and
	// within a source expert by expert (each in the source's token order).
	RecvPerExpert [][]int
	ExpertCounts  []int // (local experts) rows received per local expert
	// Offsets and Bound are a device step's (DeviceOffsets): the (local
	// experts + 1) int32 expert-major row offsets on the device, and the
	// rows of the step's buffers. nil and 0 on a host-count step.
	Offsets *tensor.Tensor // (local experts + 1) int32 row offsets, on the device
	Bound   int            // the rows of the step's buffers

	cols      int
	dt        tensor.DType
	tok       *tensor.Tensor // (M_send) int32 token of each sent row
	pos       *tensor.Tensor // (N, K) int32 sent row of each slot, −1 dropped
	send      *tensor.Tensor // (M_send, C) the permuted tokens
	sortIdx   *tensor.Tensor // (M_recv) int32 received row of each expert-order row; nil: identity
	unsortIdx *tensor.Tensor // (M_recv) int32 expert-order row of each received row
	back      *tensor.Tensor // (M_send, C) expert outputs back from Combine
	dback     *tensor.Tensor // (M_send, C) CombineBackward's gradient rows
	dsend     *tensor.Tensor // (M_send, C) DispatchBackward's gradient rows
}

// SendRows is the number of rows this rank sends (its kept slots).
func (h *Handle) SendRows() int { return h.Plan.Rows() }

// RecvRows is the number of rows this rank receives for its experts.
func (h *Handle) RecvRows() int {
	n := 0
	for _, c := range h.RecvCounts {
		n += c
	}
	return n
}

// Dropped is the number of slots the whole group dropped over capacity.
func (h *Handle) Dropped() int {
	n := 0
	if h.Capacity > 0 {
		for _, r := range h.GlobalRouted {
			n += max(0, r-h.Capacity)
		}
	}
	return n
}

func (d *Dispatcher) what() string {
	return fmt.Sprintf("ep dispatch on %s rank %d", d.group.Name(), d.group.Rank())
}

// Dispatch sends the tokens x (N, C) to the experts chosen in l and returns
// the rows this rank receives for its own experts, (M_recv, C), in the
// order: source rank, then local expert, then the source's token order.
//
// It first exchanges the counts (an all-gather of every rank's per-expert
// counts and token count, which the host waits for: it sizes the buffers
// and applies the capacity in group token order), then queues the
// permutation of x into expert order on the backend, then issues the
// all-to-all of the rows and returns its Work without waiting: the caller
// waits on it (on its stream) before reading the received rows. x may be
// reused as soon as Dispatch returns (its rows have been copied). The
// received rows and the handle's rows are views of the dispatcher's
// persistent buffers: valid until the next Dispatch, never freed by the
// caller.
func (d *Dispatcher) Dispatch(x *tensor.Tensor, l *Layout) (*tensor.Tensor, *Handle, comm.Work, error) {
	if l == nil || x == nil {
		return nil, nil, nil, fmt.Errorf("%s: nil input or layout", d.what())
	}
	s := x.Shape()
	if len(s) != 2 || s[0] != l.Tokens || l.Experts != d.experts {
		return nil, nil, nil, fmt.Errorf("%s: input %v and a layout of %d tokens over %d experts: expected (%d, C) over %d experts", d.what(), x, l.Tokens, l.Experts, l.Tokens, d.experts)
	}
	if x.Device() != d.b.Device() || !x.DType().IsFloat() {
		return nil, nil, nil, fmt.Errorf("%s: input %v, expected a float tensor on %v", d.what(), x, d.b.Device())
	}
	E, P, me := d.experts, d.group.Size(), d.group.Rank()
	// 1. Exchange the counts: (Q, E+1), row q = token-group rank q's
	// per-expert slots and its token count (Q = P without a token group).
	counts, err := d.exchangeCounts(l)
	if err != nil {
		return nil, nil, nil, err
	}
	// The bound is checked on the exchanged counts, so that every rank
	// refuses the step together (a rank that refused alone would leave the
	// others waiting in the exchange).
	if d.maxTokens > 0 {
		over, who := -1, ""
		if me := d.tokenGroup().Rank(); counts[me][E] > d.maxTokens {
			over, who = me, "this rank" // name this rank's own count first
		}
		for q := range counts {
			if over < 0 && counts[q][E] > d.maxTokens {
				over, who = q, fmt.Sprintf("token-group rank %d", q)
			}
		}
		if over >= 0 {
			return nil, nil, nil, fmt.Errorf("%s: %d tokens on %s, expected at most %d (the maximum tokens per rank the expert path's buffers are sized for: ep.Parallel.MaxTokens)", d.what(), counts[over][E], who, d.maxTokens)
		}
	}
	h, err := PlanStep(l, counts, P, me, d.tokenGroup().Rank())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", d.what(), err)
	}
	h.cols, h.dt = s[1], x.DType()
	_, local := d.LocalExperts()

	// 3. Permute into expert (= destination) order and send.
	mSend, mRecv, C := h.SendRows(), h.RecvRows(), s[1]
	h.tok = d.ints(h.Plan.TokenOf(), mSend)
	h.pos = d.ints(h.Plan.Pos, l.Tokens, l.TopK)
	h.makeSort(d, local)
	h.send = d.send.get(d.b, h.dt, mSend, C)
	d.ops.GatherRows(h.send, x, h.tok, nil)
	recv := d.recv.get(d.b, h.dt, mRecv, C)
	if err := d.b.Err(); err != nil {
		d.Release(h)
		return nil, nil, nil, fmt.Errorf("%s: %w", d.what(), err)
	}
	w, err := overlap.AllToAllForward(d.b, d.group, recv, h.send, h.SendCounts, h.RecvCounts, d.stream)
	if err != nil {
		d.Release(h)
		return nil, nil, nil, fmt.Errorf("%s: %w", d.what(), err)
	}
	return recv, h, w, nil
}

// exchangeCounts all-gathers every rank's per-expert counts and token count
// over the token group (the EP group unless SetTokenGroup widened it) and
// waits for them (the host needs them).
func (d *Dispatcher) exchangeCounts(l *Layout) ([][]int, error) {
	g := d.tokenGroup()
	E, P := d.experts, g.Size()
	mine := make([]int32, E+1)
	for e, c := range l.PerExpert {
		mine[e] = int32(c)
	}
	mine[E] = int32(l.Tokens)
	all := tensor.MustHost(tensor.Int32, P, E+1)
	if P == 1 {
		copy(all.I32(), mine)
	} else {
		src, dst := d.b.Zeros(tensor.Int32, 1, E+1), d.b.Zeros(tensor.Int32, P, E+1)
		defer d.b.Free(src)
		defer d.b.Free(dst)
		h, _ := tensor.FromInt32(mine, 1, E+1)
		d.b.Upload(src, h)
		if err := d.b.Err(); err != nil {
			return nil, fmt.Errorf("%s: counts: %w", d.what(), err)
		}
		w, err := overlap.SequenceGatherForward(d.b, g, dst, src, d.stream) // the all-gather of rows
		if err == nil {
			err = w.Wait(d.stream)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: exchanging the counts: %w", d.what(), err)
		}
		d.b.Download(all, dst)
		if err := d.b.Sync(); err != nil {
			return nil, fmt.Errorf("%s: counts: %w", d.what(), err)
		}
	}
	counts := make([][]int, P)
	for r := range counts {
		counts[r] = make([]int, E+1)
		for e := range E + 1 {
			counts[r][e] = int(all.I32()[r*(E+1)+e])
		}
	}
	return counts, nil
}

// ints uploads vals as an int32 tensor of the given shape.
func (d *Dispatcher) ints(vals []int32, shape ...int) *tensor.Tensor {
	t := d.b.Zeros(tensor.Int32, shape...)
	h, err := tensor.FromInt32(vals, shape...)
	if err != nil {
		panic("ep: internal error: " + err.Error())
	}
	d.b.Upload(t, h)
	return t
}

// makeSort builds the permutations between the received order (source,
// expert) and expert order (expert, source): within an expert, rows stay in
// source-rank order, then in each source's token order, which is the token
// order of the whole group.
func (h *Handle) makeSort(d *Dispatcher, local int) {
	P := len(h.RecvCounts)
	off := make([][]int, P) // start of (source, expert) in received order
	o := 0
	for s := range P {
		off[s] = make([]int, local)
		for e := range local {
			off[s][e] = o
			o += h.RecvPerExpert[s][e]
		}
	}
	sortIdx, unsort := make([]int32, o), make([]int32, o)
	identity := true
	i := 0
	for e := range local {
		for s := range P {
			for j := range h.RecvPerExpert[s][e] {
				r := off[s][e] + j
				sortIdx[i], unsort[r] = int32(r), int32(i)
				identity = identity && r == i
				i++
			}
		}
	}
	if !identity {
		h.sortIdx = d.ints(sortIdx, o)
		h.unsortIdx = d.ints(unsort, o)
	}
}

// SortByExpert writes the received rows recv (M_recv, C) into dst
// (M_recv, C) in expert order: local expert 0's rows first (from every
// source, in group token order), the layout Experts.Forward wants with
// counts h.ExpertCounts.
func (d *Dispatcher) SortByExpert(dst, recv *tensor.Tensor, h *Handle) {
	d.permute(dst, recv, h.sortIdx)
}

// UnsortByExpert is SortByExpert's inverse: rows in expert order back to the
// received order (for Combine, and for DispatchBackward's input).
func (d *Dispatcher) UnsortByExpert(dst, src *tensor.Tensor, h *Handle) {
	d.permute(dst, src, h.unsortIdx)
}

func (d *Dispatcher) permute(dst, src, idx *tensor.Tensor) {
	if idx == nil {
		if dst != src {
			d.b.Copy(dst, src)
		}
		return
	}
	d.ops.GatherRows(dst, src, idx, nil)
}

// Combine returns the expert outputs y (M_recv, C), in the received order,
// to the ranks their tokens came from (the reverse all-to-all) and writes
// out (N, C) = Σ_j weights[n, j]·y[slot (n, j)], skipping dropped slots.
// weights (N, K) are the router's. It waits for the all-to-all on its
// stream (the sum consumes it) and queues the sum there, so out is ready
// in stream order when it returns; on the CPU it is ready.
func (d *Dispatcher) Combine(out, y, weights *tensor.Tensor, h *Handle) error {
	if err := d.checkRows("expert output y", y, h.RecvRows(), h); err != nil {
		return err
	}
	if err := d.checkRows("output", out, h.Layout.Tokens, h); err != nil {
		return err
	}
	if h.back == nil {
		h.back = d.back.get(d.b, h.dt, h.SendRows(), h.cols)
	}
	if err := d.wait(overlap.AllToAllBackward(d.b, d.group, h.back, y, h.SendCounts, h.RecvCounts, d.stream)); err != nil {
		return fmt.Errorf("%s: combine: %w", d.what(), err)
	}
	d.ops.CombineRows(out, h.back, h.pos, weights)
	return d.sticky("combine")
}

// CombineBackward is Combine's backward: from dout (N, C) it writes
// dweights (N, K) (overwritten; nil skips it) and returns ∂L/∂y
// (M_recv, C), in the received order, sent to the ranks that hold the
// experts by the all-to-all whose Work it returns: wait on it before
// reading dy (a view of the dispatcher's buffer, like Dispatch's rows).
func (d *Dispatcher) CombineBackward(dweights, dout, weights *tensor.Tensor, h *Handle) (*tensor.Tensor, comm.Work, error) {
	if h.back == nil {
		return nil, nil, fmt.Errorf("%s: CombineBackward without a Combine of this handle", d.what())
	}
	if err := d.checkRows("output gradient", dout, h.Layout.Tokens, h); err != nil {
		return nil, nil, err
	}
	if h.dback == nil {
		h.dback = d.dback.get(d.b, h.dt, h.SendRows(), h.cols)
	}
	d.ops.CombineRowsBackward(h.dback, dweights, dout, h.back, h.pos, weights)
	dy := d.dy.get(d.b, h.dt, h.RecvRows(), h.cols)
	if err := d.sticky("combine backward"); err != nil {
		return nil, nil, err
	}
	w, err := overlap.AllToAllForward(d.b, d.group, dy, h.dback, h.SendCounts, h.RecvCounts, d.stream)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: combine backward: %w", d.what(), err)
	}
	return dy, w, nil
}

// DispatchBackward is Dispatch's backward: the gradients drecv
// (M_recv, C) of the received rows, in the received order, go back to
// their tokens' ranks (the reverse all-to-all, waited for on the stream),
// and dx (N, C) is overwritten with the sum of each token's slot
// gradients (zero for a token whose slots were all dropped).
func (d *Dispatcher) DispatchBackward(dx, drecv *tensor.Tensor, h *Handle) error {
	if err := d.checkRows("received-row gradient", drecv, h.RecvRows(), h); err != nil {
		return err
	}
	if err := d.checkRows("input gradient dx", dx, h.Layout.Tokens, h); err != nil {
		return err
	}
	if h.dsend == nil {
		h.dsend = d.dsend.get(d.b, h.dt, h.SendRows(), h.cols)
	}
	if err := d.wait(overlap.AllToAllBackward(d.b, d.group, h.dsend, drecv, h.SendCounts, h.RecvCounts, d.stream)); err != nil {
		return fmt.Errorf("%s: dispatch backward: %w", d.what(), err)
	}
	d.ops.CombineRows(dx, h.dsend, h.pos, nil)
	return d.sticky("dispatch backward")
}

// Release gives back the index tensors of a handle (a no-op for nil) and
// drops its views of the dispatcher's row buffers, which persist for the
// next step; the handle must not be used afterwards.
func (d *Dispatcher) Release(h *Handle) {
	if h == nil {
		return
	}
	for _, t := range []**tensor.Tensor{&h.tok, &h.pos, &h.sortIdx, &h.unsortIdx} {
		if *t != nil {
			d.b.Free(*t)
			*t = nil
		}
	}
	h.send, h.back, h.dback, h.dsend = nil, nil, nil, nil
}

func (d *Dispatcher) wait(w comm.Work, err error) error {
	if err != nil {
		return err
	}
	return w.Wait(d.stream)
}

func (d *Dispatcher) sticky(step string) error {
	if err := d.b.Err(); err != nil {
		return fmt.Errorf("%s: %s: %w", d.what(), step, err)
	}
	return nil
}

// checkRows checks a (rows, C) tensor of the handle's dtype on the device.
func (d *Dispatcher) checkRows(what string, t *tensor.Tensor, rows int, h *Handle) error {
	if h == nil || h.pos == nil {
		return fmt.Errorf("%s: %s: nil or released handle", d.what(), what)
	}
	if t == nil || t.Device() != d.b.Device() || t.DType() != h.dt || !t.Shape().Equal(tensor.Shape{rows, h.cols}) {
		return fmt.Errorf("%s: %s is %v, expected %v%v on %v", d.what(), what, t, h.dt, tensor.Shape{rows, h.cols}, d.b.Device())
	}
	return nil
}

// PlanStep is step 2 of the protocol on the host, shared by every
// ExpertPath whose handle is built from exchanged counts: from counts
// (Q, E+1), row q = token-group rank q's per-expert slots and its token
// count, it derives the capacity, the drops (in group token order: the
// ranks before q routed used[e] slots of expert e, so rank q keeps
// min(its slots, capacity − used[e])), and the handle's exported counts
// and routing plan, for EP rank me of P whose token-group rank is tq
// (token-group rank tq−me+r is EP rank r).
func PlanStep(l *Layout, counts [][]int, P, me, tq int) (*Handle, error) {
	E := l.Experts
	if P < 1 || E%P != 0 || me < 0 || me >= P || tq < me || tq >= len(counts) {
		return nil, fmt.Errorf("ep: plan of EP rank %d of %d (token-group rank %d of %d) over %d experts: inconsistent geometry", me, P, tq, len(counts), E)
	}
	L := E / P
	first := me * L
	h := &Handle{Layout: l, GlobalRouted: make([]int, E), SendCounts: make([]int, P), RecvCounts: make([]int, P),
		RecvPerExpert: make([][]int, P), ExpertCounts: make([]int, L)}
	for q := range counts {
		if len(counts[q]) != E+1 {
			return nil, fmt.Errorf("ep: plan: counts row %d has %d entries, expected E+1 = %d", q, len(counts[q]), E+1)
		}
		for e := range E {
			h.GlobalRouted[e] += counts[q][e]
		}
		h.GlobalTokens += counts[q][E]
	}
	h.Capacity = layerkit.Capacity(l.CapacityFactor, h.GlobalTokens, l.TopK, E)
	base := tq - me
	used := make([]int, E)
	mine := make([]int, E)
	var prior []int
	for q := range counts {
		r := q - base
		if r == me && h.Capacity > 0 {
			prior = append([]int(nil), used...)
		}
		for e := range E {
			kept := counts[q][e]
			if h.Capacity > 0 {
				kept = max(0, min(kept, h.Capacity-used[e]))
			}
			used[e] += counts[q][e]
			if r < 0 || r >= P {
				continue // another EP group's rank: only its counts matter here
			}
			owner := e / L
			if r == me {
				mine[e] = kept
				h.SendCounts[owner] += kept
			}
			if owner == me {
				if h.RecvPerExpert[r] == nil {
					h.RecvPerExpert[r] = make([]int, L)
				}
				h.RecvPerExpert[r][e-first] = kept
				h.RecvCounts[r] += kept
				h.ExpertCounts[e-first] += kept
			}
		}
	}
	var err error
	if h.Plan, err = layers.NewRoutingPlan(l.Idx, l.Tokens, l.TopK, E, h.Capacity, prior); err != nil {
		return nil, err
	}
	for e, k := range h.Plan.Kept {
		if k != mine[e] {
			return nil, fmt.Errorf("ep: internal error: expert %d keeps %d slots, the exchanged counts say %d", e, k, mine[e])
		}
	}
	return h, nil
}
