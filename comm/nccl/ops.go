package nccl

/*
#include "atp_nccl.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

// devicePointer is what a tensor's buffer must offer for NCCL to move it:
// the device address of its element 0 (tensor/cudabackend's Buffer does).
type devicePointer interface{ Ptr() uint64 }

// call is one NCCL call (or a group of them) on a communicator: it returns
// what it called, for errors, and NCCL's result; or, for work queued
// without NCCL (a local copy), an error when nothing could be queued.
type call func(h C.atp_ncclComm) (string, Result, error)

func (c *Comm) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	const op = comm.OpAllGather
	if err := comm.CheckAllGather(c, dst, src); err != nil {
		return nil, err
	}
	st, dt, ptrs, err := c.prepare(op, s, []string{"dst", "src"}, dst, src)
	if err != nil {
		return nil, err
	}
	pd, ps, n := ptrs[0], ptrs[1], src.Numel()
	sb := uintptr(src.Bytes())
	if overlaps(pd, uintptr(dst.Bytes()), ps, sb) && ps != pd+uintptr(c.rank)*sb {
		return nil, comm.Errorf(c, op, "src %v overlaps dst %v: expected src to be rank %d's part of dst (in place) or disjoint", src, dst, c.rank)
	}
	if n == 0 {
		return comm.Done, nil
	}
	return c.start(op, st, func(h C.atp_ncclComm) (string, Result, error) {
		return "ncclAllGather", Result(C.atp_ncclAllGather(C.uintptr_t(ps), C.uintptr_t(pd), C.size_t(n), C.int(dt), h, stream(st))), nil
	})
}

func (c *Comm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	const name = comm.OpReduceScatter
	if err := comm.CheckReduceScatter(c, dst, src, op); err != nil {
		return nil, err
	}
	st, dt, ptrs, err := c.prepare(name, s, []string{"dst", "src"}, dst, src)
	if err != nil {
		return nil, err
	}
	rop, err := redOp(op)
	if err != nil {
		return nil, comm.Errorf(c, name, "%v", err)
	}
	pd, ps, n := ptrs[0], ptrs[1], dst.Numel()
	db := uintptr(dst.Bytes())
	if overlaps(pd, db, ps, uintptr(src.Bytes())) && pd != ps+uintptr(c.rank)*db {
		return nil, comm.Errorf(c, name, "dst %v overlaps src %v: expected dst to be rank %d's part of src (in place) or disjoint", dst, src, c.rank)
	}
	if n == 0 {
		return comm.Done, nil
	}
	return c.start(name, st, func(h C.atp_ncclComm) (string, Result, error) {
		return "ncclReduceScatter", Result(C.atp_ncclReduceScatter(C.uintptr_t(ps), C.uintptr_t(pd), C.size_t(n), C.int(dt), C.int(rop), h, stream(st))), nil
	})
}

func (c *Comm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	const name = comm.OpAllReduce
	if err := comm.CheckAllReduce(c, buf, op); err != nil {
		return nil, err
	}
	st, dt, ptrs, err := c.prepare(name, s, []string{"buf"}, buf)
	if err != nil {
		return nil, err
	}
	rop, err := redOp(op)
	if err != nil {
		return nil, comm.Errorf(c, name, "%v", err)
	}
	p, n := ptrs[0], buf.Numel()
	if n == 0 {
		return comm.Done, nil
	}
	return c.start(name, st, func(h C.atp_ncclComm) (string, Result, error) {
		return "ncclAllReduce", Result(C.atp_ncclAllReduce(C.uintptr_t(p), C.uintptr_t(p), C.size_t(n), C.int(dt), C.int(rop), h, stream(st))), nil
	})
}

func (c *Comm) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	const op = comm.OpBroadcast
	if err := comm.CheckBroadcast(c, buf, root); err != nil {
		return nil, err
	}
	st, dt, ptrs, err := c.prepare(op, s, []string{"buf"}, buf)
	if err != nil {
		return nil, err
	}
	p, n := ptrs[0], buf.Numel()
	if n == 0 {
		return comm.Done, nil
	}
	return c.start(op, st, func(h C.atp_ncclComm) (string, Result, error) {
		return "ncclBroadcast", Result(C.atp_ncclBroadcast(C.uintptr_t(p), C.uintptr_t(p), C.size_t(n), C.int(dt), C.int(root), h, stream(st))), nil
	})
}

// AllToAllV runs as one group of ncclSend and ncclRecv calls, one pair per
// peer with a nonzero count (this rank included: NCCL copies to itself),
// issued in one call into C. A rank that exchanges rows with itself only
// (every rank of a world of one) calls no NCCL at all: its own part is a
// device-to-device copy on the stream, as NCCL itself does for the
// collectives of a communicator of one rank, which saves the launch thread
// NCCL starts for every group of a non-blocking communicator.
func (c *Comm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	const op = comm.OpAllToAllV
	if err := comm.CheckAllToAllV(c, dst, src, sendCounts, recvCounts); err != nil {
		return nil, err
	}
	st, dt, ptrs, err := c.prepare(op, s, []string{"dst", "src"}, dst, src)
	if err != nil {
		return nil, err
	}
	pd, ps := ptrs[0], ptrs[1]
	if overlaps(pd, uintptr(dst.Bytes()), ps, uintptr(src.Bytes())) {
		return nil, comm.Errorf(c, op, "dst %v overlaps src %v: expected disjoint buffers", dst, src)
	}
	if ns, nr := sendCounts[c.rank], recvCounts[c.rank]; ns != nr {
		return nil, comm.Errorf(c, op, "sendCounts[%d] = %d rows to itself, recvCounts[%d] = %d rows from itself: expected the same count (%w)",
			c.rank, ns, c.rank, nr, comm.ErrMismatch)
	}
	row := tensor.Shape(src.Shape()[1:]).Numel() // elements per row
	rowBytes := uintptr(row * src.DType().Size())
	parts := make([]C.atp_nccl_p2p, 0, 2*c.size)
	var soff, roff, selfSrc, selfDst uintptr
	peers := false
	for j := range c.size {
		if j == c.rank {
			selfSrc, selfDst = ps+soff, pd+roff
		}
		if n := sendCounts[j] * row; n > 0 {
			parts = append(parts, C.atp_nccl_p2p{buf: C.uintptr_t(ps + soff), count: C.size_t(n), peer: C.int(j), send: 1})
			peers = peers || j != c.rank
		}
		if n := recvCounts[j] * row; n > 0 {
			parts = append(parts, C.atp_nccl_p2p{buf: C.uintptr_t(pd + roff), count: C.size_t(n), peer: C.int(j), send: 0})
			peers = peers || j != c.rank
		}
		soff += uintptr(sendCounts[j]) * rowBytes
		roff += uintptr(recvCounts[j]) * rowBytes
	}
	if len(parts) == 0 {
		return comm.Done, nil // this rank neither sends nor receives
	}
	if !peers {
		bytes := sendCounts[c.rank] * int(rowBytes)
		return c.start(op, st, func(C.atp_ncclComm) (string, Result, error) {
			return "cuMemcpyDtoDAsync", Success, cuda.CopyDtoDAsync(cuda.DevicePtr(selfDst), cuda.DevicePtr(selfSrc), bytes, st)
		})
	}
	return c.start(op, st, func(h C.atp_ncclComm) (string, Result, error) {
		var failed C.int
		r := Result(C.atp_nccl_group_p2p(&parts[0], C.int(len(parts)), C.int(dt), h, stream(st), &failed))
		switch {
		case failed == -2:
			return "ncclGroupStart", r, nil
		case failed >= 0:
			return fmt.Sprintf("ncclSend/ncclRecv with rank %d", parts[failed].peer), r, nil
		}
		return "ncclGroupEnd", r, nil
	})
}

// Barrier runs a one-element all-reduce on the group's own stream and waits
// for it on the host (within the op timeout).
func (c *Comm) Barrier() error {
	const op = comm.OpBarrier
	p := uintptr(c.scratch)
	wk, err := c.launch(op, c.stream, func(h C.atp_ncclComm) (string, Result, error) {
		return "ncclAllReduce", Result(C.atp_ncclAllReduce(C.uintptr_t(p), C.uintptr_t(p), 1, ncclFloat32, ncclSum, h, stream(c.stream))), nil
	})
	if err != nil {
		return err
	}
	return wk.Wait(nil)
}

// stream is a stream's handle for NCCL.
func stream(s *cuda.Stream) C.atp_cudaStream { return C.atp_cudaStream(s.Handle()) }

// streamOf resolves the stream argument of an op: nil is the group's own
// stream, a *cuda.Stream is used as is (a nil *cuda.Stream is CUDA's legacy
// default stream).
func (c *Comm) streamOf(op string, s comm.Stream) (*cuda.Stream, error) {
	switch v := s.(type) {
	case nil:
		return c.stream, nil
	case *cuda.Stream:
		return v, nil
	}
	return nil, comm.Errorf(c, op, "stream %T: expected a *cuda.Stream, or nil for the group's own stream", s)
}

// prepare checks what the Check functions do not: the stream, the dtype,
// and that every tensor is device memory on this group's GPU; it returns
// the stream, NCCL's dtype and the device address of each tensor.
func (c *Comm) prepare(op string, s comm.Stream, names []string, ts ...*tensor.Tensor) (*cuda.Stream, int, []uintptr, error) {
	st, err := c.streamOf(op, s)
	if err != nil {
		return nil, 0, nil, err
	}
	dt, err := dataType(ts[0].DType())
	if err != nil {
		return nil, 0, nil, comm.Errorf(c, op, "%v: %v", ts[0], err)
	}
	ptrs := make([]uintptr, len(ts))
	for i, t := range ts {
		if d := t.Device(); d.Kind != tensor.CUDA || d.Index != c.w.dev {
			return nil, 0, nil, comm.Errorf(c, op, "%s %v is on %v: expected a tensor on cuda:%d", names[i], t, d, c.w.dev)
		}
		b, ok := t.Buffer().(devicePointer)
		if !ok {
			return nil, 0, nil, comm.Errorf(c, op, "%s %v has a %T buffer: expected device memory whose buffer has Ptr() (such as tensor/cudabackend's)", names[i], t, t.Buffer())
		}
		if b.Ptr() == 0 {
			return nil, 0, nil, comm.Errorf(c, op, "%s %v: expected device memory, found none (freed, or its allocation failed)", names[i], t)
		}
		ptrs[i] = uintptr(b.Ptr()) + uintptr(t.Offset()*t.DType().Size())
	}
	return st, dt, ptrs, nil
}

// overlaps reports whether [a, a+na) and [b, b+nb) intersect.
func overlaps(a, na, b, nb uintptr) bool {
	return na > 0 && nb > 0 && a < b+nb && b < a+na
}

// usable returns the error of an op on a closed group or a failed world
// (c.mu is held).
func (c *Comm) usable(op string) error {
	if c.closed {
		return comm.Errorf(c, op, "the communicator is closed: %w", comm.ErrClosed)
	}
	if err := c.w.failure(); err != nil {
		return &comm.Error{Op: op, Group: c.name, Rank: c.rank, Err: err}
	}
	if c.handle() == 0 {
		return comm.Errorf(c, op, "the communicator was aborted: %w", comm.ErrAborted)
	}
	return nil
}

// start is launch for the ops that return a comm.Work (a nil interface on
// failure, not a nil *work).
func (c *Comm) start(op string, st *cuda.Stream, fn call) (comm.Work, error) {
	wk, err := c.launch(op, st, fn)
	if err != nil {
		return nil, err
	}
	return wk, nil
}

// launch runs an NCCL call on the group and returns its Work: an event
// recorded on st after the call, which the watchdog polls until it
// completes or its deadline passes. When NCCL answers ncclInProgress (on a
// non-blocking communicator, NCCL 2.19 and later hand every group, and every
// collective of several ranks, to a launch thread), launch polls the
// communicator until the call is queued: without sleeping for the world's
// spin time, with c.mu held (NCCL refuses any other call on the
// communicator meanwhile), then with sleeps between polls (connections being
// set up, NCCL's queue full), within the deadline.
func (c *Comm) launch(op string, st *cuda.Stream, fn call) (*work, error) {
	unbind, err := c.w.bind()
	if err != nil {
		return nil, comm.Errorf(c, op, "%w", err)
	}
	defer unbind()
	start := time.Now()
	deadline := start.Add(c.w.opts.timeout)
	seq := c.seq.Add(1)

	// The watchdog times the call out too: NCCL may block in it (its work
	// queue full while a peer is missing).
	defer c.w.enter(c, op, seq, start, deadline)()
	c.mu.Lock()
	if err := c.usable(op); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	h := c.handle()
	what, r, lerr := fn(h)
	var serr error
	if lerr == nil && r == InProgress {
		// NCCL (2.19 and later) hands every group on a non-blocking
		// communicator, and every collective of one of several ranks,
		// to a launch thread and answers ncclInProgress; the
		// communicator takes no other call until it says ncclSuccess.
		// The thread is done in tens of microseconds: poll for it here
		// without sleeping (a Go sleep lasts a millisecond).
		r, serr = spinState(h, what, c.w.opts.spin)
	}
	c.mu.Unlock()
	switch {
	case lerr != nil:
		// Nothing was queued, NCCL was not called: the world is fine.
		return nil, &comm.Error{Op: op, Group: c.name, Rank: c.rank, Err: lerr}
	case serr != nil:
		return nil, c.failed(op, seq, start, serr)
	case r == Success:
	case r == InProgress:
		if err := c.settle(what, deadline); err != nil {
			return nil, c.failed(op, seq, start, err)
		}
	default:
		return nil, c.failed(op, seq, start, newError(what, r))
	}
	ev, err := c.w.event()
	if err == nil {
		err = ev.Record(st)
	}
	if err != nil {
		// The op is queued but cannot be tracked: the world cannot go on.
		err = fmt.Errorf("nccl: cannot track %s #%d on %s: %w (%w)", op, seq, c.name, err, comm.ErrAborted)
		c.w.fail(err, true)
		return nil, &comm.Error{Op: op, Group: c.name, Rank: c.rank, Err: err}
	}
	wk := newWork(c, op, seq, st, ev, start, deadline)
	c.w.track(wk)
	return wk, nil
}

// spinState polls h's state for at most d without sleeping, after what
// answered ncclInProgress (c.mu is held, so that an abort cannot free h
// meanwhile: abortNCCL waits far longer than d for it). It returns Success,
// or InProgress when d was not enough, or the error that broke the
// communicator.
func spinState(h C.atp_ncclComm, what string, d time.Duration) (Result, error) {
	var s C.atp_ncclResult
	if r := Result(C.atp_nccl_settle(h, C.int64_t(d), &s)); r != Success {
		return r, newError("ncclCommGetAsyncError", r)
	}
	switch s := Result(s); s {
	case Success, InProgress:
		return s, nil
	default:
		return s, newError(what+" (asynchronous part)", s)
	}
}

// settle polls the communicator until the call NCCL answered with
// ncclInProgress is done, sleeping between polls (spinState did not see it
// done in time: connections are being set up, or NCCL's queue is full).
func (c *Comm) settle(what string, deadline time.Time) error {
	return c.w.poll(deadline, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		h := c.handle()
		if h == 0 {
			return false, comm.ErrAborted
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
		return false, newError(what+" (asynchronous part)", s)
	})
}

// failed turns the failure of a call into the op's error. A deadline or an
// error that broke the communicator fails the world; an error NCCL found in
// the arguments leaves the group usable.
func (c *Comm) failed(op string, seq uint64, start time.Time, err error) error {
	if werr := c.w.failure(); werr != nil {
		return &comm.Error{Op: op, Group: c.name, Rank: c.rank, Err: werr}
	}
	switch {
	case errors.Is(err, errDeadline):
		err = c.w.timeoutError(op, c.name, seq, time.Since(start))
		c.w.fail(err, true)
	case c.asyncError() != nil || !errors.Is(err, InvalidArgument) && !errors.Is(err, InvalidUsage):
		err = fmt.Errorf("%w%s (%w)", err, c.w.peers(), comm.ErrAborted)
		c.w.fail(fmt.Errorf("nccl: %s #%d on %s, world rank %d: %w", op, seq, c.name, c.w.rank, err), true)
	}
	return &comm.Error{Op: op, Group: c.name, Rank: c.rank, Err: err}
}
