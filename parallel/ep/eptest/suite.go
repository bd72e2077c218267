package eptest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
)

// Config is what the suite asks of an implementation's constructor: the
// path of one MoE layer on this rank.
type Config struct {
	Backend tensor.Backend
	Stream  comm.Stream // the backend's stream (nil on the CPU)
	Group   comm.Comm   // the EP group
	// Tokens is the token group (ep.Dispatcher.SetTokenGroup); nil: the
	// EP group.
	Tokens  comm.Comm
	Experts int
	// The shape of every step of the path: at most MaxTokens tokens per
	// rank (what ep.Parallel.MaxTokens passes), TopK choices, rows of Cols
	// features in DType. An implementation with buffers of a fixed size
	// sizes them from these and refuses a step over MaxTokens.
	MaxTokens, TopK, Cols int
	DType                 tensor.DType
}

// NewPath builds the implementation under test. Every rank of the group
// calls it with the same Config (but its own groups and backend); it may be
// collective. A path that also implements interface{ Close() error } is
// closed at the end of each check. Return an error that wraps
// errors.ErrUnsupported for a Config the implementation does not support
// (a token group wider than the EP group, say): the check is then skipped
// and logged. The answer must be the same on every rank.
type NewPath func(Config) (ep.ExpertPath, error)

// Tolerance is the bound on ‖out − ref‖ / ‖ref‖ for the reductions
// and products (Combine, CombineBackward's rows and dweights,
// DispatchBackward) and for the adjoint identities: float64 1e-12, float32
// 1e-5, bf16 1e-2. The moves (the received rows, the sorts) are exact.
func Tolerance(dt tensor.DType) float64 { return dt.Tolerance() }

// Rank is one rank's side of a suite run. Every rank of the token group
// calls the same checks with the same arguments (its own groups, backend
// and stream), so the suite runs alike on goroutine ranks (RunLocal) and on
// process ranks (one per GPU or NVSHMEM PE).
type Rank struct {
	Group comm.Comm // the EP group
	// Tokens is the token group: nil for the EP group, or a group whose
	// consecutive runs of Group.Size() ranks are the EP groups, EP rank =
	// Tokens.Rank() % Group.Size() (comm.Grid's World over its EPGroup).
	Tokens  comm.Comm
	Backend tensor.Backend
	Stream  comm.Stream
	NewPath NewPath
	DType   tensor.DType
	// Seed makes the inputs; every rank of a run must use the same one.
	Seed uint64
	// Unbounded says the implementation grows its buffers rather than
	// refusing a step over Config.MaxTokens: CheckMaxTokens is skipped.
	Unbounded bool
	// Logf, if set, reports skipped checks.
	Logf func(format string, args ...any)
}

// Steps is the schedule of every scenario: step 0, then step 1 (other
// sizes on every rank: the persistent buffers grow or shrink), then step 0
// twice more, which must give the bits of the first (determinism).
var Steps = []int{0, 1, 0, 0}

// CheckAll runs every scenario that applies to the EP group's size, then
// CheckMaxTokens (unless Unbounded).
func (r Rank) CheckAll() error {
	for _, sc := range Scenarios() {
		if !sc.Applies(r.Group.Size()) {
			continue
		}
		if err := r.CheckScenario(sc); err != nil {
			return err
		}
	}
	if r.Unbounded {
		r.logf("eptest: %s: CheckMaxTokens skipped (Unbounded)", r.where())
		return nil
	}
	return r.CheckMaxTokens()
}

func (r Rank) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

func (r Rank) where() string {
	s := fmt.Sprintf("EP rank %d of %d", r.Group.Rank(), r.Group.Size())
	if r.Tokens != nil {
		s += fmt.Sprintf(", token rank %d of %d", r.Tokens.Rank(), r.Tokens.Size())
	}
	return fmt.Sprintf("%s, %v", s, r.DType)
}

// geometry is this rank's place: EP size and rank, token-group size and
// rank, and the token-group rank of EP rank 0 of its group.
type geometry struct{ P, me, Q, tq, base int }

func (r Rank) geometry() (geometry, error) {
	P, me := r.Group.Size(), r.Group.Rank()
	g := geometry{P: P, me: me, Q: P, tq: me}
	if r.Tokens != nil {
		g.Q, g.tq = r.Tokens.Size(), r.Tokens.Rank()
		if g.Q%P != 0 || g.tq%P != me {
			return g, fmt.Errorf("eptest: token group rank %d of %d over the EP group rank %d of %d: expected a multiple of the EP size whose rank modulo %d is the EP rank", g.tq, g.Q, me, P, P)
		}
	}
	g.base = g.tq - me
	return g, nil
}

