package peerep

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/peerep/internal/dispatch"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Option configures a Path.
type Option func(*Path)

// WithDeadline bounds every wait on a peer's signal (default
// dispatch.DefaultDeadline): a peer still silent after d fails the
// step with an error naming it.
func WithDeadline(d time.Duration) Option { return func(p *Path) { p.deadline = d } }

// WithBeforeWait runs f before every wait on the peers is queued: the
// multi-rank emulator tests make it a barrier of the emulated ranks (whose
// kernels run one at a time), so no emulated wait ever spins.
func WithBeforeWait(f func()) Option { return func(p *Path) { p.beforeWait = f } }

// Path is the pipelined ep.ExpertPath over symmetric memory (see the
// package documentation): one MoE layer's dispatch and combine on this
// rank. One step is in flight at a time.
type Path struct {
	b         *cudabackend.Backend
	group     comm.Comm
	tokens    comm.Comm
	sm        comm.SymmetricMemory
	experts   int
	maxTokens int
	name      string

	deadline   time.Duration
	beforeWait func()

	eng     *dispatch.Engine
	sym     [dispatch.NumBufs]*tensor.Tensor
	recv    *tensor.Tensor // (R, C) received rows, received order
	dy      *tensor.Tensor // (R, C) CombineBackward's rows, received order
	idx     *tensor.Tensor // (max(N, 1), K) the step's expert ids
	cur     *ep.Handle
	rows    int   // the current step's received rows
	broken  error // a failed wait: the peers' epochs are out of step for good
	topK    int
	cols    int
	dt      tensor.DType
	combine bool

	fused       bool           // the fused strategy's path (Expert.Fused)
	streamHooks bool           // WithStreamHooks
	sent        *tensor.Tensor // the expert output whose combine send the down GEMM's hook queued
	sentG       *tensor.Tensor // the expert rows' gradient whose send the backward's DX hook queued
	nFwd, nBwd  int            // hooked forward and backward steps (FusedSteps)
}

var _ ep.ExpertPath = (*Path)(nil)

