package peercopy

import (
	"fmt"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Engine builds the TP sites of the fused strategy (the registry's
// strategies.Fused picks it on a group with symmetric memory and peer
// pointers; a Builder without a name): one call of
// our GEMM engine (cudabackend.EngineMatMul) per weight, fed and drained by
// the copy engine while it runs, instead of P GEMMs of a chunk each.
//
//   - all-gather∘matmul: every peer's shard is pulled by the copy engine
//     into the gathered matrix (exchange.pullWith), and the side stream
//     raises the chunk's landed word after each pull; the engine starts on
//     this rank's own shard (RotateRows) and its producer waits on a
//     chunk's word before loading its rows (GEMMWait, with a deadline).
//   - matmul∘reduce-scatter: the engine computes the whole partial product
//     into the symmetric stage, the destinations' chunks first and this
//     rank's last, and signals each 128-row block it has stored
//     (GEMMSignal); the side stream waits on the signal words of a
//     destination's rows, publishes them, and pulls this rank's partial
//     from each peer; the partials are added in fp32 in a fixed rank order
//     (overlap.Accumulator): the same bits every run.
//
// No kernel waits on a kernel (ARCHITECTURE.md, "No deadlock by
// construction"): the engine's producer spins only on words written by
// stream memory operations after copy-engine copies, which hold no SM. On
// one GPU shared by PEs (MPS) a spinning GEMM holds every SM it has, and a
// peer's earlier kernels — which must finish before that peer publishes its
// shard — could then starve; so the compute stream first waits (a stream
// wait, no SM) until every peer has published this call's shard, and only
// then launches the engine: what the engine then waits for needs no SM.
// The scatter's engine waits on nothing. Deadlines: the gather's wait for
// the peers' publishes and the engine's chunk waits give up after Timeout,
// naming the peer; the scatter's pulls wait on stream memory operations,
// which cannot give up, so a deadline wait on the compute stream for the
// peers' publishes raises a late peer's word itself at the deadline
// (waitSignalsRaising): the pulls pass on stale rows and the
// call fails at the next Sync naming the peer.
//
// Transfer picks how the gathers' shards land (both kept so that either
// can be measured on the machine at hand): by the copy-engine pulls above (TransferPull, the default), or
// by puts (TransferPut): every rank's side stream runs a kernel of a few
// CTAs (queuePut, about the SMs the engine leaves free) that
// stores its shard into every peer's symmetric gather buffer chunk by
// chunk and raises each chunk's flag there with a release at system scope;
// the engine waits on those flags (the same hook), reading the gather
// buffer itself, and the forward then copies it into xFull (the
// matmul∘reduce-scatter backward's engine and dW read it in place). The
// same rule holds: the compute stream first waits (one warp, deadline)
// until every peer's put kernel has started, so the engine waits only for
// kernels already running; a put kernel waits only, with a deadline, for
// each destination's word that it has read the previous call's rows.
//
// The engine needs an sm_90a GPU, bf16 operands, sizes that are multiples
// of 8 and 16-byte aligned rows; a call outside that is refused with an
// error (an explicit --overlap fused is never silently something else).
// The matmul∘all-reduce sites have no fused form; the expert path's is
// parallel/ep/peerep's (peerep.Expert with Fused).
type Engine struct {
	// Timeout bounds every wait for a peer (0: 10 s): the gather's wait for
	// the peers' shards and the engine's wait for a chunk, the scatter's
	// wait for the peers' partials. A peer that never publishes makes the
	// call fail at the next Sync, naming the peer's rank.
	Timeout time.Duration
	// Transfer is how the gathers' peer shards land (the all-gather∘matmul
	// forward and the matmul∘reduce-scatter backward): TransferPull ("",
	// the default) by copy-engine pulls from the peers' stages, or
	// TransferPut by a few CTAs of every peer storing its shard into this
	// rank's symmetric gather buffer (putGather). Anything else is refused
	// by Supports and the constructors, naming the valid values.
	Transfer string
	// PutCTAs is the put kernel's grid, and then the SMs the engine leaves
	// free while it waits on the puts (0: the engine's default reserve,
	// GEMMWait.ReserveSMs, for both). Only with TransferPut.
	PutCTAs int
	// StreamHooks runs the same protocol with the engine's hooks as
	// separate work around the backend's ordinary MatMul (no overlap): a
	// one-warp wait for every chunk's flag before it (waitSignals), and
	// the row blocks' signal words raised to their final value after it
	// (ep_fill_u64). It is the form the kernel emulator runs (no TMA,
	// wgmma or mbarrier: the engine is refused there), so that the
	// transfers, flags and publishes of the fused sites are tested on the
	// CPU; the products are the backend's GEMM's. Without it the sites
	// need the GEMM engine.
	StreamHooks bool
}

var _ overlap.Builder = Engine{}

// Supports needs what Chunked needs, the GEMM engine, and a site kind
// with a fused form.
func (f Engine) Supports(sp overlap.Spec) error {
	if _, err := f.transfer(); err != nil {
		return err
	}
	_, err := f.env(sp)
	return err
}

// transfer is f.Transfer checked; an unknown one is refused (not
// ErrUnavailable: an explicit setting is never replaced by another).
func (f Engine) transfer() (string, error) {
	t, err := ParseTransfer(f.Transfer)
	if err != nil {
		return "", fmt.Errorf("peercopy.Engine: %w", err)
	}
	if f.PutCTAs < 0 || f.PutCTAs > 0 && t != TransferPut {
		return "", fmt.Errorf("peercopy.Engine: PutCTAs %d with transfer %q: expected ≥ 0, and set only with %q", f.PutCTAs, t, TransferPut)
	}
	return t, nil
}

// newPut is the put transfer of a site's gather for the checked transfer
// t (nil for the pulls).
func (f Engine) newPut(e siteEnv, t string) *putGather {
	if t != TransferPut {
		return nil
	}
	return &putGather{sp: e, ctas: f.PutCTAs}
}

// env is the site's environment, or why the site cannot be built.
func (f Engine) env(sp overlap.Spec) (siteEnv, error) {
	what := fmt.Sprintf("fused %s site %q", sp.Kind, sp.Name)
	switch sp.Kind {
	case overlap.KindAllGatherMatmul, overlap.KindMatmulReduceScatter:
	default:
		return siteEnv{}, fmt.Errorf("%s: the fused strategy has no %s form, only all-gather∘matmul and matmul∘reduce-scatter (%w)", what, sp.Kind, overlap.ErrUnavailable)
	}
	e, err := envAs(sp, what)
	if err != nil {
		return e, err
	}
	// A layer's spec may not know its dtype yet (parameters are
	// materialized later): then the call's operands are checked instead.
	if sp.DType != tensor.Invalid && sp.DType != tensor.BFloat16 {
		return e, fmt.Errorf("%s: tensors are %v, expected bf16 (the GEMM engine's operands) (%w)", what, sp.DType, overlap.ErrUnavailable)
	}
	for _, w := range append([]int{sp.K}, sp.Outs...) {
		if w%8 != 0 {
			return e, fmt.Errorf("%s: width %d, expected multiples of 8 (K %d, outputs %v: the engine's 16-byte rows) (%w)", what, w, sp.K, sp.Outs, overlap.ErrUnavailable)
		}
	}
	if err := e.b.EngineErr(); err != nil && !f.StreamHooks {
		return e, fmt.Errorf("%s: %v (%w)", what, err, overlap.ErrUnavailable)
	}
	e.what, e.hooks = what, f.StreamHooks
	return e, nil
}

func (f Engine) timeout() time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return 10 * time.Second
}

// NewAllGatherMatmul builds the entry site.
func (f Engine) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	t, err := f.transfer()
	if err != nil {
		return nil, err
	}
	e, err := f.env(sp)
	if err != nil {
		return nil, err
	}
	if e, err = newSide(e); err != nil {
		return nil, err
	}
	return &fagmm{agmm: agmm{sp: sp, e: e, fwd: &exchange{sp: e, slots: 1}, bwd: &exchange{sp: e, slots: sp.Group.Size()}},
		timeout: f.timeout(), put: f.newPut(e, t)}, nil
}