// newPath builds a path for sc; skip reports an unsupported Config.
func (r Rank) newPath(sc Scenario, maxTokens int) (p ep.ExpertPath, closeFn func() error, skip bool, err error) {
	P := r.Group.Size()
	p, err = r.NewPath(Config{Backend: r.Backend, Stream: r.Stream, Group: r.Group, Tokens: r.Tokens,
		Experts: sc.Experts(P), MaxTokens: maxTokens, TopK: sc.TopK, Cols: sc.Cols, DType: r.DType})
	if errors.Is(err, errors.ErrUnsupported) {
		r.logf("eptest: %s: scenario %s skipped: %v", r.where(), sc.Name, err)
		return nil, nil, true, nil
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("eptest: %s: scenario %s: building the path: %w", r.where(), sc.Name, err)
	}
	if p == nil {
		return nil, nil, false, fmt.Errorf("eptest: %s: scenario %s: NewPath returned a nil path and no error", r.where(), sc.Name)
	}
	closeFn = func() error { return nil }
	if c, ok := p.(interface{ Close() error }); ok {
		closeFn = c.Close
	}
	return p, closeFn, false, nil
}

// CheckScenario runs the Steps of sc on one path, checking each step by
// CheckStep and the repeated steps' bits against the first's.
func (r Rank) CheckScenario(sc Scenario) (err error) {
	g, err := r.geometry()
	if err != nil {
		return err
	}
	if err := sc.check(g.P); err != nil {
		return err
	}
	maxTokens := 0
	for _, s := range Steps {
		for q := range g.Q {
			maxTokens = max(maxTokens, sc.Tokens(s, q))
		}
	}
	p, closeFn, skip, err := r.newPath(sc, maxTokens)
	if skip || err != nil {
		return err
	}
	defer func() {
		if cerr := closeFn(); cerr != nil && err == nil {
			err = fmt.Errorf("eptest: %s: scenario %s: closing the path: %w", r.where(), sc.Name, cerr)
		}
	}()
	first := map[int]*Outputs{}
	drops := 0
	for i, s := range Steps {
		o, err := r.CheckStep(p, sc, s)
		if err != nil {
			return fmt.Errorf("eptest: %s: scenario %s, call %d (step %d): %w", r.where(), sc.Name, i, s, err)
		}
		drops += o.Dropped
		if f, ok := first[s]; !ok {
			first[s] = o
		} else if err := f.sameBits(o); err != nil {
			return fmt.Errorf("eptest: %s: scenario %s, call %d repeats step %d with the same inputs: %w (expected identical bits: the combine and the backwards must be deterministic)", r.where(), sc.Name, i, s, err)
		}
	}
	if (sc.CapacityFactor > 0) != (drops > 0) { // the scenario table's own promise
		return fmt.Errorf("eptest: scenario %s over EP %d: %d slots dropped with capacity factor %v: the scenario does not exercise what it claims", sc.Name, g.P, drops, sc.CapacityFactor)
	}
	return nil
}

// Outputs are what one step of a path produced on this rank, downloaded.
type Outputs struct {
	Recv, Out, DWeights, DY, DX []float64
	Dropped                     int // slots the reference drops over the token group
}

func (o *Outputs) sameBits(p *Outputs) error {
	for _, c := range []struct {
		name string
		a, b []float64
	}{{"received rows", o.Recv, p.Recv}, {"combine output", o.Out, p.Out}, {"dweights", o.DWeights, p.DWeights},
		{"combine-backward rows dy", o.DY, p.DY}, {"dispatch-backward dx", o.DX, p.DX}} {
		if len(c.a) != len(c.b) {
			return fmt.Errorf("%s: %d elements, the first call had %d", c.name, len(c.b), len(c.a))
		}
		for i := range c.a {
			if math.Float64bits(c.a[i]) != math.Float64bits(c.b[i]) {
				return fmt.Errorf("%s: element %d is %v, the first call gave %v", c.name, i, c.b[i], c.a[i])
			}
		}
	}
	return nil
}

