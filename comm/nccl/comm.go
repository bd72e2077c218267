package nccl

/*
#include <stdlib.h>
#include <string.h>
#include "atp_nccl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/worldsetup"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/cuda"
)

// DefaultTimeout is the deadline of every op (and of New, when its context
// has none) unless WithTimeout says otherwise. The first op on a group also
// sets up NCCL's connections, which can take seconds.
const DefaultTimeout = 5 * time.Minute

// Default heartbeat of a world of several ranks (see WithHeartbeat).
const (
	DefaultHeartbeat = time.Second
	DefaultLostAfter = 15 * time.Second
)

// Option configures New.
type Option func(*options)

type options struct {
	timeout    time.Duration
	label      string
	key        string
	heartbeat  time.Duration
	lostAfter  time.Duration
	poll       time.Duration // watchdog period while ops are pending
	idlePoll   time.Duration // watchdog period otherwise
	spin       time.Duration // how long a host wait polls before it sleeps (see hostSpin)
	blocking   int           // ncclConfig_t.blocking: always 0
	streamPrio *int
}

func defaultOptions() options {
	return options{timeout: DefaultTimeout, label: "world", heartbeat: DefaultHeartbeat, lostAfter: DefaultLostAfter,
		poll: time.Millisecond, idlePoll: 20 * time.Millisecond, spin: hostSpin}
}

// hostSpin is how long a host wait polls without sleeping (ncclInProgress
// after an NCCL call, Work.Wait(nil)) before it backs off to sleeps. A Go
// sleep or timer lasts about a millisecond at least on Linux, whatever it
// asks for (the runtime waits for timers in epoll_wait, whose timeout is in
// milliseconds), so a wait that sleeps costs an op a millisecond: NCCL's
// launch thread of a non-blocking group is done in tens of microseconds, a
// small op on the GPU in a few.
const hostSpin = 2 * time.Millisecond

// WithTimeout sets the deadline of every op: an op whose event has not
// completed d after it was queued fails the world with an error that wraps
// comm.ErrTimeout. d ≤ 0 keeps DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithLabel sets the label of the world's Name (default "world": "world[0 1]").
func WithLabel(label string) Option { return func(o *options) { o.label = label } }

// WithKey sets the prefix of the store keys of this world (the unique id, the
// heartbeats, the abort key). By default the k-th New on a store client uses
// "asynctp/nccl/<k>", which agrees between ranks as long as they create their
// worlds in the same order.
func WithKey(prefix string) Option { return func(o *options) { o.key = prefix } }

// WithHeartbeat sets how often each rank of a world of several ranks bumps
// its heartbeat in the store, and after how long without one a peer counts
// as gone (which fails the world with ErrPeerGone, naming it). interval < 0
// turns heartbeats and the store's abort key off: then a dead peer is only
// noticed at the deadline, and an Abort reaches only this process.
// interval = 0 or lost ≤ interval keeps the defaults.
func WithHeartbeat(interval, lost time.Duration) Option {
	return func(o *options) {
		if interval < 0 {
			o.heartbeat = -1
			return
		}
		if interval > 0 {
			o.heartbeat = interval
		}
		if lost > o.heartbeat {
			o.lostAfter = lost
		}
	}
}

// WithStreamPriority gives the groups' own streams a priority (see
// cuda.StreamPriorityRange; lower is higher), so that communication
// launched on them can overtake computation.
func WithStreamPriority(p int) Option { return func(o *options) { o.streamPrio = &p } }

// Comm is one rank's handle on a group of an NCCL world: the world made by
// New or a group split from it. It implements comm.Comm, comm.Aborter and
// comm.NamedSplitter.
type Comm struct {
	w       *world
	rank    int
	size    int
	label   string
	name    string
	members []int // world rank of each group rank
	isWorld bool
	stream  *cuda.Stream   // the group's own stream (a nil comm.Stream)
	scratch cuda.DevicePtr // 8·size bytes for Barrier and Split
	out     unsafe.Pointer // C memory NCCL wrote the handle to
	seq     atomic.Uint64  // ops queued

	// mu serialises the NCCL calls on the communicator and guards closed. h
	// is read under mu too, but an abort may clear it without mu: a call
	// that hangs inside NCCL holds mu until the abort makes it return.
	mu     sync.Mutex
	h      atomic.Uintptr // the ncclComm_t; 0 once closed or aborted
	closed bool
}

var (
	_ comm.Comm          = (*Comm)(nil)
	_ comm.Aborter       = (*Comm)(nil)
	_ comm.NamedSplitter = (*Comm)(nil)
)

// New makes this process's rank of an NCCL world of size ranks on CUDA
// device ordinal device. It is collective: every rank calls it, with the
// same size and options, and its own rank. Rank 0 makes NCCL's unique id and
// the store carries it to the others (store may be nil for a world of one
// rank); every rank then initialises its communicator in non-blocking mode
// and polls it until it is ready, ctx is done, or its deadline (ctx's, or
// the op timeout) passes, when the communicator is aborted.
//
// New loads the library first (see Load; log its result once at start-up).
// The returned Comm must be closed; it owns a CUDA stream on the device (the
// stream of ops given a nil comm.Stream) and, for a world of several ranks,
// two goroutines that keep its heartbeat in the store and watch for another
// rank's failure.
func New(ctx context.Context, store *rendezvous.Client, rank, size, device int, opts ...Option) (*Comm, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	if err := worldsetup.CheckGPU("nccl", rank, size, device, store); err != nil {
		return nil, err
	}
	lib, err := Load()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = start.Add(o.timeout)
	}
	where := fmt.Sprintf("nccl: world rank %d of %d on cuda:%d", rank, size, device)

	d, err := cuda.GetDevice(device)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	cctx, err := d.PrimaryContext()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	w := newWorld(lib, device, cctx, rank, size, o)
	unbind, err := w.bind()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	defer unbind()

	prefix := o.key
	if prefix == "" && store != nil {
		prefix = worldsetup.Prefix(store, "nccl")
	}
	var id []byte
	if rank == 0 {
		if id, err = uniqueID(); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	if size > 1 {
		if id, err = store.BroadcastBytes(ctx, prefix+"/uid", rank, 0, id); err != nil {
			return nil, fmt.Errorf("%s: sharing the unique id: %w", where, err)
		}
	}
	if len(id) != uniqueIDBytes {
		return nil, fmt.Errorf("%s: the unique id from rank 0 has %d bytes, expected %d", where, len(id), uniqueIDBytes)
	}
	if size > 1 && o.heartbeat > 0 {
		// Before the init, so that a rank that dies during it is named.
		if w.live, err = rendezvous.StartLiveness(store, rendezvous.LivenessConfig{Prefix: prefix, Rank: rank, Size: size,
			Interval: o.heartbeat, Lost: o.lostAfter, OnGone: w.peerGone, OnAbort: w.remoteAbort}); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	c, err := initWorld(ctx, w, id, start, deadline)
	if err != nil {
		if w.live != nil {
			w.live.Close(false)
		}
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	go w.watch()
	return c, nil
}

// initWorld makes the world's communicator and wraps it.
func initWorld(ctx context.Context, w *world, id []byte, start, deadline time.Time) (*Comm, error) {
	h, out, err := initHandle(ctx, w, id, start, deadline)
	if err != nil {
		return nil, err
	}
	c, err := newComm(w, h, out, w.rank, seqRanks(w.size), w.opts.label, true)
	if err != nil {
		C.atp_ncclCommAbort(h)
		return nil, err
	}
	return c, nil
}

// initHandle runs ncclCommInitRankConfig (non-blocking) and polls the new
// communicator until it is ready; on failure it is aborted. out is the C
// memory NCCL wrote the handle to (free it once the handle is destroyed).
func initHandle(ctx context.Context, w *world, id []byte, start, deadline time.Time) (h C.atp_ncclComm, out unsafe.Pointer, err error) {
	var cid C.atp_ncclUniqueId
	C.memcpy(unsafe.Pointer(&cid), unsafe.Pointer(&id[0]), uniqueIDBytes)
	out = C.calloc(1, C.size_t(unsafe.Sizeof(C.atp_ncclComm(0))))
	hp := (*C.atp_ncclComm)(out)
	r := Result(C.atp_ncclCommInitRankConfig(hp, C.int(w.size), &cid, C.int(w.rank), C.int(w.opts.blocking)))
	h = C.atp_nccl_load_handle(hp)
	call := fmt.Sprintf("ncclCommInitRankConfig(%d ranks, rank %d)", w.size, w.rank)
	if r != Success && r != InProgress || h == 0 {
		err := newError(call, r)
		if h != 0 {
			C.atp_ncclCommAbort(h)
		}
		return 0, nil, err // out is leaked: NCCL may still hold it
	}
	err = w.poll(deadline, func() (bool, error) {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		s, err := state(h)
		switch {
		case err != nil:
			return false, err
		case s == Success:
			return true, nil
		case s == InProgress:
			return false, nil
		}
		return false, newError(call+" (asynchronous part)", s)
	})
	if err != nil {
		C.atp_ncclCommAbort(h)
		if errors.Is(err, errDeadline) {
			return 0, nil, w.timeoutError("init", comm.GroupName(w.opts.label, seqRanks(w.size)), 0, time.Since(start))
		}
		return 0, nil, fmt.Errorf("initialising the communicator: %w", err)
	}
	return h, out, nil
}

// abortHandle aborts a communicator that no Comm holds.
func abortHandle(h C.atp_ncclComm) Result { return Result(C.atp_ncclCommAbort(h)) }

// seqRanks is 0, 1, ..., n-1.
func seqRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

// newComm wraps a ready NCCL communicator: it checks NCCL's idea of its rank
// and size, creates the group's stream and scratch memory, and registers it
// with the world. The caller is bound.
func newComm(w *world, h C.atp_ncclComm, out unsafe.Pointer, rank int, members []int, label string, isWorld bool) (*Comm, error) {
	var n, r C.int
	if res := Result(C.atp_ncclCommCount(h, &n)); res != Success {
		return nil, newError("ncclCommCount", res)
	}
	if res := Result(C.atp_ncclCommUserRank(h, &r)); res != Success {
		return nil, newError("ncclCommUserRank", res)
	}
	if int(n) != len(members) || int(r) != rank {
		return nil, fmt.Errorf("NCCL made rank %d of %d ranks, expected rank %d of %d (world ranks %v)", r, n, rank, len(members), members)
	}
	c := &Comm{w: w, out: out, rank: rank, size: len(members), label: label,
		name: comm.GroupName(label, members), members: members, isWorld: isWorld}
	c.h.Store(uintptr(h))
	var err error
	if w.opts.streamPrio != nil {
		c.stream, err = cuda.NewStreamWithPriority(*w.opts.streamPrio)
	} else {
		c.stream, err = cuda.NewStream()
	}
	if err != nil {
		return nil, err
	}
	if c.scratch, err = cuda.Alloc(max(8*c.size, 256)); err != nil {
		c.stream.Destroy()
		return nil, err
	}
	if err := cuda.MemsetD8Async(c.scratch, 0, max(8*c.size, 256), c.stream); err != nil {
		cuda.Free(c.scratch)
		c.stream.Destroy()
		return nil, err
	}
	w.add(c)
	return c, nil
}

// Rank is this rank's index in the group.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the group.
func (c *Comm) Size() int { return c.size }

// Name is the group's label and the world ranks of its members: "world[0 1]",
// "tp[2 3]".
func (c *Comm) Name() string { return c.name }

// Members returns the world rank of each rank of the group.
func (c *Comm) Members() []int { return append([]int(nil), c.members...) }

// Device is the CUDA ordinal the group runs on.
func (c *Comm) Device() int { return c.w.dev }

// Stream is the group's own stream: where ops given a nil comm.Stream run.
func (c *Comm) Stream() *cuda.Stream { return c.stream }

// Library is the NCCL the world runs on.
func (c *Comm) Library() Library { return c.w.lib }

// Abort fails the whole world (every group split from it, on every rank):
// every pending and later op fails with an error that names this rank and
// wraps err and comm.ErrAborted, every communicator is aborted with
// ncclCommAbort, and the other ranks learn of it through the store (their
// errors carry err's message). Close still has to be called.
func (c *Comm) Abort(err error) {
	c.w.fail(fmt.Errorf("world rank %d aborted: %w (%w)", c.w.rank, err, comm.ErrAborted), true)
}

// handle is the ncclComm_t, 0 once closed or aborted.
func (c *Comm) handle() C.atp_ncclComm { return C.atp_ncclComm(c.h.Load()) }

// abortNCCL aborts this communicator's NCCL handle (the world failed). It
// waits a little for a call in progress to return; a call that hangs inside
// NCCL is aborted under it (ncclCommAbort is made for that: NCCL's waits
// check the abort flag).
func (c *Comm) abortNCCL() {
	locked := tryLock(&c.mu, 200*time.Millisecond)
	h := C.atp_ncclComm(c.h.Swap(0))
	if locked {
		c.mu.Unlock()
	}
	if h != 0 {
		C.atp_ncclCommAbort(h)
	}
}

// tryLock locks mu if it can within d.
func tryLock(mu *sync.Mutex, d time.Duration) bool {
	end := time.Now().Add(d)
	for !mu.TryLock() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// asyncError is the communicator's asynchronous error, or nil. It does not
// wait for a call in progress (the watchdog must not hang on one).
func (c *Comm) asyncError() error {
	if !c.mu.TryLock() {
		return nil
	}
	defer c.mu.Unlock()
	h := c.handle()
	if h == 0 {
		return nil
	}
	s, err := state(h)
	switch {
	case err != nil:
		return err
	case s == Success || s == InProgress:
		return nil
	}
	return newError("ncclCommGetAsyncError", s)
}

// Close releases this rank's part of the group: ncclCommFinalize (waiting
// for its ops to complete, until the op timeout) then ncclCommDestroy, or
// ncclCommAbort if finalizing fails or the world has failed. Ops after Close
// fail with comm.ErrClosed. Closing the world Comm also stops its
// heartbeats; groups split from it stay usable until closed.
func (c *Comm) Close() error {
	unbind, berr := c.w.bind()
	if berr == nil {
		defer unbind()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	h := C.atp_ncclComm(c.h.Swap(0))
	c.mu.Unlock()

	var errs []error
	if berr != nil {
		errs = append(errs, berr)
	}
	if h != 0 {
		errs = append(errs, c.destroy(h))
	}
	quiet := true // NCCL no longer uses this communicator's memory
	if c.w.failure() != nil {
		quiet = c.w.waitAborted()
	}
	if c.isWorld && c.w.live != nil {
		c.w.live.Close(c.w.failure() == nil)
	}
	c.w.remove(c)
	if c.stream != nil {
		errs = append(errs, c.stream.Destroy())
	}
	if quiet {
		errs = append(errs, cuda.Free(c.scratch))
		if c.out != nil {
			C.free(c.out)
			c.out = nil
		}
	} else {
		errs = append(errs, fmt.Errorf("ncclCommAbort did not return within %v: the communicator's memory is leaked", abortWait))
	}
	if err := errors.Join(errs...); err != nil {
		return &comm.Error{Op: "close", Group: c.name, Rank: c.rank, Err: err}
	}
	return nil
}

// destroy finalizes and destroys h, aborting it if that fails.
func (c *Comm) destroy(h C.atp_ncclComm) error {
	if c.w.failure() != nil {
		C.atp_ncclCommAbort(h)
		return nil
	}
	r := Result(C.atp_ncclCommFinalize(h))
	var err error
	switch r {
	case Success:
	case InProgress:
		err = c.w.settleHandle("ncclCommFinalize", h, time.Now().Add(c.w.opts.timeout))
	default:
		err = newError("ncclCommFinalize", r)
	}
	if err != nil {
		C.atp_ncclCommAbort(h)
		if errors.Is(err, errDeadline) {
			err = fmt.Errorf("ncclCommFinalize did not complete within %v: aborted: %w", c.w.opts.timeout, comm.ErrTimeout)
		}
		if c.w.failure() != nil {
			return nil // the world failed meanwhile: the op errors say why
		}
		return err
	}
	if r := Result(C.atp_ncclCommDestroy(h)); r != Success && r != InProgress {
		return newError("ncclCommDestroy", r)
	}
	return nil
}
