package hostsync

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Device is what the decorator waits for before each op: the work queued
// on the device the transport's buffers live on (a tensor.Backend).
type Device interface {
	Sync() error
}

// Comm is a comm.Comm whose ops are host synchronisations (the package
// comment says how).
type Comm struct {
	comm.Comm
	dev Device
}

var (
	_ comm.Aborter       = (*Comm)(nil)
	_ comm.NamedSplitter = (*Comm)(nil)
	_ comm.Wrapper       = (*Comm)(nil)
)

// New wraps c, waiting for dev before each op.
func New(c comm.Comm, dev Device) *Comm { return &Comm{Comm: c, dev: dev} }

// run orders op after the device's work and waits for it.
func (s *Comm) run(op string, f func() (comm.Work, error)) (comm.Work, error) {
	if err := s.dev.Sync(); err != nil {
		return nil, comm.Errorf(s, op, "the backend failed before the op: %w", err)
	}
	w, err := f()
	if err == nil {
		err = w.Wait(nil)
	}
	if err != nil {
		return nil, err
	}
	return comm.Done, nil
}

// AllGather is the transport's, on its own stream, waited for.
func (s *Comm) AllGather(dst, src *tensor.Tensor, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpAllGather, func() (comm.Work, error) { return s.Comm.AllGather(dst, src, nil) })
}

// ReduceScatter is the transport's, on its own stream, waited for.
func (s *Comm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpReduceScatter, func() (comm.Work, error) { return s.Comm.ReduceScatter(dst, src, op, nil) })
}

// AllReduce is the transport's, on its own stream, waited for.
func (s *Comm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpAllReduce, func() (comm.Work, error) { return s.Comm.AllReduce(buf, op, nil) })
}

// AllToAllV is the transport's, on its own stream, waited for.
func (s *Comm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpAllToAllV, func() (comm.Work, error) { return s.Comm.AllToAllV(dst, src, sendCounts, recvCounts, nil) })
}

// Broadcast is the transport's, on its own stream, waited for.
func (s *Comm) Broadcast(buf *tensor.Tensor, root int, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpBroadcast, func() (comm.Work, error) { return s.Comm.Broadcast(buf, root, nil) })
}

// Split is the transport's Split, the new group wrapped alike.
func (s *Comm) Split(color, key int) (comm.Comm, error) { return s.SplitNamed(color, key, "") }

// SplitNamed is comm.SplitNamed of the transport, the new group wrapped
// alike; nil (comm.NoColor) stays nil.
func (s *Comm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	var c comm.Comm
	var err error
	if label == "" {
		c, err = s.Comm.Split(color, key)
	} else {
		c, err = comm.SplitNamed(s.Comm, color, key, label)
	}
	if err != nil || c == nil {
		return nil, err
	}
	return New(c, s.dev), nil
}

// Unwrap lets the capabilities of the transport (its symmetric memory) be
// found through the decorator (comm.SymmetricOf).
func (s *Comm) Unwrap() comm.Comm { return s.Comm }

// Abort aborts the transport's world, when it can be aborted.
func (s *Comm) Abort(err error) {
	if a, ok := s.Comm.(comm.Aborter); ok {
		a.Abort(err)
	}
}
