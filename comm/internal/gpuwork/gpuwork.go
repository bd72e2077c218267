// Package gpuwork is the completion state that the comm.Work of the GPU
// transports (comm/nccl, comm/nvshmem) share: an op tracked by an event
// recorded on its stream right after it, done once, with its error if it
// failed.
package gpuwork

import (
	"sync"

	"github.com/asynctp/asynctp/comm"
)

// State is the completion state of one queued op, embedded in the
// transport's work. Mu guards Ev, Done and Err; the transport holds it while
// it uses Ev (querying it, making a stream wait on it), so that Finish cannot
// take the event meanwhile. Make it with Ev and Fin set.
type State[E comparable] struct {
	Mu   sync.Mutex
	Ev   E             // the op's event; the zero E once done
	Done bool          // set by Finish
	Err  error         // the op's error once done: nil if it completed
	Fin  chan struct{} // closed when done
}

// IsDone reports whether the op is done.
func (s *State[E]) IsDone() bool {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	return s.Done
}

// Result returns the op's error: nil while it is pending or once it has
// completed.
func (s *State[E]) Result() error {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	return s.Err
}

// Finish marks the op done with err (nil: completed), which it records as
// a *comm.Error of op on group at rank; it takes the event (Ev becomes the
// zero E), closes Fin and returns the event, for the caller to recycle or
// destroy, and true. An op already done is left as it is: false.
func (s *State[E]) Finish(err error, op, group string, rank int) (ev E, ok bool) {
	s.Mu.Lock()
	if s.Done {
		s.Mu.Unlock()
		return ev, false
	}
	s.Done = true
	if err != nil {
		s.Err = &comm.Error{Op: op, Group: group, Rank: rank, Err: err}
	}
	ev = s.Ev
	var none E
	s.Ev = none
	close(s.Fin)
	s.Mu.Unlock()
	return ev, true
}
