package grads

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// lane runs the buckets' sums beside the backward, in the order they are
// started:
//   - on a GPU backend (tensor.Streams) on the Reducer's side stream: each
//     sum is queued after the work already queued on the backend's stream
//     (an event: the backward's writes of the bucket), and waiting for its
//     Work orders the backend's stream after it;
//   - on the CPU on one goroutine per step, which runs the sums one after
//     another while the caller's goroutine goes on with the backward (the
//     groups it sums over, DP and EDP, are not the ones the backward uses:
//     comm.Comm allows different groups at once).
//
// A failed sum fails the ones after it in the step (their collectives
// would not match the peers').
type lane struct {
	main    comm.Stream    // the backend's stream (nil on the CPU)
	streams tensor.Streams // nil on the CPU
	side    any            // the GPU side stream

	on   bool
	jobs chan *job
	idle chan struct{}
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

func newLane(b tensor.Backend, main comm.Stream) (*lane, error) {
	l := &lane{main: main}
	if st, ok := b.(tensor.Streams); ok {
		side, err := st.NewStream()
		if err != nil {
			return nil, fmt.Errorf("grads: the reduction's side stream: %w", err)
		}
		l.streams, l.side = st, side
	}
	return l, nil
}

func (l *lane) active() bool { return l.on }

// begin starts a step's sums.
func (l *lane) begin() {
	l.on = true
	if l.streams != nil {
		return
	}
	l.jobs = make(chan *job, 256)
	l.idle = make(chan struct{})
	go func(jobs <-chan *job, idle chan<- struct{}) {
		defer close(idle)
		var failed error
		for j := range jobs {
			if failed != nil {
				j.err = failed
			} else {
				w, err := j.op(l.main) // the caller's stream (nil in a real CPU run)
				if err == nil {
					err = w.Wait(l.main)
				}
				j.err, failed = err, err
			}
			close(j.done)
		}
	}(l.jobs, l.idle)
}

// run starts op on the lane and returns its Work.
func (l *lane) run(op func(s comm.Stream) (comm.Work, error)) comm.Work {
	if l.streams != nil {
		if err := l.streams.StreamWait(l.side, l.main); err != nil {
			return failedWork{fmt.Errorf("fork to the side stream: %w", err)}
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

// end closes the step's sums: on the CPU it waits for the goroutine to
// finish them (their Works then return at once); on a GPU the Works order
// the backend's stream.
func (l *lane) end() error {
	if !l.on {
		return nil
	}
	l.on = false
	if l.streams != nil {
		return nil
	}
	close(l.jobs)
	<-l.idle
	return nil
}

// close releases the lane's side stream (once; nothing on the CPU, whose
// goroutine ends with each step). The lane must not be active.
func (l *lane) close() error {
	if l.streams == nil || l.side == nil {
		return nil
	}
	err := l.streams.DestroyStream(l.side)
	l.side = nil
	if err != nil {
		return fmt.Errorf("grads: the reduction's side stream: %w", err)
	}
	return nil
}

type failedWork struct{ err error }

func (w failedWork) Wait(comm.Stream) error { return w.err }
