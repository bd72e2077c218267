package overlap

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// lane runs a site's communication beside its math, in issue order:
//   - on a GPU backend (tensor.Streams) on the site's own side stream: each
//     op is queued after the work already queued on the compute stream
//     (an event, no host sync), and its Work orders the compute stream
//     after it;
//   - on the CPU on one goroutine per call, so that the math of chunk k
//     runs while chunk k+1 moves; ops keep the order they were issued in,
//     so every rank issues its collectives in the same order.
//
// A lane is used by one call at a time: begin, run..., end.
type lane struct {
	sp      Spec
	streams tensor.Streams // nil on the CPU
	side    any            // the GPU side stream

	jobs  chan *job // CPU: the queue of the current call
	idle  chan struct{}
	works []comm.Work // the current call's ops
}

type job struct {
	op   func(s comm.Stream) (comm.Work, error)
	done chan struct{}
	err  error
}

// Wait blocks until the job has run (CPU) and returns its error.
func (j *job) Wait(comm.Stream) error {
	<-j.done
	return j.err
}

func newLane(sp Spec) (*lane, error) {
	l := &lane{sp: sp}
	if st, ok := sp.Backend.(tensor.Streams); ok {
		side, err := st.NewStream()
		if err != nil {
			return nil, fmt.Errorf("%s: side stream: %w", sp.what(), err)
		}
		l.streams, l.side = st, side
	}
	return l, nil
}

// begin starts a call.
func (l *lane) begin() {
	l.works = l.works[:0]
	if l.streams != nil {
		return
	}
	l.jobs = make(chan *job, 64)
	l.idle = make(chan struct{})
	go func(jobs <-chan *job, idle chan<- struct{}) {
		defer close(idle)
		var failed error
		for j := range jobs {
			if failed != nil {
				j.err = failed // a failed exchange poisons the rest of the call
			} else {
				w, err := j.op(l.sp.Stream) // the caller's stream (nil in a real CPU run)
				if err == nil {
					err = w.Wait(l.sp.Stream)
				}
				j.err, failed = err, err
			}
			close(j.done)
		}
	}(l.jobs, l.idle)
}

// run queues op on the lane and returns its Work: waiting on it orders the
// compute stream (CPU: the caller) after op.
func (l *lane) run(op func(s comm.Stream) (comm.Work, error)) comm.Work {
	w := l.issue(op)
	l.works = append(l.works, w)
	return w
}

func (l *lane) issue(op func(s comm.Stream) (comm.Work, error)) comm.Work {
	if l.streams != nil {
		if err := l.streams.StreamWait(l.side, l.sp.Stream); err != nil {
			return failedWork{fmt.Errorf("%s: fork to the side stream: %w", l.sp.what(), err)}
		}
		w, err := op(l.side)
		if err != nil {
			return failedWork{err}
		}
		return w
	}
	j := &job{op: op, done: make(chan struct{})}
	l.jobs <- j
	return j
}

// end closes the call: the returned Work completes when every op of the
// call has (the site owns its group until then).
func (l *lane) end() comm.Work {
	all := allWork(append([]comm.Work(nil), l.works...))
	if l.streams != nil {
		return all
	}
	close(l.jobs)
	return allWork{idleWork(l.idle), all}
}

// finish ends a call that waits for its ops before returning: it waits for
// every op of the call on the spec's stream and returns the call's first
// error (err, else the lane's), naming the site and the pass.
func (l *lane) finish(err error, pass string) error {
	if werr := l.end().Wait(l.sp.Stream); err == nil {
		err = werr
	}
	return wrapErr(l.sp, pass, err)
}

func (l *lane) close() error {
	if l.streams != nil && l.side != nil {
		err := l.streams.DestroyStream(l.side)
		l.side = nil
		return err
	}
	return nil
}

type failedWork struct{ err error }

func (w failedWork) Wait(comm.Stream) error { return w.err }

// allWork waits for every Work and returns the first error.
type allWork []comm.Work

func (ws allWork) Wait(s comm.Stream) error { return waitAll(s, ws...) }

type idleWork chan struct{}

func (w idleWork) Wait(comm.Stream) error { <-w; return nil }

// waitAll waits for every Work in order and returns the first error.
func waitAll(s comm.Stream, ws ...comm.Work) error {
	var first error
	for _, w := range ws {
		if w == nil {
			continue
		}
		if err := w.Wait(s); err != nil && first == nil {
			first = err
		}
	}
	return first
}