// NewMatmulReduceScatter builds the exit site.
func (f Engine) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	t, err := f.transfer()
	if err != nil {
		return nil, err
	}
	e, err := f.env(sp)
	if err != nil {
		return nil, err
	}
	if e, err = newSide(e); err != nil {
		return nil, err
	}
	return &fmmrs{mmrs: mmrs{sp: sp, e: e, fwd: &exchange{sp: e, slots: sp.Group.Size()}, bwd: &exchange{sp: e, slots: 1}},
		timeout: f.timeout(), put: f.newPut(e, t)}, nil
}

// NewMatmulAllReduce: no fused form.
func (f Engine) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	if _, err := f.transfer(); err != nil {
		return nil, err
	}
	_, err := f.env(sp)
	return nil, err
}

// engineFits refuses, before any work, a call the engine cannot run
// (with stream hooks: operands other than the engine's bf16).
func engineFits(e siteEnv, c, a, w *tensor.Tensor, transA, transB bool) error {
	if e.hooks {
		for _, t := range []*tensor.Tensor{c, a, w} {
			if t.DType() != tensor.BFloat16 {
				return fmt.Errorf("%s: operand %v, expected bf16 (the GEMM engine's, which the stream hooks stand in for)", e.what, t)
			}
		}
		return nil
	}
	if err := e.b.EngineSupports(c, a, w, transA, transB); err != nil {
		return fmt.Errorf("%s: %w", e.what, err)
	}
	return nil
}