// New builds the path of one layer: c.Backend the CUDA backend, c.Group an
// EP group with symmetric memory, c.MaxTokens > 0. Every rank of the group
// builds it with the same configuration. Nothing is allocated until the
// first Dispatch.
func New(c ep.ExpertConfig, opts ...Option) (*Path, error) {
	b, sm, err := env(c.Backend, c.Group, c.Name, c.MaxTokens)
	if err != nil {
		return nil, err
	}
	P := c.Group.Size()
	if c.Experts <= 0 || c.Experts%P != 0 {
		return nil, fmt.Errorf("peerep: %d experts over the EP group %s of %d ranks: expected a positive multiple of the group size", c.Experts, c.Group.Name(), P)
	}
	if t := c.Tokens; t != nil && (t.Size() != P || t.Rank() != c.Group.Rank()) {
		return nil, fmt.Errorf("peerep: token group %s (%d ranks) wider than the EP group %s (%d ranks): the pipelined expert path exchanges counts within the EP group only (%w)",
			t.Name(), t.Size(), c.Group.Name(), P, errors.ErrUnsupported)
	}
	p := &Path{b: b, group: c.Group, tokens: c.Tokens, sm: sm, experts: c.Experts, maxTokens: c.MaxTokens, name: c.Name}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

func (p *Path) what() string {
	return fmt.Sprintf("peerep dispatch %q on %s rank %d", p.name, p.group.Name(), p.group.Rank())
}

// LocalExperts is [r·E/P, (r+1)·E/P).
func (p *Path) LocalExperts() (first, count int) {
	count = p.experts / p.group.Size()
	return p.group.Rank() * count, count
}

// TokenGroup is the EP group (or the identical token group given).
func (p *Path) TokenGroup() comm.Comm {
	if p.tokens != nil {
		return p.tokens
	}
	return p.group
}

// Layout counts the routing on the host (the Handle's contract; the device
// lays it out again from the uploaded ids).
func (p *Path) Layout(idx []int32, tokens, topK int, capacityFactor float64) (*ep.Layout, error) {
	E, P := p.experts, p.group.Size()
	if tokens < 0 || topK < 1 || topK > E || len(idx) != tokens*topK {
		return nil, fmt.Errorf("ep: layout of %d expert indices for %d tokens, top-%d of %d experts: expected tokens·K indices and 1 ≤ K ≤ E", len(idx), tokens, topK, E)
	}
	if !(capacityFactor >= 0) || math.IsInf(capacityFactor, 0) {
		return nil, fmt.Errorf("ep: layout: capacity factor %v, expected a finite value ≥ 0", capacityFactor)
	}
	l := &ep.Layout{Tokens: tokens, TopK: topK, Experts: E, CapacityFactor: capacityFactor, Idx: idx,
		PerExpert: make([]int, E), PerRank: make([]int, P)}
	for i, e := range idx {
		if e < 0 || int(e) >= E {
			return nil, fmt.Errorf("ep: layout: token %d choice %d is expert %d, expected [0, %d)", i/topK, i%topK, e, E)
		}
		l.PerExpert[e]++
		l.PerRank[int(e)/(E/P)]++
	}
	return l, nil
}

// ensure (re)builds the symmetric buffers and the device path for top-k
// K, width C and dtype dt: a world collective, reached by every rank at
// the same Dispatch.
func (p *Path) ensure(K, C int, dt tensor.DType) error {
	if p.eng != nil && p.topK == K && p.cols == C && p.dt == dt {
		return nil
	}
	if err := p.release(); err != nil {
		return err
	}
	if p.fused && !p.streamHooks && dt != tensor.BFloat16 {
		return fmt.Errorf("%s: fused expert path: tensors are %v, expected bf16 (the grouped GEMM engine's operands)", p.what(), dt)
	}
	P, me := p.group.Size(), p.group.Rank()
	cfg := dispatch.Config{Ranks: P, Rank: me, Experts: p.experts, TopK: K, Cols: C, MaxTokens: p.maxTokens,
		DType: dt, Deadline: p.deadline, Fused: p.fused}
	var peers [dispatch.NumBufs][]uint64
	for i, s := range dispatch.SymmetricShapes(cfg) {
		t, err := p.sm.AllocSymmetric(s.Shape, s.DType)
		if err != nil {
			return fmt.Errorf("%s: symmetric buffer %v%v: %w", p.what(), s.DType, s.Shape, err)
		}
		p.sym[i] = t
		peers[i] = make([]uint64, P)
		for r := range P {
			if peers[i][r], err = p.sm.PeerPtr(t, r); err != nil {
				return fmt.Errorf("%s: %w", p.what(), err)
			}
		}
	}
	eng, err := dispatch.New(p.b, cfg, p.sym, peers)
	if err != nil {
		return fmt.Errorf("%s: %w", p.what(), err)
	}
	eng.BeforeWait = p.beforeWait
	p.eng, p.topK, p.cols, p.dt = eng, K, C, dt
	R := max(eng.RecvBound(), 1)
	p.recv, p.dy = p.b.Zeros(dt, R, C), p.b.Zeros(dt, R, C)
	// Every rank's signals and header are zero before any rank signals.
	if err := p.b.Sync(); err != nil {
		return fmt.Errorf("%s: %w", p.what(), err)
	}
	if err := p.group.Barrier(); err != nil {
		return fmt.Errorf("%s: after clearing the signals: %w", p.what(), err)
	}
	return nil
}

// release frees the device path and its symmetric buffers (a world
// collective), after draining the device.
func (p *Path) release() error {
	if p.eng == nil && p.sym[0] == nil {
		return nil
	}
	if err := p.b.Sync(); err != nil { // every kernel of the path is on the backend's stream
		return fmt.Errorf("%s: before freeing the buffers: %w", p.what(), err)
	}
	if p.eng != nil {
		p.eng.Close()
		p.eng = nil
	}
	for _, t := range []*tensor.Tensor{p.recv, p.dy, p.idx} {
		if t != nil {
			p.b.Free(t)
		}
	}
	p.recv, p.dy, p.idx = nil, nil, nil
	var errs []error
	for i, t := range p.sym {
		if t != nil {
			errs = append(errs, p.sm.FreeSymmetric(t))
			p.sym[i] = nil
		}
	}
	return errors.Join(errs...)
}

// Close frees the path's buffers (collective: every rank closes).
func (p *Path) Close() error { return p.release() }

func (p *Path) view(t *tensor.Tensor, rows int) *tensor.Tensor {
	v, err := t.Rows(0, rows)
	if err != nil {
		panic("peerep: internal error: " + err.Error())
	}
	return v
}

// Dispatch sends x (N, C) to the experts of l and returns the received
// rows in ep.ExpertPath's order (source rank, local expert, token order).
// The rows are moved by the kernels; the host then reads the exchanged
// counts once (the Handle's contract), so the returned Work is done.
func (p *Path) Dispatch(x *tensor.Tensor, l *ep.Layout) (*tensor.Tensor, *ep.Handle, comm.Work, error) {
	if p.broken != nil {
		return nil, nil, nil, fmt.Errorf("%s: an earlier step failed: %w", p.what(), p.broken)
	}
	if l == nil || x == nil {
		return nil, nil, nil, fmt.Errorf("%s: nil input or layout", p.what())
	}
	s := x.Shape()
	if len(s) != 2 || s[0] != l.Tokens || l.Experts != p.experts || x.Device() != p.b.Device() {
		return nil, nil, nil, fmt.Errorf("%s: input %v and a layout of %d tokens over %d experts: expected (%d, C) on %v over %d experts", p.what(), x, l.Tokens, l.Experts, l.Tokens, p.b.Device(), p.experts)
	}
	N, K, C := s[0], l.TopK, s[1]
	if err := p.ensure(K, C, x.DType()); err != nil {
		return nil, nil, nil, err
	}
	p.cur, p.combine, p.sent, p.sentG = nil, false, nil, nil
	if p.idx == nil || p.idx.Dim(0) < max(N, 1) {
		if p.idx != nil {
			p.b.Free(p.idx)
		}
		p.idx = p.b.Zeros(tensor.Int32, max(N, 1, p.maxTokens), K)
	}
	idx := p.view(p.idx, N)
	if N > 0 {
		h, _ := tensor.FromInt32(l.Idx, N, K)
		p.b.Upload(idx, h)
	}
	if err := p.eng.DispatchSend(x, idx, l.CapacityFactor); err != nil {
		return nil, nil, nil, p.fail(err)
	}
	if err := p.eng.DispatchRecv(p.recv, 1); err != nil {
		return nil, nil, nil, p.fail(err)
	}
	counts, err := p.eng.ReadCounts()
	if err != nil {
		return nil, nil, nil, p.fail(err)
	}
	P, me, E := p.group.Size(), p.group.Rank(), p.experts
	if counts.Refused >= 0 {
		over, who := counts.Refused, fmt.Sprintf("EP rank %d", counts.Refused)
		n := counts.Over
		if N > p.maxTokens {
			over, who, n = me, "this rank", N
		}
		_ = over
		p.eng.Release()
		return nil, nil, nil, fmt.Errorf("%s: %d tokens on %s, expected at most %d (the maximum tokens per rank the expert path's buffers are sized for: ep.Parallel.MaxTokens)", p.what(), n, who, p.maxTokens)
	}
	rows := make([][]int, P)
	for q := range P {
		rows[q] = counts.Header[q][:E+1]
	}
	h, err := ep.PlanStep(l, rows, P, me, me)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", p.what(), err)
	}
	if h.RecvRows() != counts.Rows {
		return nil, nil, nil, p.fail(fmt.Errorf("internal error: the device kept %d rows for this rank, the host plan %d", counts.Rows, h.RecvRows()))
	}
	p.cur, p.rows = h, counts.Rows
	return p.view(p.recv, p.rows), h, comm.Done, nil
}

