package nvshmem

import (
	"fmt"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/gpuwork"
	"github.com/asynctp/asynctp/tensor"
)

// work is the comm.Work of one queued op: an event recorded on the group's
// stream right after it. The watchdog (or a host wait) polls the event; once
// it has completed and no kernel of the group recorded a failure, the work is
// done and the event goes back to the world's pool. A work fails when the
// world fails before it completes.
type work struct {
	c        *Comm
	op       string
	seq      uint64
	deadline time.Time
	keep     []*tensor.Tensor // the op's tensors, alive until it is done

	gpuwork.State[uint64] // Ev: 0 once done
}

// Wait orders the stream s after the op and returns at once: s waits on the
// op's event, with no host synchronisation. Wait(nil) blocks the host until
// the op has completed (or failed). Wait returns the op's error if it is
// known by then: an op that fails later makes s wait until its kernels give
// up (WithTimeout), and the next op, Wait or Barrier returns the error. Wait
// may be called any number of times.
func (wk *work) Wait(s comm.Stream) error {
	if s == nil {
		return wk.hostWait()
	}
	h, _, err := streamOf(s)
	if err != nil {
		return comm.Errorf(wk.c, wk.op, "%v", err)
	}
	wk.Mu.Lock()
	defer wk.Mu.Unlock()
	if wk.Done {
		return wk.Err
	}
	if err := cStreamWaitEvent(wk.c.w.dev, h, wk.Ev); err != nil {
		return comm.Errorf(wk.c, wk.op, "making stream %#x wait for it: %w", h, err)
	}
	return nil
}

// hostWait polls the op until it is done.
func (wk *work) hostWait() error {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for d := time.Duration(0); ; {
		if wk.poll(time.Now()) {
			return wk.Result()
		}
		if d == 0 {
			d = 5 * time.Microsecond // short ops complete in microseconds
		} else {
			d = min(2*d, time.Millisecond)
		}
		t.Reset(d)
		select {
		case <-wk.Fin:
			return wk.Result()
		case <-t.C:
		}
	}
}

// poll checks the op once and reports whether it is done: it finishes the
// op when its event has completed, and fails the world when the op is past
// its deadline, its event cannot be queried, or a kernel of the group gave
// up.
func (wk *work) poll(now time.Time) bool {
	wk.Mu.Lock()
	if wk.Done {
		wk.Mu.Unlock()
		return true
	}
	ok, err := cEventQuery(wk.c.w.dev, wk.Ev)
	wk.Mu.Unlock()
	c := wk.c
	var ferr error
	switch {
	case err != nil:
		ferr = fmt.Errorf("%s #%d on %s, world rank %d: polling its event: %w (%w)", wk.op, wk.seq, c.name, c.w.rank, err, comm.ErrAborted)
	case ok:
		ferr = c.kernelFailure()
	case now.After(wk.deadline):
		ferr = fmt.Errorf("%s #%d on %s, world rank %d: not complete %v after it was queued (a rank did not join it, or the GPU is stuck): %w",
			wk.op, wk.seq, c.name, c.w.rank, c.w.opts.timeout+grace(c.w.opts.timeout), comm.ErrTimeout)
	default:
		return false
	}
	if ferr == nil {
		wk.finish(nil)
		return true
	}
	c.w.fail(ferr)
	wk.finish(c.w.failure()) // the world's first failure, maybe another group's
	return true
}

// finish marks the work done with err (nil: completed).
func (wk *work) finish(err error) {
	ev, ok := wk.Finish(err, wk.op, wk.c.name, wk.c.rank)
	if !ok {
		return
	}
	wk.keep = nil
	if err == nil {
		wk.c.w.recycle(ev) // a failed op's event may still be pending: it leaks
	}
}

// poll polls the group's queued ops (the watchdog) and drops the finished
// ones; it reports whether some are still pending.
func (c *Comm) poll(now time.Time) bool {
	c.mu.Lock()
	pending := append([]*work(nil), c.pending...)
	c.mu.Unlock()
	if len(pending) == 0 {
		if err := c.kernelFailure(); err != nil {
			c.w.fail(err)
		}
		return false
	}
	for _, wk := range pending {
		if !wk.poll(now) {
			break // later ops of the group complete after this one
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = slicesDeleteDone(c.pending)
	return len(c.pending) > 0
}

func slicesDeleteDone(ws []*work) []*work {
	out := ws[:0]
	for _, wk := range ws {
		if !wk.IsDone() {
			out = append(out, wk)
		}
	}
	clear(ws[len(out):])
	return out
}

// failPending fails the group's queued ops with err.
func (c *Comm) failPending(err error) {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, wk := range pending {
		wk.finish(err)
	}
}

// kernelFailure reads the group's failure record: the error of a kernel
// that gave up waiting, naming the rank it waited for, or nil.
func (c *Comm) kernelFailure() error {
	if c.slot < 0 || c.size < 2 {
		return nil
	}
	r := cReadRecord(c.w.recs, c.slot)
	if r.code == 0 {
		return nil
	}
	what := fmt.Sprintf("do its part (failure code %d)", r.code)
	switch r.code {
	case errDataTimeout:
		what = "send its data"
	case errAckTimeout:
		what = "take its data (free the staging)"
	case errBarrierTimeout:
		what = "reach the barrier"
	case errNoP2P:
		what = "map its staging for P2P loads and stores (nvshmem_ptr gave no address)"
	}
	op := "op"
	c.mu.Lock()
	for _, wk := range c.pending {
		if int32(wk.seq) == int32(r.op) {
			op = wk.op
		}
	}
	c.mu.Unlock()
	peer := fmt.Sprintf("rank %d", r.peer)
	if r.peer >= 0 && r.peer < c.size {
		peer = fmt.Sprintf("rank %d (world rank %d)", r.peer, c.members[r.peer])
	}
	return fmt.Errorf("%s #%d on %s, rank %d: %s did not %s within %v (block %d of the kernel gave up): %w",
		op, r.op, c.name, c.rank, peer, what, time.Duration(r.waitedNs).Round(time.Millisecond), r.block, comm.ErrTimeout)
}