// matmul is the engine's call c = alpha·op(a)·op(w) + beta·c with opt.
// With stream hooks it is the backend's MatMul after a one-warp wait (the
// deadline opt.Wait.Timeout, status the waits' status word) for every
// chunk flag of opt.Wait; opt.Signal is then the caller's to raise
// (scatterEngine).
func (e siteEnv) matmul(status, c, a, w *tensor.Tensor, transA, transB bool, alpha, beta float32, opt cudabackend.GEMMOptions) error {
	if !e.hooks {
		return e.b.EngineMatMul(c, a, w, transA, transB, alpha, beta, opt)
	}
	if wt := opt.Wait; wt != nil {
		rows := a.Dim(0)
		if transA {
			rows = a.Dim(1)
		}
		what := e.what
		waitSignals(e.b, wt.Flags, (rows+wt.ChunkRows-1)/wt.ChunkRows, wt.Target, wt.Timeout, status, func(i int) error {
			return fmt.Errorf("%s: the rows of chunk %d never landed within %v", what, i, wt.Timeout)
		})
	}
	e.b.MatMul(c, a, w, transA, transB, alpha, beta)
	return e.b.Err()
}

type fagmm struct {
	agmm
	timeout time.Duration
	put     *putGather // the forward's gather by puts (nil: by pulls)
}

// Close frees the put transfer's buffers, then the rest (the side
// stream last).
func (s *fagmm) Close() error { return closeAfterPut(s.put, s.agmm.Close) }

func (s *fagmm) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	n, err := overlap.CheckAllGatherMatmul(s.sp, "forward", outs, xFull, x, ws)
	if err != nil || s.sp.Group.Size() == 1 {
		return s.fallback().Forward(outs, xFull, x, ws)
	}
	for i, w := range ws {
		if err := engineFits(s.e, outs[i], xFull, w, false, true); err != nil {
			return err
		}
	}
	if s.put != nil {
		return s.forwardPut(n, outs, xFull, x, ws)
	}
	landed, err := gatherLanded(s.fwd, xFull, x, s.timeout)
	if err != nil {
		return err
	}
	opt := cudabackend.GEMMOptions{RotateRows: s.sp.Group.Rank() * n,
		Wait: &cudabackend.GEMMWait{Flags: landed, ChunkRows: n, Target: s.fwd.epoch, Timeout: s.timeout}}
	for i, w := range ws {
		if err := s.e.matmul(s.fwd.status, outs[i], xFull, w, false, true, 1, 0, opt); err != nil {
			return err
		}
	}
	// The compute stream is not made to wait for the pulls' events: the
	// engine's acquire of every chunk's landed word (raised after the copy)
	// already orders the rows before it and every later kernel of the
	// stream (the backward's dW reads xFull), and an event of a pull from a
	// peer that never publishes would block the stream past any deadline.
	return nil
}

