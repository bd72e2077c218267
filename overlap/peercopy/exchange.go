package peercopy

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// exchange is one direction of a site's communication: each rank
// publishes rows in its symmetric stage, and every peer pulls them with
// the copy engine from a peer pointer, on the site's side stream.
//
// Slots: a gather stage has one slot that every peer pulls (the own
// shard); a scatter stage has one slot per destination rank d, which only
// d pulls (the partial product of d's rows).
//
// Signal words (symmetric, 64-bit, one pad per exchange), on rank r:
//
//	ready[q]  = the epoch of the call whose rows rank q has published for r
//	done[q]   = the epoch of the call whose rows of r's stage rank q has pulled
//
// Each call is one epoch (the same count on every rank: ranks make the same
// calls). Publishing slot d in epoch e first waits, on the compute stream,
// for done[d] ≥ e−1 (d has finished reading the slot's previous rows), then
// the rows are written (by the backend's ops), then a stream write sets
// ready[r] = e on d (cuStreamWriteValue64 fences earlier writes first).
// A pull of q's rows waits on the side stream for ready[q] ≥ e, copies,
// and sets done[r] = e on q. No host synchronisation; the waits are stream
// memory operations, which hold no SM, so neither side can starve the
// other (ARCHITECTURE.md, "No deadlock by construction").
type exchange struct {
	sp      siteEnv
	slots   int
	rows    int // rows per slot
	cols    int
	stage   *tensor.Tensor // symmetric (slots·rows, cols)
	pad     *tensor.Tensor // symmetric (2P) words: ready then done
	padPeer []uint64       // each rank's pad (peer pointers; own at r)
	stPeer  []uint64       // each rank's stage
	epoch   uint64
	events  []*cuda.Event // one per pull of a call (side stream → compute)
	fork    *cuda.Event   // compute → side stream before each pull

	// The fused strategy's local flag words (fused.go), reset with the
	// stage (they count this exchange's epochs): landed[q] = the epoch whose
	// rows of rank q have landed here (written by the side stream after the
	// pull, read by the GEMM engine's producer), sig[mb] = the tiles of row
	// block mb the engine has stored so far (its epilogue signal).
	landed, sig *tensor.Tensor
	status      *tensor.Tensor // int32 (4): set by a signal wait that ran out (waitSignals)
}

// siteEnv is what a site's exchanges share: the group and its symmetric
// memory, the backend and the side stream.
type siteEnv struct {
	g    comm.Comm
	sm   comm.SymmetricMemory
	b    *cudabackend.Backend
	side *cuda.Stream
	what string
	// hooks: the fused sites' engine calls in their stream-hooks form
	// (Engine.StreamHooks).
	hooks bool
}

const wordBytes = 8

// ensure (re)allocates the stage for rows per slot of cols columns. The
// allocation is a world collective: every rank reaches it at the same call
// (the first, or the first with more rows).
func (x *exchange) ensure(rows, cols int, dt tensor.DType) error {
	return x.ensureRows(rows, cols, dt, false)
}

// ensureExact is ensure with exactly rows per slot, so that the slots are
// one contiguous (slots·rows, cols) matrix (the fused scatter's one GEMM
// writes them all).
func (x *exchange) ensureExact(rows, cols int, dt tensor.DType) error {
	return x.ensureRows(rows, cols, dt, true)
}

func (x *exchange) ensureRows(rows, cols int, dt tensor.DType, exact bool) error {
	fits := x.rows >= rows
	if exact {
		fits = x.rows == rows
	}
	if x.stage != nil && fits && x.cols == cols && x.stage.DType() == dt {
		return nil
	}
	// No NVSHMEM kernel of any group may run during the allocation (a
	// world collective): this rank's device work is drained first.
	if err := x.sp.b.SyncAll(); err != nil {
		return fmt.Errorf("%s: before allocating the stage: %w", x.sp.what, err)
	}
	if err := x.release(); err != nil {
		return err
	}
	P := x.sp.g.Size()
	var err error
	x.rows, x.cols, x.epoch = rows, cols, 0
	if x.stage, x.stPeer, err = x.sp.allocPeers([]int{x.slots * rows, cols}, dt, fmt.Sprintf("stage (%d×%d, %d slots)", rows, cols, x.slots)); err != nil {
		return err
	}
	// 2P 64-bit words as pairs of int32 (the backend, and its emulator,
	// store no 64-bit type; NVSHMEM allocates bytes).
	x.pad, x.padPeer, err = x.sp.allocPeers([]int{2 * 2 * P}, tensor.Int32, "signal pad")
	return err
}

