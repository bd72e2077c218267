package local

import (
	"fmt"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// The rendezvous. Every call of a rank on a group takes the next sequence
// number of its handle; the calls of all ranks with the same number meet in
// one slot. The last rank to arrive runs the op for everyone (exec.go) and
// closes done; the others wait on done, on the world's abort channel and on
// their deadline. All slot state is guarded by the group's mutex; the
// executor runs outside it, and a waiter that gives up checks under the
// mutex that the executor has not started, so a late rank never writes into
// the buffers of a rank that has already returned.

// call is one rank's side of a collective.
type call struct {
	op  string // comm.OpAllGather, ...
	sig string // what must agree across ranks, printed in mismatch errors
	err error  // this rank's local check failure

	dst, src   *tensor.Tensor
	rop        comm.ReduceOp
	send, recv []int
	root       int
	color, key int
	label      string

	out *Comm // Split's result for this rank (nil for NoColor)
}

type slotState uint8

const (
	waiting   slotState = iota // ranks still arriving
	executing                  // the last rank is running the op
	finished                   // done is closed; err says how it ended
)

// slot is where the calls of one sequence number meet.
type slot struct {
	seq     uint64
	calls   []*call // by group rank, nil until that rank arrives
	first   int     // the group rank that arrived first
	arrived int
	state   slotState
	err     error // the failure every rank of the slot reports
	done    chan struct{}
}

func (s *slot) finish(err error) {
	s.err = err
	s.state = finished
	close(s.done)
}

// work is a rank's handle on its call in a slot.
type work struct {
	c        *Comm
	cl       *call
	s        *slot
	deadline time.Time
}

// start registers cl in this rank's next slot. The last rank to arrive runs
// the op before returning. A local error (cl.err) is returned at once, after
// the slot is failed so that the peers do not wait for the deadline.
func (c *Comm) start(cl *call) (*work, error) {
	g := c.g
	g.mu.Lock()
	if g.closed[c.rank] {
		g.mu.Unlock()
		return nil, c.wrap(cl.op, fmt.Errorf("this rank's handle is closed (%w)", comm.ErrClosed))
	}
	if err := g.w.err(); err != nil {
		g.mu.Unlock()
		return nil, c.wrap(cl.op, err)
	}
	seq := c.seq
	c.seq++
	s := g.slots[seq]
	if s == nil {
		s = &slot{seq: seq, calls: make([]*call, len(g.members)), first: c.rank, done: make(chan struct{})}
		g.slots[seq] = s
	}
	s.calls[c.rank] = cl
	s.arrived++
	if s.arrived == len(g.members) {
		delete(g.slots, seq) // nobody else will look it up
	}
	wk := &work{c: c, cl: cl, s: s, deadline: time.Now().Add(g.w.cfg.timeout)}
	switch {
	case s.state != waiting:
		// Failed before this rank arrived; wk.Wait reports why.
	case cl.err != nil:
		s.finish(fmt.Errorf("call #%d: rank %d failed: %w", seq, c.rank, cl.err))
	case cl.sig != s.calls[s.first].sig:
		s.finish(fmt.Errorf("call #%d: rank %d called %s, rank %d called %s (%w)",
			seq, s.first, s.calls[s.first].sig, c.rank, cl.sig, comm.ErrMismatch))
	default:
		for m, closed := range g.closed {
			if closed && s.calls[m] == nil {
				s.finish(g.closedErr(s, m))
				break
			}
		}
	}
	if cl.err != nil {
		g.mu.Unlock()
		return nil, fmt.Errorf("local: %w", cl.err)
	}
	if s.state != waiting || s.arrived < len(g.members) {
		g.mu.Unlock()
		return wk, nil
	}
	s.state = executing
	g.mu.Unlock()

	err := g.execute(s)

	g.mu.Lock()
	s.finish(err)
	g.mu.Unlock()
	return wk, nil
}

// Wait blocks until the op has run, the deadline passes or the world is
// aborted. A rank that gives up fails the slot for everyone; a timeout also
// aborts the world.
func (wk *work) Wait(comm.Stream) error {
	s, g := wk.s, wk.c.g
	select {
	case <-s.done:
		return wk.result()
	default:
	}
	timer := time.NewTimer(time.Until(wk.deadline))
	defer timer.Stop()
	timedOut := false
	select {
	case <-s.done:
		return wk.result()
	case <-g.w.aborted:
	case <-timer.C:
		timedOut = true
	}
	g.mu.Lock()
	if s.state != waiting {
		g.mu.Unlock()
		<-s.done // the executor has started: it will finish
		return wk.result()
	}
	var err error
	if timedOut {
		var missing []string
		for m, cl := range s.calls {
			if cl == nil {
				missing = append(missing, g.describe(m))
			}
		}
		err = fmt.Errorf("call #%d: %s did not arrive within %v (%w)",
			s.seq, strings.Join(missing, ", "), g.w.cfg.timeout, comm.ErrTimeout)
	} else {
		err = fmt.Errorf("call #%d: %w", s.seq, g.w.abortErr)
	}
	s.finish(err)
	g.mu.Unlock()
	if timedOut {
		g.w.abort(fmt.Errorf("%w (%w)", wk.c.wrap(wk.cl.op, err), comm.ErrAborted))
	}
	return wk.result()
}

// result is this rank's outcome of a finished slot.
func (wk *work) result() error {
	if wk.s.err != nil {
		return wk.c.wrap(wk.cl.op, wk.s.err)
	}
	return nil
}

// wrap makes err an error of op on this rank.
func (c *Comm) wrap(op string, err error) error {
	return fmt.Errorf("local: %w", &comm.Error{Op: op, Group: c.g.name, Rank: c.rank, Err: err})
}

// describe names group rank m, with its world rank when they differ.
func (g *group) describe(m int) string {
	if g.members[m] == m {
		return fmt.Sprintf("rank %d", m)
	}
	return fmt.Sprintf("rank %d (world rank %d)", m, g.members[m])
}

func (g *group) closedErr(s *slot, m int) error {
	return fmt.Errorf("call #%d: %s closed %s before arriving (%w)", s.seq, g.describe(m), g.name, comm.ErrClosed)
}
