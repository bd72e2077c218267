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
	x.pad, x.padPeer, err = x.sp.allocPeers([]int{2 * P}, tensor.Float64, "signal pad") // 64-bit words, used as uint64
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

func (x *exchange) readyWord(pe, q int) cuda.DevicePtr {
	return cuda.DevicePtr(x.padPeer[pe] + uint64(q)*wordBytes)
}

func (x *exchange) doneWord(pe, q int) cuda.DevicePtr {
	return cuda.DevicePtr(x.padPeer[pe] + uint64(x.sp.g.Size()+q)*wordBytes)
}

// reserve waits on the compute stream until the destinations have pulled
// the previous epoch's rows of the slot for d (every peer for a gather).
func (x *exchange) reserve(d int) error {
	me, P := x.sp.g.Rank(), x.sp.g.Size()
	return x.sp.b.OnDevice(func(compute *cuda.Stream) error {
		for q := range P {
			if q == me || (x.slots > 1 && q != d) {
				continue
			}
			if err := compute.WaitValue64(x.doneWord(me, q), x.epoch-1, cuda.WaitGEQ); err != nil {
				return err
			}
		}
		return nil
	})
}

// publish tells d (every peer for a gather) that the slot's rows of this
// epoch are written, after the compute stream's work so far.
func (x *exchange) publish(d int) error {
	me, P := x.sp.g.Rank(), x.sp.g.Size()
	return x.sp.b.OnDevice(func(compute *cuda.Stream) error {
		for q := range P {
			if q == me || (x.slots > 1 && q != d) {
				continue
			}
			if err := compute.WriteValue64(x.readyWord(q, me), x.epoch); err != nil {
				return err
			}
		}
		return nil
	})
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
	err := x.sp.b.OnDevice(func(compute *cuda.Stream) error {
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
		side := x.sp.side
		if err := side.WaitValue64(x.readyWord(me, q), x.epoch, cuda.WaitGEQ); err != nil {
			return err
		}
		if issued != 0 { // the side stream is past its waits (gatherInto's last pull)
			if err := side.WriteValue64(cuda.DevicePtr(issued), x.epoch); err != nil {
				return err
			}
		}
		slot := 0
		if x.slots > 1 {
			slot = me
		}
		es := dst.DType().Size()
		src := cuda.DevicePtr(x.stPeer[q] + uint64(slot*x.rows*x.cols*es))
		if n > 0 {
			if err := cuda.CopyDtoDAsync(cuda.DevicePtr(cudabackend.DevicePtr(dst)), src, n*x.cols*es, side); err != nil {
				return err
			}
		}
		if landed != 0 {
			// After the copy in stream order; the write is a release for
			// the engine's acquire load (stream memory operations fence the
			// work before them).
			if err := side.WriteValue64(cuda.DevicePtr(landed+uint64(q)*wordBytes), x.epoch); err != nil {
				return err
			}
		}
		if err := side.WriteValue64(x.doneWord(q, me), x.epoch); err != nil {
			return err
		}
		return ev.Record(side)
	})
	if err != nil {
		return nil, fmt.Errorf("%s: pull from rank %d: %w", x.sp.what, q, err)
	}
	return eventWork{x.sp.b, ev}, nil
}

// forkSide orders the side stream after the compute stream's work so far.
func (x *exchange) forkSide(compute *cuda.Stream) error {
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
func (x *exchange) publishFrom(d int) error {
	me, P := x.sp.g.Rank(), x.sp.g.Size()
	for q := range P {
		if q == me || (x.slots > 1 && q != d) {
			continue
		}
		if err := x.sp.side.WriteValue64(x.readyWord(q, me), x.epoch); err != nil {
			return err
		}
	}
	return nil
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