// allocPeers allocates a symmetric tensor (a world collective) and finds
// every rank's address of it (peer pointers; this rank's own at its
// index). The tensor comes back whenever it was allocated, also with an
// error finding an address, so that the caller's release frees it.
func (sp siteEnv) allocPeers(shape []int, dt tensor.DType, what string) (*tensor.Tensor, []uint64, error) {
	t, err := sp.sm.AllocSymmetric(shape, dt)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s: %w", sp.what, what, err)
	}
	peers := make([]uint64, sp.g.Size())
	for q := range peers {
		if peers[q], err = sp.sm.PeerPtr(t, q); err != nil {
			return t, nil, fmt.Errorf("%s: %w", sp.what, err)
		}
	}
	return t, peers, nil
}

// flags returns the device addresses of the fused strategy's local flag
// words: P landed words and one signal word per 128-row block of the
// stage, zero from the stage's
// (re)allocation on (release frees them with the stage).
func (x *exchange) flags() (landed, sig uint64) {
	b := x.sp.b
	// 64-bit words as pairs of int32 (the backend stores no 64-bit type;
	// its allocations are aligned far beyond 8 bytes).
	if x.landed == nil {
		x.landed = b.Zeros(tensor.Int32, 2*x.sp.g.Size())
	}
	if x.status == nil {
		x.status = b.Zeros(tensor.Int32, 4)
	}
	if x.sig == nil { // one word per 128-row block of the whole stage
		x.sig = b.Zeros(tensor.Int32, 2*((x.slots*x.rows+cudabackend.EngineTileM-1)/cudabackend.EngineTileM))
	}
	return cudabackend.DevicePtr(x.landed), cudabackend.DevicePtr(x.sig)
}

func (x *exchange) release() error {
	var first error
	for _, t := range []*tensor.Tensor{x.stage, x.pad} {
		if t != nil {
			if err := x.sp.sm.FreeSymmetric(t); err != nil && first == nil {
				first = err
			}
		}
	}
	for _, e := range append(x.events, x.fork) {
		if e != nil {
			_ = x.sp.b.OnDevice(func(*cuda.Stream) error { return e.Destroy() })
		}
	}
	for _, t := range []*tensor.Tensor{x.landed, x.sig, x.status} {
		if t != nil {
			x.sp.b.Free(t)
		}
	}
	x.stage, x.pad, x.events, x.fork, x.landed, x.sig, x.status = nil, nil, nil, nil, nil, nil, nil
	return first
}

// begin starts a call: the next epoch.
func (x *exchange) begin() { x.epoch++ }

// slot is this rank's stage rows for destination d (n rows).
func (x *exchange) slot(d, n int) *tensor.Tensor {
	if x.slots == 1 {
		d = 0
	}
	v, _ := x.stage.Rows(d*x.rows, d*x.rows+n)
	return v
}

func (x *exchange) readyWord(pe, q int) cudabackend.Ptr {
	return cudabackend.Ptr(x.padPeer[pe] + uint64(q)*wordBytes)
}

func (x *exchange) doneWord(pe, q int) cudabackend.Ptr {
	return cudabackend.Ptr(x.padPeer[pe] + uint64(x.sp.g.Size()+q)*wordBytes)
}

// queue runs fn with the backend's device (cudabackend.Backend.Queue:
// fn's launches, copies and stream memory operations go to the backend's
// stream, or to the side stream inside l.OnStream) and returns fn's error,
// or the backend's when it has failed already (fn then does not run). On
// the kernel emulator there is no side stream and no event: its one
// stream runs the work in issue order, and its stream waits are host waits
// that let the other emulated ranks run (Launcher.WaitValue64).
func (e siteEnv) queue(op string, fn func(l *cudabackend.Launcher) error) error {
	ran := false
	var err error
	e.b.Queue(op, func(l *cudabackend.Launcher) error {
		ran, err = true, fn(l)
		return err
	})
	if !ran {
		return e.b.Err()
	}
	return err
}

// reserve waits on the compute stream until the destinations have pulled
// the previous epoch's rows of the slot for d (every peer for a gather).
func (x *exchange) reserve(d int) error {
	me, P := x.sp.g.Rank(), x.sp.g.Size()
	return x.sp.queue("peercopy: reserve", func(l *cudabackend.Launcher) error {
		for q := range P {
			if q == me || (x.slots > 1 && q != d) {
				continue
			}
			if err := l.WaitValue64(x.doneWord(me, q), x.epoch-1); err != nil {
				return err
			}
		}
		return nil
	})
}

// publish tells d (every peer for a gather) that the slot's rows of this
// epoch are written, after the compute stream's work so far.
func (x *exchange) publish(d int) error {
	return x.sp.queue("peercopy: publish", func(l *cudabackend.Launcher) error { return x.publishOn(l, d) })
}