// CheckStep drives one step of the protocol by hand on path p — Layout,
// Dispatch, Wait, SortByExpert, UnsortByExpert, Combine with known expert
// outputs, CombineBackward, Wait, DispatchBackward, Release — and checks
// every result against the float64 reference of the step (every rank
// regenerates every rank's inputs from the seed):
//
//   - the layout's counts; the handle's counts, capacity, global counts and
//     plan;
//   - the received rows, exactly, in the order source rank, then local
//     expert, then the source's token order; the sorts, exactly;
//   - Combine: out[n] = Σ_j w[n, j]·y(n, j) over the kept slots (0 for a
//     token whose slots were all dropped);
//   - CombineBackward: dy(n, j) = w[n, j]·dout[n] at the experts' ranks, and
//     dweights[n, j] = ⟨dout[n], y(n, j)⟩ (0 for a dropped slot);
//   - DispatchBackward: dx[n] = Σ_j g(n, j) over the kept slots;
//   - the adjoint identities over the EP group, from the path's own
//     outputs: Σ ⟨recv, g⟩ = Σ ⟨x, dx⟩ and Σ ⟨out, dout⟩ = Σ ⟨y, dy⟩.
//
// Every output starts as NaN, so an unwritten element fails. It is
// collective over the token group.
func (r Rank) CheckStep(p ep.ExpertPath, sc Scenario, step int) (*Outputs, error) {
	g, err := r.geometry()
	if err != nil {
		return nil, err
	}
	wd, err := newWorld(r.Seed, r.DType, sc, step, g.P, g.Q)
	if err != nil {
		return nil, err
	}
	E, K, C, L := wd.E, wd.K, wd.C, wd.E/g.P
	n := wd.n[g.tq]
	o := &Outputs{Dropped: wd.dropped}

	if first, count := p.LocalExperts(); first != g.me*L || count != L {
		return nil, fmt.Errorf("LocalExperts is [%d, %d+%d), expected [%d, %d+%d) (%d experts over %d ranks)", first, first, count, g.me*L, g.me*L, L, E, g.P)
	}
	if tg := p.TokenGroup(); tg == nil || tg.Size() != g.Q || tg.Rank() != g.tq {
		return nil, fmt.Errorf("TokenGroup is %v, expected rank %d of a group of %d", describe(tg), g.tq, g.Q)
	}

	// Layout.
	idx := slices.Clone(wd.idx[g.tq])
	l, err := p.Layout(idx, n, K, sc.CapacityFactor)
	if err != nil {
		return nil, fmt.Errorf("layout: %w", err)
	}
	perExpert, perRank := make([]int, E), make([]int, g.P)
	for _, e := range idx {
		perExpert[e]++
		perRank[wd.owner(int(e))]++
	}
	if l == nil || l.Tokens != n || l.TopK != K || l.Experts != E || l.CapacityFactor != sc.CapacityFactor ||
		!slices.Equal(l.PerExpert, perExpert) || !slices.Equal(l.PerRank, perRank) {
		return nil, fmt.Errorf("layout %+v, expected %d tokens, top-%d of %d experts, capacity factor %v, per expert %v, per rank %v",
			l, n, K, E, sc.CapacityFactor, perExpert, perRank)
	}

	// Dispatch.
	x := r.upload(wd.x[g.tq])
	defer r.Backend.Free(x)
	recv, h, work, err := p.Dispatch(x, l)
	if err != nil {
		return nil, fmt.Errorf("dispatch: %w", err)
	}
	released := false
	defer func() {
		if !released {
			p.Release(h)
		}
	}()
	if h == nil || work == nil || recv == nil {
		return nil, fmt.Errorf("dispatch returned rows %v, handle %v, work %v and no error, expected all three", recv, h, work)
	}
	if err := work.Wait(r.Stream); err != nil {
		return nil, fmt.Errorf("dispatch: wait: %w", err)
	}
	if err := r.checkHandle(h, l, wd, g); err != nil {
		return nil, fmt.Errorf("handle: %w", err)
	}
	recvOrd, expOrd := wd.recvOrder(g.base, g.me), wd.expertOrder(g.base, g.me)
	M := len(recvOrd)
	recvRef := wd.rowsOf(recvOrd, wd.xRow)
	if o.Recv, err = r.exact("received rows", recv, recvRef); err != nil {
		return nil, err
	}

	// The sorts.
	sorted, unsorted := r.poisoned(M, C), r.poisoned(M, C)
	defer r.Backend.Free(sorted)
	defer r.Backend.Free(unsorted)
	p.SortByExpert(sorted, recv, h)
	if _, err := r.exact("SortByExpert", sorted, wd.rowsOf(expOrd, wd.xRow)); err != nil {
		return nil, err
	}
	p.UnsortByExpert(unsorted, sorted, h)
	if _, err := r.exact("UnsortByExpert", unsorted, recvRef); err != nil {
		return nil, err
	}

	// Combine with known expert outputs.
	yRecv := wd.rowsOf(recvOrd, wd.yRow)
	y, weights := r.upload(yRecv), r.upload(wd.w[g.tq])
	out := r.poisoned(n, C)
	defer r.Backend.Free(y)
	defer r.Backend.Free(weights)
	defer r.Backend.Free(out)
	if err := p.Combine(out, y, weights, h); err != nil {
		return nil, fmt.Errorf("combine: %w", err)
	}
	if o.Out, err = r.near("combine output", out, wd.combine(g.tq, wd.y[g.tq], &wd.w[g.tq])); err != nil {
		return nil, err
	}

	// CombineBackward.
	dout, dweights := r.upload(wd.dout[g.tq]), r.poisoned(n, K)
	defer r.Backend.Free(dout)
	defer r.Backend.Free(dweights)
	dy, work, err := p.CombineBackward(dweights, dout, weights, h)
	if err != nil {
		return nil, fmt.Errorf("combine backward: %w", err)
	}
	if dy == nil || work == nil {
		return nil, fmt.Errorf("combine backward returned rows %v, work %v and no error, expected both", dy, work)
	}
	if err := work.Wait(r.Stream); err != nil {
		return nil, fmt.Errorf("combine backward: wait: %w", err)
	}
	if o.DY, err = r.near("combine-backward rows dy", dy, wd.rowsOf(recvOrd, wd.dyRow)); err != nil {
		return nil, err
	}
	if o.DWeights, err = r.near("dweights", dweights, wd.dweights(g.tq)); err != nil {
		return nil, err
	}

	// DispatchBackward.
	gRecv := wd.rowsOf(recvOrd, wd.gRow)
	gr, dx := r.upload(gRecv), r.poisoned(n, C)
	defer r.Backend.Free(gr)
	defer r.Backend.Free(dx)
	if err := p.DispatchBackward(dx, gr, h); err != nil {
		return nil, fmt.Errorf("dispatch backward: %w", err)
	}
	if o.DX, err = r.near("dispatch-backward dx", dx, wd.combine(g.tq, wd.g[g.tq], nil)); err != nil {
		return nil, err
	}
	released = true
	p.Release(h)

	// The adjoint identities over the EP group, from the path's outputs.
	xv, doutv := wd.x[g.tq].v, wd.dout[g.tq].v
	vals := []float64{
		dot(o.Recv, gRecv.v), dot(xv, o.DX), dot(o.Out, doutv), dot(yRecv.v, o.DY),
		absDot(o.Recv, gRecv.v), absDot(xv, o.DX), absDot(o.Out, doutv), absDot(yRecv.v, o.DY),
	}
	sdt := tensor.Float32
	if r.DType == tensor.Float64 {
		sdt = tensor.Float64
	}
	if err := hostreduce.AllReduce(r.Backend, r.Group, sdt, vals, comm.Sum, r.Stream); err != nil {
		return nil, fmt.Errorf("all-reducing the inner products: %w", err)
	}
	tol := max(Tolerance(r.DType), Tolerance(sdt))
	for _, id := range []struct {
		name string
		i    int
	}{{"Σ⟨Dispatch(x), g⟩ = Σ⟨x, DispatchBackward(g)⟩", 0}, {"Σ⟨Combine(y), dout⟩ = Σ⟨y, CombineBackward(dout)⟩", 2}} {
		a, b, scale := vals[id.i], vals[id.i+1], max(vals[id.i+4], vals[id.i+5])
		if math.Abs(a-b) > tol*scale || math.IsNaN(a-b) {
			return nil, fmt.Errorf("adjoint identity %s over the EP group: %.10g vs %.10g, expected equal within %.0e of %.4g", id.name, a, b, tol, scale)
		}
	}
	return o, nil
}