// fail marks the path broken after a device-side failure (a missed
// deadline leaves the epochs of the ranks out of step).
func (p *Path) fail(err error) error {
	p.broken = err
	return fmt.Errorf("%s: %w", p.what(), err)
}

func (p *Path) checkHandle(h *ep.Handle) error {
	if p.broken != nil {
		return fmt.Errorf("%s: an earlier step failed: %w", p.what(), p.broken)
	}
	if h == nil || h != p.cur {
		return fmt.Errorf("%s: a handle that is not the current step's (released, or of another path)", p.what())
	}
	return nil
}

func (p *Path) checkRows(what string, t *tensor.Tensor, rows int) error {
	if t == nil || t.Device() != p.b.Device() || t.DType() != p.dt || !t.Shape().Equal(tensor.Shape{rows, p.cols}) {
		return fmt.Errorf("%s: %s is %v, expected %v%v on %v", p.what(), what, t, p.dt, tensor.Shape{rows, p.cols}, p.b.Device())
	}
	return nil
}

func (p *Path) permute(dst, src, idx *tensor.Tensor, h *ep.Handle) {
	if p.checkHandle(h) != nil || p.rows == 0 {
		return
	}
	p.b.GatherRows(dst, src, p.view(idx, p.rows), nil)
}

// SortByExpert writes the received rows in expert order (local expert,
// then source rank, then token order).
func (p *Path) SortByExpert(dst, recv *tensor.Tensor, h *ep.Handle) {
	p.permute(dst, recv, p.eng.RecvOfExp(), h)
}

