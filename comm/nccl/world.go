package nccl

/*
#include "atp_nccl.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/cuda"
)

// ErrPeerGone is wrapped by the errors of a world in which a rank stopped
// sending heartbeats (its process exited, crashed or hangs) or the store's
// host went away (rendezvous.Liveness, whose rendezvous.ErrPeerGone they
// wrap too). NCCL itself does not notice a dead peer on NVLink or PCIe:
// its kernels wait for data that never comes.
var ErrPeerGone = errors.New("nccl: a rank of the world is gone")

// world is what a world Comm and every group split from it share in this
// process: the device, the options, the watchdog, the link to the store and
// the abort state. A failure anywhere (a deadline, an NCCL error, a peer
// gone, Abort) fails the whole world: every communicator is aborted with
// ncclCommAbort and every pending and later op returns the error.
type world struct {
	lib        Library
	dev        int // CUDA ordinal
	cctx       *cuda.Context
	rank, size int // world rank and size
	opts       options
	live       *rendezvous.Liveness // nil for a world of one rank or without heartbeats

	mu      sync.Mutex
	comms   map[*Comm]struct{}   // open communicators
	calls   map[*inCall]struct{} // NCCL calls in progress (until queued)
	pending []*work              // ops queued and not yet seen complete
	events  []*cuda.Event        // completed events, for reuse
	err     error                // the failure, once the world failed

	wake    chan struct{} // nudges the watchdog
	stop    chan struct{} // closed when the last communicator closes
	done    chan struct{} // closed when the watchdog returns
	aborted chan struct{} // closed when fail has aborted the communicators
}

// abortWait bounds how long Close waits for a failed world's communicators
// to be aborted before it frees their memory (which it leaks otherwise:
// NCCL's kernels may still be winding down).
const abortWait = 30 * time.Second

// maxPooled bounds the recycled events. The watchdog recycles the events
// of completed ops every millisecond or so while ops are pending: the pool
// holds enough for the ops queued meanwhile.
const maxPooled = 256

// hostSleeps counts the sleeps of host waits for NCCL or an op (poll,
// hostWait), for the tests: an op that NCCL queues in microseconds must not
// sleep (a sleep lasts a millisecond).
var hostSleeps atomic.Int64

func newWorld(lib Library, dev int, cctx *cuda.Context, rank, size int, o options) *world {
	return &world{lib: lib, dev: dev, cctx: cctx, rank: rank, size: size, opts: o,
		comms: make(map[*Comm]struct{}), calls: make(map[*inCall]struct{}), wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}), aborted: make(chan struct{})}
}

// failure returns the world's error, or nil while it is healthy.
func (w *world) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// bind locks the calling goroutine to its thread and makes the device's
// primary context current on it; call the returned function when done.
func (w *world) bind() (unbind func(), err error) {
	runtime.LockOSThread()
	if err := w.cctx.Bind(); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return runtime.UnlockOSThread, nil
}

// fail fails the world with err; the first failure wins. Pending works fail
// at once; then, on a goroutine of its own (ncclCommAbort can take long when
// peers are gone), the other ranks are told through the store (with tell)
// and every open communicator is aborted, which makes NCCL's kernels
// return. It must not be called with a Comm's mu held.
func (w *world) fail(err error, tell bool) {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return
	}
	w.err = err
	pend := w.pending
	w.pending = nil
	comms := make([]*Comm, 0, len(w.comms))
	for c := range w.comms {
		comms = append(comms, c)
	}
	w.mu.Unlock()

	if unbind, berr := w.bind(); berr == nil {
		defer unbind()
	}
	for _, wk := range pend {
		wk.finish(err)
	}
	go func() {
		defer close(w.aborted)
		if tell && w.live != nil {
			w.live.Abort(err)
		}
		unbind, berr := w.bind()
		if berr != nil {
			return // no context: nothing NCCL can be asked
		}
		defer unbind()
		for _, c := range comms {
			c.abortNCCL()
		}
	}()
}

// waitAborted waits (at most abortWait) for fail's aborts; it reports
// whether they are done.
func (w *world) waitAborted() bool {
	select {
	case <-w.aborted:
		return true
	case <-time.After(abortWait):
		return false
	}
}

// track adds a queued op to the watchdog's list. The first pending op
// wakes the watchdog, which then polls every opts.poll until none is
// pending (waking it for every op would cost each op a thread switch).
func (w *world) track(wk *work) {
	w.mu.Lock()
	err := w.err
	first := false
	if err == nil {
		w.pending = append(w.pending, wk)
		first = len(w.pending) == 1
	}
	w.mu.Unlock()
	if err != nil {
		wk.finish(err)
		return
	}
	if first {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// inCall is an NCCL call in progress: from before the call until the op is
// queued (its ncclInProgress settled), the watchdog holds it to its deadline.
type inCall struct {
	c               *Comm
	op              string
	seq             uint64
	start, deadline time.Time
}

// enter registers a call in progress; call the returned function when the
// op is queued or has failed.
func (w *world) enter(c *Comm, op string, seq uint64, start, deadline time.Time) (exit func()) {
	ic := &inCall{c: c, op: op, seq: seq, start: start, deadline: deadline}
	w.mu.Lock()
	w.calls[ic] = struct{}{}
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.calls, ic)
		w.mu.Unlock()
	}
}

// event returns an event for a new op (the caller is bound).
func (w *world) event() (*cuda.Event, error) {
	w.mu.Lock()
	if n := len(w.events); n > 0 {
		ev := w.events[n-1]
		w.events = w.events[:n-1]
		w.mu.Unlock()
		return ev, nil
	}
	w.mu.Unlock()
	return cuda.NewEvent(false)
}

// recycle keeps a completed event for reuse (the caller is bound).
func (w *world) recycle(ev *cuda.Event) {
	w.mu.Lock()
	keep := len(w.events) < maxPooled && len(w.comms) > 0
	if keep {
		w.events = append(w.events, ev)
	}
	w.mu.Unlock()
	if !keep {
		ev.Destroy()
	}
}

// watch is the watchdog: it polls the pending ops' events and the
// communicators' asynchronous errors, and fails the world when an op misses
// its deadline or NCCL reports an error.
func (w *world) watch() {
	defer close(w.done)
	runtime.LockOSThread() // for good: the thread ends with the goroutine
	if err := w.cctx.Bind(); err != nil {
		w.fail(fmt.Errorf("nccl: watchdog of world rank %d: %w", w.rank, err), true)
		return
	}
	t := time.NewTimer(w.opts.poll)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.wake:
		case <-t.C:
		}
		busy := w.check(time.Now())
		d := w.opts.idlePoll
		if busy {
			d = w.opts.poll
		}
		t.Reset(d)
	}
}

// check runs one round of the watchdog; it reports whether ops are pending.
func (w *world) check(now time.Time) bool {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return false
	}
	comms := make([]*Comm, 0, len(w.comms))
	for c := range w.comms {
		comms = append(comms, c)
	}
	pend := append([]*work(nil), w.pending...)
	var stuck *inCall
	for ic := range w.calls {
		if now.After(ic.deadline) && (stuck == nil || ic.start.Before(stuck.start)) {
			stuck = ic
		}
	}
	busy := len(w.calls) > 0
	w.mu.Unlock()
	if stuck != nil {
		err := w.timeoutError(stuck.op, stuck.c.name, stuck.seq, now.Sub(stuck.start))
		w.mu.Lock()
		_, still := w.calls[stuck] // the peer probe took a while
		w.mu.Unlock()
		if still {
			w.fail(err, true)
			return false
		}
	}

	for _, c := range comms {
		if err := c.asyncError(); err != nil {
			w.fail(fmt.Errorf("nccl: %s, world rank %d: asynchronous error: %w%s (%w)", c.name, w.rank, err, w.peers(), comm.ErrAborted), true)
			return false
		}
	}
	// Ops queued on one stream complete in order: past the first that is
	// not complete, the others on its stream need no query (and have later
	// deadlines).
	var late *work
	blocked := make(map[*cuda.Stream]bool)
	for _, wk := range pend {
		if blocked[wk.st] || wk.poll() {
			continue
		}
		blocked[wk.st] = true
		if now.After(wk.deadline) && late == nil {
			late = wk
		}
	}
	if late != nil {
		err := w.timeoutError(late.op, late.c.name, late.seq, now.Sub(late.start))
		if !late.poll() { // the peer probe took a while
			w.fail(err, true)
			return false
		}
	}
	w.mu.Lock()
	kept := w.pending[:0]
	for _, wk := range w.pending {
		if !wk.IsDone() {
			kept = append(kept, wk)
		}
	}
	clear(w.pending[len(kept):])
	w.pending = kept
	n := len(kept)
	w.mu.Unlock()
	return busy || n > 0
}

// timeoutError is the world's error when an op of group did not complete
// (or could not even be queued) in time: it names the op, the group, this
// rank, what the heartbeats say about the peers, and NCCL's last error.
func (w *world) timeoutError(op, group string, seq uint64, waited time.Duration) error {
	why := w.peers()
	if last := lastError(); last != "" {
		why += "; NCCL's last error: " + last
	}
	return fmt.Errorf("nccl: %s #%d on %s, world rank %d, did not complete within %v%s: %w",
		op, seq, group, w.rank, waited.Round(time.Millisecond), why, comm.ErrTimeout)
}

// peers says, for an error, which peers are alive: "; world rank 3 sent no
// heartbeat for 2s ...", or "" without heartbeats. It takes two heartbeat
// intervals.
func (w *world) peers() string {
	if w.live == nil {
		return ""
	}
	return "; " + w.live.Probe(2*w.live.Interval())
}

// peerGone fails the world because the heartbeats say a rank is gone.
func (w *world) peerGone(err error) {
	w.fail(fmt.Errorf("nccl: %w (seen by world rank %d) (%w) (%w)", err, w.rank, ErrPeerGone, comm.ErrAborted), true)
}

// remoteAbort fails the world because another rank failed.
func (w *world) remoteAbort(from int, msg string) {
	w.fail(fmt.Errorf("nccl: world rank %d failed: %s (%w)", from, msg, comm.ErrAborted), false)
}

// add registers an open communicator.
func (w *world) add(c *Comm) {
	w.mu.Lock()
	w.comms[c] = struct{}{}
	w.mu.Unlock()
}

// remove unregisters a closed communicator: its pending works fail with
// ErrClosed unless their events show them complete; the last one stops the
// watchdog and frees the pooled events. The caller is bound.
func (w *world) remove(c *Comm) {
	w.mu.Lock()
	delete(w.comms, c)
	var mine []*work
	kept := w.pending[:0]
	for _, wk := range w.pending {
		if wk.c == c {
			mine = append(mine, wk)
		} else {
			kept = append(kept, wk)
		}
	}
	clear(w.pending[len(kept):])
	w.pending = kept
	last := len(w.comms) == 0
	var events []*cuda.Event
	if last {
		events, w.events = w.events, nil
	}
	w.mu.Unlock()
	for _, wk := range mine {
		if !wk.poll() {
			wk.finish(fmt.Errorf("the communicator was closed before the op completed: %w", comm.ErrClosed))
		}
	}
	if last {
		close(w.stop)
		<-w.done
		for _, ev := range events {
			ev.Destroy()
		}
	}
}

// errDeadline is what poll returns when the deadline passes.
var errDeadline = errors.New("deadline")

// poll calls check until it reports done, an error, the deadline or the
// world's failure, backing off from 10 µs to 1 ms between calls.
func (w *world) poll(deadline time.Time, check func() (bool, error)) error {
	d := 10 * time.Microsecond
	for {
		done, err := check()
		if done || err != nil {
			return err
		}
		if err := w.failure(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errDeadline
		}
		hostSleeps.Add(1)
		time.Sleep(d)
		d = min(2*d, time.Millisecond)
	}
}

// state reads a communicator's asynchronous state (ncclCommGetAsyncError):
// ncclSuccess, ncclInProgress, or the error that broke it.
func state(h C.atp_ncclComm) (Result, error) {
	var s C.atp_ncclResult
	if r := Result(C.atp_ncclCommGetAsyncError(h, &s)); r != Success {
		return r, newError("ncclCommGetAsyncError", r)
	}
	return Result(s), nil
}

// settleHandle waits until h, which no other goroutine uses yet, leaves
// ncclInProgress.
func (w *world) settleHandle(call string, h C.atp_ncclComm, deadline time.Time) error {
	return w.poll(deadline, func() (bool, error) {
		s, err := state(h)
		switch {
		case err != nil:
			return false, err
		case s == Success:
			return true, nil
		case s == InProgress:
			return false, nil
		}
		return false, newError(call, s)
	})
}