// checkHandle checks the handle's exported contract against the reference.
func (r Rank) checkHandle(h *ep.Handle, l *ep.Layout, wd *world, g geometry) error {
	E, L, first := wd.E, wd.E/g.P, g.me*(wd.E/g.P)
	T := 0
	for _, n := range wd.n {
		T += n
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if h.Layout != l {
		bad("Layout is %p, expected the layout dispatched (%p)", h.Layout, l)
	}
	if h.Capacity != wd.cap {
		bad("Capacity %d, expected %d", h.Capacity, wd.cap)
	}
	if h.GlobalTokens != T {
		bad("GlobalTokens %d, expected %d", h.GlobalTokens, T)
	}
	if !slices.Equal(h.GlobalRouted, wd.routed) {
		bad("GlobalRouted %v, expected %v", h.GlobalRouted, wd.routed)
	}
	if d := h.Dropped(); d != wd.dropped {
		bad("Dropped() %d, expected %d", d, wd.dropped)
	}
	send := make([]int, g.P)
	for e := range E {
		send[wd.owner(e)] += wd.keptE[g.tq][e]
	}
	recv, perExp, expCounts := make([]int, g.P), make([][]int, g.P), make([]int, L)
	for s := range g.P {
		perExp[s] = make([]int, L)
		for e := range L {
			k := wd.keptE[g.base+s][first+e]
			perExp[s][e] = k
			recv[s] += k
			expCounts[e] += k
		}
	}
	if !slices.Equal(h.SendCounts, send) {
		bad("SendCounts %v, expected %v", h.SendCounts, send)
	}
	if !slices.Equal(h.RecvCounts, recv) {
		bad("RecvCounts %v, expected %v", h.RecvCounts, recv)
	}
	if !slices.EqualFunc(h.RecvPerExpert, perExp, slices.Equal[[]int]) {
		bad("RecvPerExpert %v, expected %v", h.RecvPerExpert, perExp)
	}
	if !slices.Equal(h.ExpertCounts, expCounts) {
		bad("ExpertCounts %v, expected %v", h.ExpertCounts, expCounts)
	}
	if h.Plan == nil {
		bad("Plan is nil, expected this rank's routing plan")
	} else {
		kept := wd.kept[g.tq]
		pos := true
		for s, v := range h.Plan.Pos {
			pos = pos && s < len(kept) && (v >= 0) == kept[s]
		}
		if h.Plan.Capacity != wd.cap || !slices.Equal(h.Plan.Kept, wd.keptE[g.tq]) || len(h.Plan.Pos) != len(kept) || !pos {
			bad("Plan (capacity %d, kept %v, pos %v), expected capacity %d, kept %v, pos ≥ 0 exactly at the kept slots %v",
				h.Plan.Capacity, h.Plan.Kept, h.Plan.Pos, wd.cap, wd.keptE[g.tq], kept)
		} else {
			sendRows := 0
			for _, k := range send {
				sendRows += k
			}
			if h.SendRows() != sendRows {
				bad("SendRows() %d, expected %d", h.SendRows(), sendRows)
			}
		}
	}
	if m := len(wd.recvOrder(g.base, g.me)); h.RecvRows() != m {
		bad("RecvRows() %d, expected %d", h.RecvRows(), m)
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// CheckMaxTokens builds a path with Config.MaxTokens = 4 and checks that a
// step of more tokens (every rank over the bound, so that no rank is left
// in a collective) is refused with an error naming both numbers, and that
// the path then still runs a step within the bound (CheckStep).
func (r Rank) CheckMaxTokens() (err error) {
	const bound = 4
	g, err := r.geometry()
	if err != nil {
		return err
	}
	over := Scenario{Name: "max-tokens-over", LocalExperts: 2, TopK: 2, Cols: 6, Favour: -1, MinTokens: bound + 1, Spread: 3}
	within := over
	within.Name, within.MinTokens, within.Spread = "max-tokens-within", bound-2, 3
	p, closeFn, skip, err := r.newPath(over, bound)
	if skip || err != nil {
		return err
	}
	defer func() {
		if cerr := closeFn(); cerr != nil && err == nil {
			err = fmt.Errorf("eptest: %s: max tokens: closing the path: %w", r.where(), cerr)
		}
	}()
	wd, err := newWorld(r.Seed, r.DType, over, 0, g.P, g.Q)
	if err != nil {
		return err
	}
	n := wd.n[g.tq]
	l, err := p.Layout(wd.idx[g.tq], n, over.TopK, 0)
	if err != nil {
		return fmt.Errorf("eptest: %s: max tokens: layout of %d tokens: %w (expected the bound to be applied by Dispatch)", r.where(), n, err)
	}
	x := r.upload(wd.x[g.tq])
	defer r.Backend.Free(x)
	_, h, work, err := p.Dispatch(x, l)
	if err == nil {
		if work != nil {
			_ = work.Wait(r.Stream)
		}
		p.Release(h)
		return fmt.Errorf("eptest: %s: max tokens: a step of %d tokens on a path bounded to %d was accepted, expected an error naming both numbers", r.where(), n, bound)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprint(n)) || !strings.Contains(msg, fmt.Sprint(bound)) {
		return fmt.Errorf("eptest: %s: max tokens: refusing %d tokens over a bound of %d: %q, expected an error naming both numbers", r.where(), n, bound, msg)
	}
	for s := range 2 {
		if _, err := r.CheckStep(p, within, s); err != nil {
			return fmt.Errorf("eptest: %s: max tokens: a step of %d tokens within the bound %d after a refused one: %w", r.where(), within.Tokens(s, g.tq), bound, err)
		}
	}
	return nil
}

func describe(c comm.Comm) string {
	if c == nil {
		return "nil"
	}
	return fmt.Sprintf("%s (rank %d of %d)", c.Name(), c.Rank(), c.Size())
}

func (r Rank) upload(m mat) *tensor.Tensor {
	return testutil.Upload(r.Backend, r.DType, m.v, m.r, m.c)
}

// poisoned is an output tensor filled with NaN, so an unwritten element
// fails the check.
func (r Rank) poisoned(rows, cols int) *tensor.Tensor {
	return testutil.Poisoned(r.Backend, r.DType, rows, cols)
}

func (r Rank) download(name string, t *tensor.Tensor, ref mat) ([]float64, error) {
	if t == nil {
		return nil, fmt.Errorf("%s is nil, expected %v(%d, %d)", name, r.DType, ref.r, ref.c)
	}
	if t.DType() != r.DType || !t.Shape().Equal(tensor.Shape{ref.r, ref.c}) {
		return nil, fmt.Errorf("%s is %v, expected %v(%d, %d)", name, t, r.DType, ref.r, ref.c)
	}
	if err := r.Backend.Sync(); err != nil {
		return nil, err
	}
	h := tensor.MustHost(r.DType, t.Shape()...)
	r.Backend.Download(h, t)
	if err := r.Backend.Sync(); err != nil {
		return nil, err
	}
	return h.Float64s()
}

// exact checks a tensor the path only moves: every element equals the
// reference's (which is representable in the dtype).
func (r Rank) exact(name string, t *tensor.Tensor, ref mat) ([]float64, error) {
	got, err := r.download(name, t, ref)
	if err != nil {
		return nil, err
	}
	for i, v := range got {
		if v != ref.v[i] || math.IsNaN(v) {
			return nil, fmt.Errorf("%s: row %d column %d is %v, expected %v (rows are moved, not computed: exact)", name, i/ref.c, i%ref.c, v, ref.v[i])
		}
	}
	return got, nil
}

// near checks ‖t − ref‖ / ‖ref‖ against the dtype's tolerance (exactly 0
// for a zero reference); a NaN or Inf (an unwritten element) never passes.
func (r Rank) near(name string, t *tensor.Tensor, ref mat) ([]float64, error) {
	got, err := r.download(name, t, ref)
	if err != nil {
		return nil, err
	}
	var num, den float64
	for i, v := range got {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%s: row %d column %d is %v (unwritten or overflowed), expected %.6g", name, i/ref.c, i%ref.c, v, ref.v[i])
		}
		d := v - ref.v[i]
		num += d * d
		den += ref.v[i] * ref.v[i]
	}
	if den == 0 {
		if num != 0 {
			return nil, fmt.Errorf("%s: ‖error‖ %.3g, expected exactly 0 (every slot dropped or none received)", name, math.Sqrt(num))
		}
		return got, nil
	}
	if rel := math.Sqrt(num / den); rel > Tolerance(r.DType) {
		return nil, fmt.Errorf("%s: relative error %.3g, expected ≤ %.0e", name, rel, Tolerance(r.DType))
	}
	return got, nil
}
