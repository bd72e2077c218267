package overlap

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/lane"
)

// siteLane is a site's lane (internal/lane: its communication beside its
// math, in issue order; on the GPU its own side stream) and the Works of
// the current call. A lane is used by one call at a time: begin, run...,
// end.
type siteLane struct {
	sp    Spec
	ops   *lane.Lane
	works []comm.Work // the current call's ops
}

// newSiteLane checks a spec of kind k and makes its site's lane.
func newSiteLane(sp Spec, k Kind) (*siteLane, error) {
	if err := sp.check(k); err != nil {
		return nil, err
	}
	ops, err := lane.New(sp.Backend, sp.Stream, 64, sp.what())
	if err != nil {
		return nil, fmt.Errorf("%s: side stream: %w", sp.what(), err)
	}
	return &siteLane{sp: sp, ops: ops}, nil
}

// begin starts a call.
func (l *siteLane) begin() {
	l.works = l.works[:0]
	l.ops.Begin()
}

// run queues op on the lane and returns its Work: waiting on it orders the
// compute stream (CPU: the caller) after op.
func (l *siteLane) run(op lane.Op) comm.Work {
	w := l.ops.Run(op)
	l.works = append(l.works, w)
	return w
}

// end closes the call: the returned Work completes when every op of the
// call has (the site owns its group until then).
func (l *siteLane) end() comm.Work {
	return allWork{l.ops.End(), allWork(append([]comm.Work(nil), l.works...))}
}

// finish ends a call that waits for its ops before returning: it waits for
// every op of the call on the spec's stream and returns the call's first
// error (err, else the lane's), naming the site and the pass.
func (l *siteLane) finish(err error, pass string) error {
	if werr := l.end().Wait(l.sp.Stream); err == nil {
		err = werr
	}
	return wrapErr(l.sp, pass, err)
}

func (l *siteLane) close() error { return l.ops.Close() }

// allWork waits for every Work and returns the first error.
type allWork []comm.Work

func (ws allWork) Wait(s comm.Stream) error { return waitAll(s, ws...) }

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