// forwardPut is Forward with the put transfer: the engine reads the
// symmetric gather buffer as the peers' puts land in it, then the
// gathered rows are copied into xFull (the backward's dW reads them) and
// the buffer is handed back to the peers.
func (s *fagmm) forwardPut(n int, outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	b := s.e.b
	full, wait, err := s.put.gather(x, s.timeout)
	if err != nil {
		return err
	}
	opt := cudabackend.GEMMOptions{RotateRows: s.sp.Group.Rank() * n, Wait: wait}
	for i, w := range ws {
		if err := s.e.matmul(s.put.status, outs[i], full, w, false, true, 1, 0, opt); err != nil {
			return err
		}
	}
	// After the engine, whose acquire of every chunk's flag ordered the
	// rows before it and the stream's later work; and after this rank's
	// put, which reads x (a caller may pass x as xFull's own rows).
	if err := s.put.join(); err != nil {
		return err
	}
	b.Copy(xFull, full)
	return s.put.markRead()
}

func (s *fagmm) Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error) {
	n, err := overlap.CheckAllGatherMatmulBackward(s.sp, dx, dws, douts, xFull, ws)
	if err != nil || s.sp.Group.Size() == 1 {
		return s.fallback().Backward(dx, dws, douts, xFull, ws)
	}
	b, P := s.e.b, s.sp.Group.Size()
	for i, w := range ws {
		if err := engineFits(s.e, xFull, douts[i], w, false, false); err != nil { // the stage has xFull's shape
			return nil, err
		}
	}
	recv := s.recv.get(b, dx.DType(), (P-1)*n, dx.Dim(1))
	err = scatterEngine(s.bwd, &s.sum, recv, dx, s.timeout,
		func(stage *tensor.Tensor, o cudabackend.GEMMOptions) error {
			for i, w := range ws {
				oi, beta := o, float32(1)
				if i == 0 {
					beta = 0
				}
				if i < len(ws)-1 {
					oi.Signal = nil // the last product signals the finished rows
				}
				if err := s.e.matmul(s.bwd.status, stage, douts[i], w, false, false, 1, beta, oi); err != nil {
					return err
				}
			}
			return nil
		},
		func() {
			for i, dout := range douts {
				b.MatMul(dws[i], dout, xFull, true, false, 1, 1)
			}
		})
	if err != nil {
		return nil, err
	}
	return comm.Done, nil
}

type fmmrs struct {
	mmrs
	timeout time.Duration
	put     *putGather // the backward's gather of dout by puts (nil: by pulls)
}

// Close frees the put transfer's buffers, then the rest (the side
// stream last).
func (s *fmmrs) Close() error { return closeAfterPut(s.put, s.mmrs.Close) }

// closeAfterPut releases put (if any), then runs rest; the first error.
func closeAfterPut(put *putGather, rest func() error) error {
	var err error
	if put != nil {
		err = put.release()
	}
	if e := rest(); err == nil {
		err = e
	}
	return err
}

func (s *fmmrs) Forward(out, x, w *tensor.Tensor) error {
	P := s.sp.Group.Size()
	n, err := overlap.CheckMatmulReduceScatter(s.sp, "forward", out, x, w)
	if err != nil || P == 1 {
		return s.fallback().Forward(out, x, w)
	}
	if err := engineFits(s.e, out, ownRows(x, 0, n), w, false, true); err != nil {
		return err
	}
	b := s.e.b
	recv := s.recv.get(b, out.DType(), (P-1)*n, out.Dim(1))
	return scatterEngine(s.fwd, &s.sum, recv, out, s.timeout,
		func(stage *tensor.Tensor, o cudabackend.GEMMOptions) error {
			return s.e.matmul(s.fwd.status, stage, x, w, false, true, 1, 0, o)
		}, nil)
}