// publishOn queues publish's writes on l's stream.
func (x *exchange) publishOn(l *cudabackend.Launcher, d int) error {
	me, P := x.sp.g.Rank(), x.sp.g.Size()
	for q := range P {
		if q == me || (x.slots > 1 && q != d) {
			continue
		}
		if err := l.WriteValue64(x.readyWord(q, me), x.epoch); err != nil {
			return err
		}
	}
	return nil
}

// pull queues on the side stream the copy of q's rows for this rank into
// dst (n rows), after the compute stream's work so far, and returns the
// Work that orders the compute stream after it.
func (x *exchange) pull(step, q int, dst *tensor.Tensor) (comm.Work, error) {
	return x.pullWith(step, q, dst, true, 0, 0)
}

// pullWith is pull; without fork the side stream is not ordered after the
// compute stream's work so far (the caller forked it earlier: the fused
// scatter's pulls must not wait for the GEMM that runs meanwhile), and a
// non-zero landed is a local word the side stream sets to the epoch once
// the rows are here (the GEMM engine's producer waits on it).
func (x *exchange) pullWith(step, q int, dst *tensor.Tensor, fork bool, landed, issued uint64) (comm.Work, error) {
	me := x.sp.g.Rank()
	n := dst.Dim(0)
	var ev *cuda.Event
	err := x.sp.queue("peercopy: pull", func(l *cudabackend.Launcher) error {
		if compute := l.Stream(); compute != nil { // a GPU: the side stream's events
			for len(x.events) <= step {
				e, err := cuda.NewEvent(false)
				if err != nil {
					return err
				}
				x.events = append(x.events, e)
			}
			ev = x.events[step]
			if fork {
				if err := x.forkSide(compute); err != nil { // dst's earlier readers are done first
					return err
				}
			}
		}
		return l.OnStream(x.sp.side, func() error {
			if err := l.WaitValue64(x.readyWord(me, q), x.epoch); err != nil {
				return err
			}
			if issued != 0 { // the side stream is past its waits (gatherInto's last pull)
				if err := l.WriteValue64(cudabackend.Ptr(issued), x.epoch); err != nil {
					return err
				}
			}
			slot := 0
			if x.slots > 1 {
				slot = me
			}
			es := dst.DType().Size()
			src := cudabackend.Ptr(x.stPeer[q] + uint64(slot*x.rows*x.cols*es))
			if n > 0 {
				if err := l.CopyDtoD(cudabackend.PtrOf(dst), src, n*x.cols*es); err != nil {
					return err
				}
			}
			if landed != 0 {
				// After the copy in stream order; the write is a release for
				// the engine's acquire load (stream memory operations fence the
				// work before them).
				if err := l.WriteValue64(cudabackend.Ptr(landed+uint64(q)*wordBytes), x.epoch); err != nil {
					return err
				}
			}
			if err := l.WriteValue64(x.doneWord(q, me), x.epoch); err != nil {
				return err
			}
			if ev == nil {
				return nil
			}
			return ev.Record(x.sp.side)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("%s: pull from rank %d: %w", x.sp.what, q, err)
	}
	if ev == nil { // the emulator: done in issue order
		return comm.Done, nil
	}
	return eventWork{x.sp.b, ev}, nil
}

// forkSide orders the side stream after the compute stream's work so far
// (a GPU's; the emulator has one stream).
func (x *exchange) forkSide(compute *cuda.Stream) error {
	if compute == nil {
		return nil
	}
	if x.fork == nil { // re-recorded by every fork: a wait keeps the record it was queued after
		e, err := cuda.NewEvent(false)
		if err != nil {
			return err
		}
		x.fork = e
	}
	if err := x.fork.Record(compute); err != nil {
		return err
	}
	return x.sp.side.WaitEvent(x.fork)
}

// publishFrom is publish issued on the side stream instead of the compute
// stream (the fused scatter publishes a slot when the engine's signal words
// say its rows are stored, while the GEMM still runs).
func (x *exchange) publishFrom(l *cudabackend.Launcher, d int) error {
	return l.OnStream(x.sp.side, func() error { return x.publishOn(l, d) })
}

// eventWork orders a stream after a recorded event.
type eventWork struct {
	b  *cudabackend.Backend
	ev *cuda.Event
}

func (w eventWork) Wait(s comm.Stream) error {
	return w.b.OnDevice(func(compute *cuda.Stream) error {
		st := compute
		if cs, ok := s.(*cuda.Stream); ok && cs != nil {
			st = cs
		}
		return st.WaitEvent(w.ev)
	})
}