// UnsortByExpert is SortByExpert's inverse.
func (p *Path) UnsortByExpert(dst, src *tensor.Tensor, h *ep.Handle) {
	p.permute(dst, src, p.eng.ExpOfRecv(), h)
}

// Combine sends the expert outputs y (M_recv, C), received order, to their
// tokens' homes and writes out (N, C) = Σ_j w·y over the kept slots, in
// fp32 and in choice order (deterministic).
func (p *Path) Combine(out, y, weights *tensor.Tensor, h *ep.Handle) error {
	if err := p.checkHandle(h); err != nil {
		return err
	}
	if err := p.checkRows("expert output y", y, p.rows); err != nil {
		return err
	}
	if err := p.checkRows("output", out, h.Layout.Tokens); err != nil {
		return err
	}
	if err := p.eng.CombineSend(y, 1); err != nil {
		return p.fail(err)
	}
	if err := p.eng.CombineRecv(out, weights); err != nil {
		return p.fail(err)
	}
	p.combine = true
	return nil
}

// CombineBackward sends dout once per destination rank with the routing
// weights, writes dweights at home, and returns ∂L/∂y (M_recv, C) in the
// received order (a view of the path's buffer, valid until the next
// Dispatch; the Work is done).
func (p *Path) CombineBackward(dweights, dout, weights *tensor.Tensor, h *ep.Handle) (*tensor.Tensor, comm.Work, error) {
	if err := p.checkHandle(h); err != nil {
		return nil, nil, err
	}
	if !p.combine {
		return nil, nil, fmt.Errorf("%s: CombineBackward without a Combine of this handle", p.what())
	}
	if err := p.checkRows("output gradient", dout, h.Layout.Tokens); err != nil {
		return nil, nil, err
	}
	if err := p.eng.CombineBackwardSend(dout, weights, dweights); err != nil {
		return nil, nil, p.fail(err)
	}
	if err := p.eng.CombineBackwardRecv(p.dy, 1); err != nil {
		return nil, nil, p.fail(err)
	}
	return p.view(p.dy, p.rows), comm.Done, nil
}

// DispatchBackward sends the received rows' gradients drecv (M_recv, C),
// received order, back to their tokens and writes dx (N, C) = the sum of
// each token's slot gradients.
func (p *Path) DispatchBackward(dx, drecv *tensor.Tensor, h *ep.Handle) error {
	if err := p.checkHandle(h); err != nil {
		return err
	}
	if err := p.checkRows("received-row gradient", drecv, p.rows); err != nil {
		return err
	}
	if err := p.checkRows("input gradient dx", dx, h.Layout.Tokens); err != nil {
		return err
	}
	if err := p.eng.DispatchBackwardSend(drecv, 1); err != nil {
		return p.fail(err)
	}
	if err := p.eng.DispatchBackwardRecv(dx); err != nil {
		return p.fail(err)
	}
	return nil
}

// Release ends the step: the combine buffer is handed back to its writers.
func (p *Path) Release(h *ep.Handle) {
	if h == nil || h != p.cur || p.eng == nil {
		return
	}
	p.eng.Release()
	p.cur = nil
}

// engine is the device path (nil before the first Dispatch): its Offsets
// are the grouped expert GEMM's device offsets of the current step.
func (p *Path) engine() *dispatch.Engine { return p.eng }
