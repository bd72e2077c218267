package launch

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// EnvSyncCollectives=1 makes the GPU ranks synchronise every collective on
// the host (syncedComm) instead of ordering it on the backend's stream: a
// debugging aid, to tell a stream-ordering bug from a transport's (the
// losses must not change, only the speed, which drops by an order of
// magnitude or more).
const EnvSyncCollectives = "ASYNCTP_SYNC_COLLECTIVES"

// gpuWorld is the world of a GPU rank over the transport c and the stream
// its model passes to every collective (model.Options.Stream): c itself
// and the backend's stream, so that each collective is queued in order with
// the backend's ops and waited for on the device (Work.Wait on the
// backend's stream), with no host synchronisation; or, with
// ASYNCTP_SYNC_COLLECTIVES=1, c behind syncedComm and no stream. how says
// which, for the log.
func gpuWorld(c comm.Comm, b *cudabackend.Backend, getenv func(string) string) (world comm.Comm, stream comm.Stream, how string) {
	if getenv(EnvSyncCollectives) == "1" {
		return &syncedComm{Comm: c, b: b}, nil, "collectives synchronised on the host (" + EnvSyncCollectives + "=1)"
	}
	// A *cuda.Stream: comm/nccl takes it as is, comm/nvshmem by its Handle.
	s := b.Stream()
	if s == nil { // no CUDA stream (the kernel emulator): nothing to order on
		return &syncedComm{Comm: c, b: b}, nil, "collectives synchronised on the host (the backend has no CUDA stream)"
	}
	return c, s, "collectives ordered on the backend's stream"
}

// syncedComm is the debugging mode of gpuWorld (ASYNCTP_SYNC_COLLECTIVES=1):
// it runs the ops of a GPU transport as host synchronisations, ignoring the
// stream it is given. Before an op it waits for the backend's queued work
// (Sync), it queues the op on the transport's own stream (a nil
// comm.Stream) and waits for it on the host, so that the backend's next ops
// see the result; it returns comm.Done. Correct, not fast. Groups split
// from it are wrapped alike.
type syncedComm struct {
	comm.Comm
	b tensor.Backend
}

var (
	_ comm.Aborter       = (*syncedComm)(nil)
	_ comm.NamedSplitter = (*syncedComm)(nil)
	_ comm.Wrapper       = (*syncedComm)(nil)
)

// run orders op after the backend's work and waits for it.
func (s *syncedComm) run(op string, f func() (comm.Work, error)) (comm.Work, error) {
	if err := s.b.Sync(); err != nil {
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

func (s *syncedComm) AllGather(dst, src *tensor.Tensor, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpAllGather, func() (comm.Work, error) { return s.Comm.AllGather(dst, src, nil) })
}

func (s *syncedComm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpReduceScatter, func() (comm.Work, error) { return s.Comm.ReduceScatter(dst, src, op, nil) })
}

func (s *syncedComm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpAllReduce, func() (comm.Work, error) { return s.Comm.AllReduce(buf, op, nil) })
}

func (s *syncedComm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpAllToAllV, func() (comm.Work, error) { return s.Comm.AllToAllV(dst, src, sendCounts, recvCounts, nil) })
}

func (s *syncedComm) Broadcast(buf *tensor.Tensor, root int, _ comm.Stream) (comm.Work, error) {
	return s.run(comm.OpBroadcast, func() (comm.Work, error) { return s.Comm.Broadcast(buf, root, nil) })
}

func (s *syncedComm) Split(color, key int) (comm.Comm, error) { return s.SplitNamed(color, key, "") }

func (s *syncedComm) SplitNamed(color, key int, label string) (comm.Comm, error) {
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
	return &syncedComm{Comm: c, b: s.b}, nil
}

// Unwrap lets the capabilities of the transport (its symmetric memory) be
// found through the wrapper (comm.SymmetricOf).
func (s *syncedComm) Unwrap() comm.Comm { return s.Comm }

func (s *syncedComm) Abort(err error) {
	if a, ok := s.Comm.(comm.Aborter); ok {
		a.Abort(err)
	}
}
