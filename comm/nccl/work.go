package nccl

import (
	"fmt"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/gpuwork"
	"github.com/asynctp/asynctp/cuda"
)

// work is the comm.Work of one queued op: an event recorded on the op's
// stream right after it. The watchdog (or a host wait) polls the event;
// once it has completed the work is done and the event goes back to the
// world's pool. A work fails when the world fails before it completes (its
// deadline passed, NCCL reported an error, a peer is gone, an abort).
type work struct {
	c               *Comm
	op              string
	seq             uint64
	st              *cuda.Stream // the stream it was queued on
	start, deadline time.Time

	gpuwork.State[*cuda.Event] // Ev: nil once done
}

func newWork(c *Comm, op string, seq uint64, st *cuda.Stream, ev *cuda.Event, start, deadline time.Time) *work {
	return &work{c: c, op: op, seq: seq, st: st, start: start, deadline: deadline,
		State: gpuwork.State[*cuda.Event]{Ev: ev, Fin: make(chan struct{})}}
}

// Wait orders the stream s after the op and returns at once: s waits on the
// op's event (cuStreamWaitEvent), with no host synchronisation. Wait(nil)
// instead blocks the host until the op has completed (the nil stream is the
// caller's default, and on the host that is synchronous), within the op's
// deadline. Wait returns the op's error if it is known by then: an op that
// fails later (a peer that never arrives) makes s wait until the world is
// aborted, and the next op, Wait or Barrier returns the error. Wait may be
// called any number of times.
func (wk *work) Wait(s comm.Stream) error {
	if s == nil {
		return wk.hostWait()
	}
	st, err := wk.c.streamOf(wk.op, s)
	if err != nil {
		return err
	}
	unbind, err := wk.c.w.bind()
	if err != nil {
		return comm.Errorf(wk.c, wk.op, "%w", err)
	}
	defer unbind()
	wk.Mu.Lock()
	defer wk.Mu.Unlock()
	if wk.Done {
		return wk.Err
	}
	if err := st.WaitEvent(wk.Ev); err != nil {
		return comm.Errorf(wk.c, wk.op, "making %v wait for it: %w", st, err)
	}
	return nil
}

// hostWait polls the event until the op completes or fails: without
// sleeping for the world's spin time (short ops complete in microseconds,
// and a Go sleep lasts a millisecond), then with sleeps between polls.
func (wk *work) hostWait() error {
	unbind, err := wk.c.w.bind()
	if err != nil {
		return comm.Errorf(wk.c, wk.op, "%w", err)
	}
	defer unbind()
	for end := time.Now().Add(wk.c.w.opts.spin); ; {
		late := time.Now().After(end) // then poll once more: this goroutine may have been descheduled
		if wk.poll() {
			return wk.Result()
		}
		if late {
			break
		}
	}
	d := 50 * time.Microsecond
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if wk.poll() {
			return wk.Result()
		}
		hostSleeps.Add(1)
		t.Reset(d)
		d = min(2*d, time.Millisecond)
		select {
		case <-wk.Fin:
			return wk.Result()
		case <-t.C:
		}
	}
}

// poll queries the event (the caller is bound) and reports whether the work
// is done, finishing it when the event has completed.
func (wk *work) poll() bool {
	wk.Mu.Lock()
	if wk.Done {
		wk.Mu.Unlock()
		return true
	}
	ok, err := wk.Ev.Query()
	wk.Mu.Unlock()
	switch {
	case err != nil:
		wk.c.w.fail(fmt.Errorf("nccl: %s #%d on %s, world rank %d: polling its event: %w (%w)",
			wk.op, wk.seq, wk.c.name, wk.c.w.rank, err, comm.ErrAborted), true)
		return true
	case ok:
		wk.finish(nil)
		return true
	}
	return false
}

// finish marks the work done with err (nil: completed). A completed event
// is recycled; the event of a failed op is destroyed (its kernels may still
// be winding down). The caller is bound.
func (wk *work) finish(err error) {
	ev, ok := wk.Finish(err, wk.op, wk.c.name, wk.c.rank)
	if !ok {
		return
	}
	if err == nil {
		wk.c.w.recycle(ev)
	} else {
		ev.Destroy()
	}
}