func (s *fmmrs) Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error) {
	P := s.sp.Group.Size()
	n, err := overlap.CheckMatmulReduceScatterBackward(s.sp, dx, dw, dout, x, w)
	if err != nil || P == 1 {
		return s.fallback().Backward(dx, dw, dout, x, w)
	}
	b, r := s.e.b, s.sp.Group.Rank()
	if s.put != nil {
		// The engine and dW read the symmetric gather buffer itself.
		full, wait, err := s.put.gather(dout, s.timeout)
		if err != nil {
			return nil, err
		}
		if err := engineFits(s.e, dx, full, w, false, false); err != nil {
			return nil, err
		}
		if err := s.e.matmul(s.put.status, dx, full, w, false, false, 1, 0, cudabackend.GEMMOptions{RotateRows: r * n, Wait: wait}); err != nil {
			return nil, err
		}
		b.MatMul(dw, full, x, true, false, 1, 1) // after the engine, which saw every chunk land
		if err := s.put.end(); err != nil {
			return nil, err
		}
		return comm.Done, nil
	}
	full := s.full.get(b, dout.DType(), P*n, dout.Dim(1))
	if err := engineFits(s.e, dx, full, w, false, false); err != nil {
		return nil, err
	}
	landed, err := gatherLanded(s.bwd, full, dout, s.timeout)
	if err != nil {
		return nil, err
	}
	opt := cudabackend.GEMMOptions{RotateRows: r * n,
		Wait: &cudabackend.GEMMWait{Flags: landed, ChunkRows: n, Target: s.bwd.epoch, Timeout: s.timeout}}
	if err := s.e.matmul(s.bwd.status, dx, full, w, false, false, 1, 0, opt); err != nil {
		return nil, err
	}
	b.MatMul(dw, full, x, true, false, 1, 1) // after the engine, which saw every chunk land
	return comm.Done, nil
}

