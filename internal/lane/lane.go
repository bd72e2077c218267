package lane

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Op is one communication op: it queues its collective on stream s and
// returns its Work.
type Op func(s comm.Stream) (comm.Work, error)

// Lane is used by one call at a time: Begin, Run..., End.
type Lane struct {
	main    comm.Stream    // the caller's stream (nil in a real CPU run)
	streams tensor.Streams // nil on the CPU
	side    any            // the GPU side stream
	what    string         // names the owner in a fork error; "" for none
	queue   int            // CPU: the capacity of a call's queue

	on   bool
	jobs chan *job // CPU: the queue of the current call
	idle chan struct{}
}

// New makes a lane whose ops are ordered after main, the stream of the
// math (nil on the CPU): with a side stream of its own when b has streams.
// queue is how many ops a CPU call may have waiting before Run blocks;
// what, when not empty, prefixes the error of a failed fork to the side
// stream. New's error is the side stream's, unwrapped.
func New(b tensor.Backend, main comm.Stream, queue int, what string) (*Lane, error) {
	l := &Lane{main: main, what: what, queue: queue}
	if st, ok := b.(tensor.Streams); ok {
		side, err := st.NewStream()
		if err != nil {
			return nil, err
		}
		l.streams, l.side = st, side
	}
	return l, nil
}

// Active reports whether a call has begun and not ended.
func (l *Lane) Active() bool { return l.on }

// Begin starts a call.
func (l *Lane) Begin() {
	l.on = true
	if l.streams != nil {
		return
	}
	l.jobs = make(chan *job, l.queue)
	l.idle = make(chan struct{})
	go func(jobs <-chan *job, idle chan<- struct{}) {
		defer close(idle)
		var failed error
		for j := range jobs {
			if failed != nil {
				j.err = failed // a failed op poisons the rest of the call
			} else {
				w, err := j.op(l.main)
				if err == nil {
					err = w.Wait(l.main)
				}
				j.err, failed = err, err
			}
			close(j.done)
		}
	}(l.jobs, l.idle)
}

// Run queues op on the lane and returns its Work: waiting on it orders the
// main stream (CPU: the caller) after op.
func (l *Lane) Run(op Op) comm.Work {
	if l.streams != nil {
		if err := l.streams.StreamWait(l.side, l.main); err != nil {
			if l.what != "" {
				return Failed(fmt.Errorf("%s: fork to the side stream: %w", l.what, err))
			}
			return Failed(fmt.Errorf("fork to the side stream: %w", err))
		}
		w, err := op(l.side)
		if err != nil {
			return Failed(err)
		}
		return w
	}
	j := &job{op: op, done: make(chan struct{})}
	l.jobs <- j
	return j
}

// End closes the call (a no-op when none has begun). The returned Work
// completes on the CPU once the call's goroutine has run every op (their
// Works then return at once); on a GPU at once, the ops' own Works
// ordering the main stream. Its Wait returns nil.
func (l *Lane) End() comm.Work {
	if !l.on {
		return comm.Done
	}
	l.on = false
	if l.streams != nil {
		return comm.Done
	}
	close(l.jobs)
	return idleWork(l.idle)
}

// Close destroys the side stream.
func (l *Lane) Close() error {
	if l.streams != nil && l.side != nil {
		err := l.streams.DestroyStream(l.side)
		l.side = nil
		return err
	}
	return nil
}

// Failed is a Work whose Wait returns err.
func Failed(err error) comm.Work { return failedWork{err} }

type failedWork struct{ err error }

func (w failedWork) Wait(comm.Stream) error { return w.err }

type idleWork chan struct{}

func (w idleWork) Wait(comm.Stream) error { <-w; return nil }

type job struct {
	op   Op
	done chan struct{}
	err  error
}

// Wait blocks until the job has run (CPU) and returns its error.
func (j *job) Wait(comm.Stream) error {
	<-j.done
	return j.err
}
