package dispatch

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The fused expert path (Config.Fused; parallel/ep/peerep's Expert with Fused): the
// dispatch raises a counter per 128-row block of the expert-major receive
// buffer as the rows land, the first grouped GEMM's producer waits on those
// counters (GroupedWait) instead of on the whole dispatch, and the
// down-projection's epilogue raises a flag per 128-row block (GroupedSignal)
// on which the combine sends the block's rows home while the GEMM goes on.
//
// A fused step is, on every rank in the same order:
//
//	DispatchSend(x, idx, cf)  layout; the counts into every peer's header and their own signal ("counts ready"); the tokens and "tokens ready"
//	DispatchRecvFused(xe)     wait for every peer's counts; plan (offsets, blocks, counters = 128 − the block's rows);
//	                          land the sources already here (claimed, whole grid); then on the side stream, source by
//	                          source from this rank on: wait for its tokens, claim it, expand its rows into expert-major
//	                          rows unless already landed, +1 on a block's counter per row; ack the token buffer
//	<the first grouped GEMM, Wait()>           each block's rows once its counter is 128
//	CombineSendFused(ye, gemm)                 the done flags and the claim counter cleared; on the side stream: wait
//	                                           for the homes' combine buffers, then 2 CTAs send 16-row units as their
//	                                           blocks' flags rise; gemm (the down projection, Signal()) on the backend's
//	                                           stream meanwhile; after it, a full grid sends the units left; join; signal
//	CombineRecv(out, w)                        the pipelined combine's wait and fp32 sum, unchanged
//
// The backward mirrors it: CombineBackwardSend (pipelined: ∂out once per
// destination rank with the weights), CombineBackwardRecvFused (the
// counters set again to their targets; each source's rows scaled into
// expert rows as DispatchRecvFused lands them, +1 per row) under the dh GEMM
// that waits on them (Wait), then DispatchBackwardSendFused beside the
// last dx GEMM (Signal), and DispatchBackwardRecv as in the pipelined path.
// The weight gradients' GEMMs have no hooks: they read rows that the dh
// GEMM has already waited for.
//
// On a GPU the side stream's kernels run beside the persistent GEMM only if
// the GEMM leaves them SMs: the hooks' GEMMs reserve some (GEMMWait's
// ReserveSMs rule). The kernel emulator has no streams: there the side work
// runs in order on the one stream, the dispatch's before the GEMM and the
// combine's after it (CombineSendFused calls gemm first), which is the same
// protocol without the overlap.

// fusedState is the fused path's part of an Engine.
type fusedState struct {
	// counters (nblk u64 as int32 pairs): the dispatch's rows landed per
	// block; done (nblk u64): the down GEMM's stored tiles per block;
	// claim (one int32, with a spare word): the next 16-row unit the
	// combine's send takes (ep_return_blocks); sources (P int32): which
	// stream lands each source's rows (ep_claim: claimMain or claimSide).
	counters, done, claim, sources *tensor.Tensor
	nblk                           int
	side                           *cuda.Stream // nil on a device without streams (the emulator)
	// fork and join order the side stream after and before the backend's;
	// acked marks the side stream's wait for the homes' acks, after which
	// the send's second launch (on the backend's stream) may store too.
	fork, join, acked *cuda.Event
	joinPending       bool
}

// FusedBlockRows is the rows of one block of the fused path's counters and
// flags: the grouped GEMM's tile rows.
const FusedBlockRows = cudabackend.EngineTileM

// fusedTarget is every block's counter once its rows have landed (ep_plan
// sets 128 − rows, each landed row adds 1).
const fusedTarget = FusedBlockRows

// FusedBlocks is the most 128-row blocks a step's expert-major rows can
// have: Σ_e ⌈rows_e / 128⌉ ≤ ⌊R / 128⌋ + L for R rows over L experts.
func (c Config) FusedBlocks() int { return c.recvBound()/FusedBlockRows + c.local() }

func (d *Engine) newFused() error {
	n := d.cfg.FusedBlocks()
	d.fz.nblk = n
	d.fz.counters = d.b.Zeros(tensor.Int32, 2*n)
	d.fz.done = d.b.Zeros(tensor.Int32, 2*n)
	d.fz.claim = d.b.Zeros(tensor.Int32, 2)
	d.fz.sources = d.b.Zeros(tensor.Int32, d.cfg.Ranks+d.cfg.Ranks%2)
	if !d.b.OnGPU() {
		return d.b.Err()
	}
	return d.b.OnDevice(func(*cuda.Stream) error {
		var err error
		if d.fz.side, err = cuda.NewStream(); err != nil {
			return err
		}
		for _, e := range []**cuda.Event{&d.fz.fork, &d.fz.join, &d.fz.acked} {
			if *e, err = cuda.NewEvent(false); err != nil {
				return err
			}
		}
		return nil
	})
}

func (d *Engine) closeFused() {
	fz := d.fz
	if fz.side == nil && fz.fork == nil && fz.join == nil && fz.acked == nil {
		return
	}
	_ = d.b.OnDevice(func(*cuda.Stream) error {
		if fz.side != nil {
			_ = fz.side.Synchronize()
			_ = fz.side.Destroy()
		}
		for _, e := range []*cuda.Event{fz.fork, fz.join, fz.acked} {
			if e != nil {
				_ = e.Destroy()
			}
		}
		return nil
	})
}

// onSide runs fn with launches going to the side stream, ordered after the
// work queued so far on the backend's stream; without a side stream (the
// emulator) fn runs on the backend's stream, in order.
func (d *Engine) onSide(dev *cudabackend.Launcher, fn func(dev *cudabackend.Launcher) error) error {
	main := dev.Stream()
	if main == nil || d.fz.side == nil {
		return fn(dev)
	}
	if err := d.fz.fork.Record(main); err != nil {
		return err
	}
	if err := d.fz.side.WaitEvent(d.fz.fork); err != nil {
		return err
	}
	if err := dev.OnStream(d.fz.side, func() error { return fn(dev) }); err != nil {
		return err
	}
	d.fz.joinPending = true
	return d.fz.join.Record(d.fz.side)
}

// joinSide makes the backend's stream wait for the side stream's work.
func (d *Engine) joinSide(dev *cudabackend.Launcher) error {
	s := dev.Stream()
	if s == nil || !d.fz.joinPending {
		return nil
	}
	d.fz.joinPending = false
	return s.WaitEvent(d.fz.join)
}

// Join orders the backend's stream after the fused path's side stream (the
// step's rows have all landed and its combine rows have all left). The
// fused calls join where they must; a caller that reads the expert-major
// rows without the GEMM's wait (Wait) joins first.
func (d *Engine) Join() {
	d.b.Queue("ExpertDispatch.Join", d.joinSide)
}

// FusedCounters is the dispatch's per-block counters of the fused path:
// FusedBlocks() u64 words as little-endian int32 pairs (tests read them).
func (d *Engine) FusedCounters() *tensor.Tensor { return d.fz.counters }

// FusedSources is which stream landed each source's rows in the last
// fused landing (P int32, then a pad word when P is odd): 1 the backend's
// stream before the GEMM (the tokens were there already), 2 the side
// stream beside it (tests read it).
func (d *Engine) FusedSources() *tensor.Tensor { return d.fz.sources }

// FusedDone is the down GEMM's per-block flags, like FusedCounters.
func (d *Engine) FusedDone() *tensor.Tensor { return d.fz.done }

// FusedBlockTable is the (L+1) int32 first 128-row block of each local
// expert in group-major order (ep_plan's blk), valid after the dispatch's
// plan: a view of the plan's table.
func (d *Engine) FusedBlockTable() *tensor.Tensor {
	P, L := d.cfg.Ranks, d.cfg.local()
	v, err := d.tab.View(4+3*P*L, L+1)
	if err != nil {
		panic("cuda: expert dispatch: internal error: " + err.Error())
	}
	return v
}

func (d *Engine) checkFused(op string) error {
	if !d.cfg.Fused {
		return fmt.Errorf("cuda: expert dispatch: %s: the path was built without Config.Fused", op)
	}
	return nil
}

// waitExplain is the error of a wait kernel's flag: the channel and the
// peer from the value (ep_wait's code·65536 + index).
func (d *Engine) waitExplain() func(v int32) error {
	me, dl := d.cfg.Rank, d.cfg.Deadline
	return func(v int32) error {
		c, i := splitWaitCode(v)
		if c == fusedCounterCode {
			return fmt.Errorf("cuda: fused expert dispatch on rank %d: the rows of block %d (128-row blocks of the expert-major receive buffer) did not all land within %v", me, i, dl)
		}
		what := "a signal"
		if c >= 0 && c < numSigChannels {
			what = sigNames[c]
		}
		return fmt.Errorf("cuda: expert dispatch on rank %d: rank %d never signalled %q within %v", me, i, what, dl)
	}
}

// fusedCombineCTAs is the grid of the fused combine's send beside the
// GEMM (see returnSendFused); fusedTailCTAs is the most CTAs of its second
// launch, after the GEMM, and fusedSendThreads the block of both.
const (
	fusedCombineCTAs = 2
	fusedTailCTAs    = 1024
	fusedSendThreads = 256
)

// fusedUnitRows is the rows of the combine send's unit of work
// (EP_UNIT_ROWS of ep_fused.cu): a 128-row block is 8 units.
const fusedUnitRows = 16

// fusedCounterCode is the wait code of StreamWaitRows' one-warp wait.
const fusedCounterCode = 100

// DispatchRecvFused is DispatchRecv for the fused path, expert-major (the
// grouped GEMM's order) into out (RecvBound(), C): it waits for every
// peer's counts only, plans, and queues the expansion of each source's
// tokens, own first, on the side stream as each source's tokens land,
// raising the blocks' counters. Read out only through a GEMM that waits
// on the counters (Wait), or after Join.
func (d *Engine) DispatchRecvFused(out *tensor.Tensor) error {
	const op = "DispatchRecvFused"
	if err := d.checkFused(op); err != nil {
		return err
	}
	if !d.dispatched {
		return fmt.Errorf("cuda: expert dispatch: %s without a DispatchSend", op)
	}
	if err := d.checkRows(op, "out", out, d.cfg.recvBound(), d.cfg.DType); err != nil {
		return err
	}
	P, E, L, K, C, Mt, me := d.cfg.Ranks, d.cfg.Experts, d.cfg.local(), d.cfg.TopK, d.cfg.Cols, d.cfg.MaxTokens, d.cfg.Rank
	e := d.eTok
	d.wait(op, sigReadyHdr, e, func(dev *cudabackend.Launcher) error {
		if err := dev.Launch("ep_plan", cudabackend.D1(1), cudabackend.D1(threads256), 0, ptr(d.sym[Header]), ptr(d.idx), ptr(d.rk),
			int32(P), int32(E), int32(L), int32(me), int32(min(d.n, Mt)), int32(K), int32(Mt),
			int64(math.Float64bits(d.cf)), ptr(d.hcopy), ptr(d.offsets), ptr(d.tab), ptr(d.pos), ptr(d.status),
			ptr(d.fz.counters), int32(d.fz.nblk)); err != nil {
			return err
		}
		return d.eachSource(dev, e, func(dev *cudabackend.Launcher, s, who int) error {
			return dev.Launch("ep_recv"+sfx(d.cfg.DType), d.grid(Mt), cudabackend.D1(128), 0, ptr(d.sym[Tokens]),
				ptr(d.sym[Meta]), ptr(d.hcopy), ptr(d.tab), int32(P), int32(E), int32(L), int32(K), int32(C), int32(Mt),
				int32(me), int32(0), ptr(out), ptr(d.route), ptr(d.routeExp), ptr(d.routeRecv), ptr(d.recvOfExp),
				ptr(d.expOfRecv), ptr(d.status), int32(s), ptr(d.fz.counters), ptr(d.offsets), ptr(d.fz.sources), int32(who))
		})
	})
	return d.sticky(op)
}

// fusedLandEarly lets the backend's stream land the sources already here
// before the GEMM (eachSource), and fusedSideSend sends blocks from the
// side stream beside the down GEMM (returnSendFused); the emulator's tests
// turn them off to run every landing on the side path and every send in
// the launch after the GEMM (SetFusedLandEarly, SetFusedSideSend): the
// emulated ranks meet before each wait, so with them on the other paths
// would never run there.
var fusedLandEarly, fusedSideSend = true, true

// Which stream lands a source's rows (fusedState.sources, ep_claim).
const (
	claimMain = 1 // the backend's stream, before the GEMM: the source's tokens were here already
	claimSide = 2 // the side stream, beside the GEMM, once they land
)

// eachSource lands every source's tokens of epoch e with land(s, who),
// which writes them into expert-major rows and raises the blocks'
// counters, on whichever stream gets to them first. On the backend's
// stream, before the GEMM the caller queues next, one ep_claim takes every
// source whose tokens are already here, and land runs for each source
// (its kernels return at once for a source the side stream won): a
// source already here is then landed on the whole GPU, not on the few SMs
// the waiting GEMM leaves free. On the side stream, source by source from
// this rank on, a wait for the source's tokens, a claim of it, and land;
// then the tokens' ack. Exactly one stream wins each source (atomicCAS),
// so every row lands once and every counter reaches its target.
func (d *Engine) eachSource(dev *cudabackend.Launcher, e uint64, land func(dev *cudabackend.Launcher, s, who int) error) error {
	P, me, dl := d.cfg.Ranks, d.cfg.Rank, d.cfg.Deadline
	if err := dev.Memset8(ptr(d.fz.sources), 0, d.fz.sources.Bytes()); err != nil {
		return err
	}
	if fusedLandEarly {
		if err := dev.Launch("ep_claim", cudabackend.D1(1), cudabackend.D1(32), 0, d.words(sigReadyTok), int32(P), int64(e),
			int32(-1), ptr(d.fz.sources), int32(claimMain)); err != nil {
			return err
		}
		for i := range P {
			if err := land(dev, (me+i)%P, claimMain); err != nil {
				return err
			}
		}
	}
	return d.onSide(dev, func(dev *cudabackend.Launcher) error {
		for i := range P {
			s := (me + i) % P
			flag := dev.Check(checkWait, d.waitExplain())
			if err := dev.Launch("ep_wait_one", cudabackend.D1(1), cudabackend.D1(32), 0, d.words(sigReadyTok), int32(s), int64(e),
				int64(dl), int32(sigReadyTok), ptr(d.status), flag); err != nil {
				return err
			}
			if err := dev.Launch("ep_claim", cudabackend.D1(1), cudabackend.D1(32), 0, d.words(sigReadyTok), int32(P), int64(e), int32(s),
				ptr(d.fz.sources), int32(claimSide)); err != nil {
				return err
			}
			if err := land(dev, s, claimSide); err != nil {
				return err
			}
		}
		return d.signal(dev, sigAckTok, e)
	})
}

// Wait is the first grouped GEMM's hook of the current fused step: before
// loading a 128-row block of the expert-major rows its producer waits until
// the block's counter is 128 (its rows have landed), for at most the path's
// deadline.
func (d *Engine) Wait() *cudabackend.GroupedWait {
	return &cudabackend.GroupedWait{Flags: cudabackend.DevicePtr(d.fz.counters), Target: fusedTarget, Timeout: d.cfg.Deadline}
}

// Signal is the down-projection GEMM's hook of the current fused step: its
// epilogue adds 1 to a block's flag per stored tile (the combine waits for
// ⌈C / 256⌉).
func (d *Engine) Signal() *cudabackend.GroupedSignal {
	return &cudabackend.GroupedSignal{Flags: cudabackend.DevicePtr(d.fz.done), Value: 1}
}

// StreamWaitRows queues on the backend's stream a wait until every block's
// counter is 128 (every row of the step has landed): the first GEMM's wait
// as a separate one-warp kernel, for a GEMM without the engine's hook (the
// SIMT grouped kernels, the emulator). It gives up after the deadline,
// naming the block.
func (d *Engine) StreamWaitRows() {
	d.b.Queue("StreamWaitRows", func(dev *cudabackend.Launcher) error {
		flag := dev.Check(checkWait, d.waitExplain())
		return dev.Launch("ep_wait", cudabackend.D1(1), cudabackend.D1(32), 0, ptr(d.fz.counters), int32(d.fz.nblk), int64(fusedTarget),
			int64(d.cfg.Deadline), int32(fusedCounterCode), ptr(d.status), flag)
	})
}

// StreamSignalDone queues on the backend's stream the down GEMM's signal of
// every block at once (ep_fill_u64): Signal's effect for a GEMM without the
// engine's epilogue hook.
func (d *Engine) StreamSignalDone() {
	d.b.Queue("StreamSignalDone", func(dev *cudabackend.Launcher) error {
		return dev.Launch("ep_fill_u64", cudabackend.D1(1), cudabackend.D1(128), 0, ptr(d.fz.done), int32(d.fz.nblk), int64(d.doneTarget()))
	})
}

// doneTarget is a block's flag once the down GEMM has stored all its
// tiles: one per 256 columns.
func (d *Engine) doneTarget() uint64 { return uint64(ceilDiv(d.cfg.Cols, cudabackend.EngineTileN)) }

// CombineSendFused is CombineSend of expert-major rows ye (RecvBound(), C)
// fused with the down-projection GEMM that writes them: gemm queues that
// GEMM on the backend's stream (with Signal() on the engine, or followed by
// StreamSignalDone), and each 128-row block of ye goes to its tokens' homes
// as soon as its flag says it is stored. Then CombineRecv as in the
// pipelined path.
func (d *Engine) CombineSendFused(ye *tensor.Tensor, gemm func() error) error {
	err := d.returnSendFused("CombineSendFused", ye, gemm, Y, sigAckY, sigReadyY, &d.eY)
	d.comb = d.comb || err == nil
	return err
}

// DispatchBackwardSendFused is DispatchBackwardSend of the expert rows'
// gradients g (RecvBound(), C), expert-major, fused with the last GEMM that
// writes them (the input gradient's dx += dup·W_up): each 128-row block goes
// home once its flag is up. Then DispatchBackwardRecv as in the pipelined
// path.
func (d *Engine) DispatchBackwardSendFused(g *tensor.Tensor, gemm func() error) error {
	err := d.returnSendFused("DispatchBackwardSendFused", g, gemm, G, sigAckG, sigReadyG, &d.eG)
	d.grads = d.grads || err == nil
	return err
}

// returnSendFused is the flag-driven send of rows y into the homes' buf,
// beside gemm (see CombineSendFused).
func (d *Engine) returnSendFused(op string, y *tensor.Tensor, gemm func() error, buf Buf, ack, ready int, epoch *uint64) error {
	if err := d.checkFused(op); err != nil {
		return err
	}
	if !d.dispatched {
		return fmt.Errorf("cuda: expert dispatch: %s without a dispatch", op)
	}
	if err := d.checkRows(op, "rows", y, d.cfg.recvBound(), d.cfg.DType); err != nil {
		return err
	}
	d.b.Queue(op, func(dev *cudabackend.Launcher) error {
		if err := dev.Memset8(ptr(d.fz.claim), 0, d.fz.claim.Bytes()); err != nil {
			return err
		}
		return dev.Memset8(ptr(d.fz.done), 0, d.fz.done.Bytes())
	})
	side := d.sideStream()
	if !side { // in order: the GEMM first, so that no flag wait spins
		if err := gemm(); err != nil {
			return err
		}
	}
	*epoch++
	e := *epoch
	if d.BeforeWait != nil {
		d.BeforeWait()
	}
	P, L, C := d.cfg.Ranks, d.cfg.local(), d.cfg.Cols
	send := func(dev *cudabackend.Launcher, grid int) error {
		bflag := dev.Check(checkBlocks, d.blocksExplain())
		return dev.Launch("ep_return_blocks"+sfx(d.cfg.DType), cudabackend.D1(grid), cudabackend.D1(fusedSendThreads), 0, ptr(y),
			ptr(d.routeExp), ptr(d.offsets), ptr(d.tab), int32(P), int32(L), int32(C), ptr(d.fz.done),
			int64(d.doneTarget()), int64(d.cfg.Deadline), d.peerRow(buf), ptr(d.status), bflag, ptr(d.fz.claim))
	}
	d.b.Queue(op, func(dev *cudabackend.Launcher) error {
		return d.onSide(dev, func(dev *cudabackend.Launcher) error {
			flag := dev.Check(checkWait, d.waitExplain())
			if err := dev.Launch("ep_wait", cudabackend.D1(1), cudabackend.D1(32), 0, d.words(ack), int32(P), int64(e-1),
				int64(d.cfg.Deadline), int32(ack), ptr(d.status), flag); err != nil {
				return err
			}
			if s := dev.Stream(); s != nil && side {
				if err := d.fz.acked.Record(s); err != nil {
					return err
				}
			}
			// Few CTAs, on purpose: they spin on flags of a persistent GEMM
			// queued after them, which must still find its SMs. The GEMM
			// leaves EngineReserveSMs (≥ 8) free; these CTAs and the wait
			// before them take at most 3, so every GEMM CTA can be resident
			// (a CTA of its tiles that never ran would hold this wait until
			// the deadline).
			if !fusedSideSend {
				return nil
			}
			return send(dev, max(1, min(d.fz.nblk, fusedCombineCTAs)))
		})
	})
	if side {
		if err := gemm(); err != nil {
			return err
		}
	}
	// The second launch, after the GEMM: every unit the side CTAs have not
	// claimed, on a full grid (its flags are all up, so it never spins).
	// Then the side stream is joined and the homes are told.
	d.b.Queue(op, func(dev *cudabackend.Launcher) error {
		if s := dev.Stream(); s != nil && side {
			if err := s.WaitEvent(d.fz.acked); err != nil {
				return err
			}
		}
		units := d.fz.nblk * (FusedBlockRows / fusedUnitRows)
		if err := send(dev, max(1, min(units, fusedTailCTAs))); err != nil {
			return err
		}
		if err := d.joinSide(dev); err != nil {
			return err
		}
		return d.signal(dev, ready, e)
	})
	return d.sticky(op)
}

// CombineBackwardRecvFused is CombineBackwardRecv for the fused path,
// expert-major into dy (RecvBound(), C): the step's counters are set again
// to their targets, and on the side stream, source by source from this
// rank on, each source's ∂out rows are scaled into expert rows as they
// land, raising the blocks' counters: the input-gradient GEMM of the down
// projection (dh = dy·W_down) waits on them (Wait). Read dy only through
// such a GEMM, or after Join.
func (d *Engine) CombineBackwardRecvFused(dy *tensor.Tensor) error {
	const op = "CombineBackwardRecvFused"
	if err := d.checkFused(op); err != nil {
		return err
	}
	if !d.dout {
		return fmt.Errorf("cuda: expert dispatch: %s without a CombineBackwardSend", op)
	}
	if err := d.checkRows(op, "dy", dy, d.cfg.recvBound(), d.cfg.DType); err != nil {
		return err
	}
	P, E, K, C, L, Mt := d.cfg.Ranks, d.cfg.Experts, d.cfg.TopK, d.cfg.Cols, d.cfg.local(), d.cfg.MaxTokens
	e := d.eTok
	if d.BeforeWait != nil {
		d.BeforeWait()
	}
	d.b.Queue(op, func(dev *cudabackend.Launcher) error {
		if err := d.joinSide(dev); err != nil {
			return err
		}
		if err := dev.Launch("ep_block_targets", cudabackend.D1(1), cudabackend.D1(threads256), 0, ptr(d.offsets), ptr(d.tab), int32(P),
			int32(L), ptr(d.fz.counters), int32(d.fz.nblk), ptr(d.status)); err != nil {
			return err
		}
		return d.eachSource(dev, e, func(dev *cudabackend.Launcher, s, who int) error {
			return dev.Launch("ep_scale_recv"+sfx(d.cfg.DType), d.grid(Mt), cudabackend.D1(128), 0, ptr(d.sym[Tokens]),
				ptr(d.sym[Weights]), ptr(d.hcopy), ptr(d.route), cudabackend.Ptr(0), int32(P), int32(E), int32(K), int32(C),
				int32(Mt), ptr(dy), ptr(d.status), int32(s), ptr(d.fz.counters), ptr(d.offsets), ptr(d.tab),
				int32(L), ptr(d.fz.sources), int32(who))
		})
	})
	return d.sticky(op)
}

// sideStream says whether the side work runs beside the backend's stream
// (a GPU) or in order on it (the emulator).
func (d *Engine) sideStream() bool { return d.fz.side != nil }

// blocksExplain is the error of ep_return_blocks' flag: a block whose rows
// the down GEMM never finished.
func (d *Engine) blocksExplain() func(v int32) error {
	me, dl := d.cfg.Rank, d.cfg.Deadline
	return func(v int32) error {
		return fmt.Errorf("cuda: fused expert combine on rank %d: block %d of the down projection's rows (128-row blocks, expert-major) was not stored within %v (its flag stayed below %d)", me, int(v)-0x20000000, dl, d.doneTarget())
	}
}