// gatherLanded is gatherInto for the engine: the pulls also raise the
// chunk's landed word, the own chunk's word is raised on the compute stream
// after its copy, and the compute stream then waits until every peer has
// published this call's shard and this rank's last pull is issued (see
// Engine: the engine launched after this waits only for copies), or the
// deadline passed (the call then fails at the next Sync, naming the peer).
// Only for P > 1 (the fused sites fall back to collective at one rank): the
// own ready word is raised by the last pull.
func gatherLanded(x *exchange, full, src *tensor.Tensor, timeout time.Duration) (uint64, error) {
	g, b := x.sp.g, x.sp.b
	P, r := g.Size(), g.Rank()
	// The flag words live with the stage: allocate it (gatherInto's own
	// ensure then finds it) before taking them.
	if err := x.ensure(src.Dim(0), src.Dim(1), src.DType()); err != nil {
		return 0, err
	}
	landed, _ := x.flags()
	// The pulls' Work is not waited: the engine's acquire of each landed
	// word orders the rows (see fagmm.Forward). The own ready word, which
	// no peer writes, is raised by the side stream once it has passed the
	// wait of its last pull (its earlier pulls have landed by then), so
	// that the one wait below covers the peers' publishes and that: the
	// engine then waits only on the last pull, already issued. With the
	// own word on the compute stream instead, four PEs sharing the H200
	// under MPS stalled until the deadline on each rank's last pull, with
	// the engine resident (docs/measurements/2026-12-02.md, "The fused TP
	// strategy").
	if _, err := gatherInto(x, full, src, landed, uint64(x.readyWord(r, r))); err != nil {
		return 0, err
	}
	err := x.sp.queue("peercopy: own chunk landed", func(l *cudabackend.Launcher) error {
		return l.WriteValue64(cudabackend.Ptr(landed+uint64(r)*wordBytes), x.epoch)
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", x.sp.what, err)
	}
	// Every peer has published this call's shard: a wait with a deadline
	// (a kernel of one warp, which leaves its SM to the peers' kernels), not
	// a stream wait, which could wait forever for a peer that is gone.
	epoch, name := x.epoch, g.Name()
	waitSignals(b, uint64(x.readyWord(r, 0)), P, epoch, timeout, x.status, func(q int) error {
		return fmt.Errorf("%s on %s: rank %d never published its rows of call %d within %v", x.sp.what, name, q, epoch, timeout)
	})
	return landed, nil
}

// scatterEngine is scatterSum for the engine: gemm computes the whole
// partial product (P·n rows, destination d's rows at d·n) into the stage in
// one pass, with the options given (the tile order starting at rank r+1's
// rows, so this rank's own come last, and a signal per 128-row block); the
// side stream publishes each destination's rows as soon as their blocks are
// signalled and pulls this rank's partial from each peer; between runs on
// the compute stream after the GEMM (the weight gradients, overlapping the
// exchange); then out = own partial + the received ones in step order.
func scatterEngine(x *exchange, sum *overlap.Accumulator, recv, out *tensor.Tensor, timeout time.Duration,
	gemm func(stage *tensor.Tensor, o cudabackend.GEMMOptions) error, between func()) error {
	g, b := x.sp.g, x.sp.b
	P, r, n, cols := g.Size(), g.Rank(), out.Dim(0), out.Dim(1)
	if err := x.ensureExact(n, cols, out.DType()); err != nil {
		return err
	}
	x.begin()
	_, sig := x.flags()
	stage, _ := x.stage.Rows(0, P*n)
	nbN := uint64((cols + cudabackend.EngineTileN - 1) / cudabackend.EngineTileN)
	target := x.epoch * nbN // every tile adds 1 to its row block's word
	for d := range P {      // each destination has read its slot of the last call
		if d != r {
			if err := x.reserve(d); err != nil {
				return fmt.Errorf("%s: %w", x.sp.what, err)
			}
		}
	}
	// The side stream's work below must not wait for the GEMM.
	if err := x.sp.queue("peercopy: fork", func(l *cudabackend.Launcher) error { return x.forkSide(l.Stream()) }); err != nil {
		return fmt.Errorf("%s: %w", x.sp.what, err)
	}
	o := cudabackend.GEMMOptions{RotateRows: ((r + 1) % P) * n,
		Signal: &cudabackend.GEMMSignal{Flags: sig, PerRowBlock: true, Value: 1}}
	if err := gemm(stage, o); err != nil {
		return err
	}
	if x.sp.hooks { // the engine's per-tile signals, every row block's at once
		blocks := (P*n + cudabackend.EngineTileM - 1) / cudabackend.EngineTileM
		b.Queue("peercopy: stored rows signalled", func(l *cudabackend.Launcher) error {
			return l.Launch("ep_fill_u64", cudabackend.D1(1), cudabackend.D1(128), 0, cudabackend.Ptr(sig), int32(blocks), int64(target))
		})
	}
	if between != nil {
		between()
	}
	steps := make([]comm.Work, P)
	for s := 1; s < P; s++ {
		d, q := (r+s)%P, (r-s+P)%P
		err := x.sp.queue("peercopy: publish stored rows", func(l *cudabackend.Launcher) error {
			lo, hi := d*n/cudabackend.EngineTileM, ((d+1)*n-1)/cudabackend.EngineTileM
			err := l.OnStream(x.sp.side, func() error {
				for mb := lo; mb <= hi; mb++ {
					if err := l.WaitValue64(cudabackend.Ptr(sig+uint64(mb)*wordBytes), target); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			return x.publishFrom(l, d)
		})
		if err != nil {
			return fmt.Errorf("%s: publishing rank %d's rows: %w", x.sp.what, d, err)
		}
		w, err := x.pullWith(s, q, ownRows(recv, s-1, n), false, 0, 0)
		if err != nil {
			return err
		}
		steps[s] = w
	}
	// The pulls above wait on stream memory operations, which cannot give
	// up: a one-warp deadline wait on the compute stream (after the GEMM)
	// for every peer's publish, which at its deadline raises the words
	// itself, so that the pulls pass (on stale rows) and the call fails at
	// the next Sync naming the peer instead of hanging.
	epoch, name := x.epoch, g.Name()
	err := x.sp.queue("peercopy: own partial published", func(l *cudabackend.Launcher) error { return l.WriteValue64(x.readyWord(r, r), epoch) })
	if err != nil {
		return fmt.Errorf("%s: %w", x.sp.what, err)
	}
	waitSignalsRaising(b, uint64(x.readyWord(r, 0)), P, epoch, timeout, x.status, func(q int) error {
		return fmt.Errorf("%s on %s: rank %d never published its partial rows of call %d within %v", x.sp.what, name, q, epoch, timeout)
	})
	b.Copy(out, x.slot(r, n))
	sum.Begin(b, out)
	for s := 1; s < P; s++ {
		if err := steps[s].Wait(nil); err != nil {
			return err
		}
		sum.Add(ownRows(recv, s-1, n))
	}
	sum.End()
	return nil
}
