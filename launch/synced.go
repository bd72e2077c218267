package launch

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostsync"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// EnvSyncCollectives=1 makes the GPU ranks synchronise every collective on
// the host (comm/hostsync) instead of ordering it on the backend's stream: a
// debugging aid, to tell a stream-ordering bug from a transport's (the
// losses must not change, only the speed, which drops by an order of
// magnitude or more).
const EnvSyncCollectives = "ASYNCTP_SYNC_COLLECTIVES"

// gpuWorld is the world of a GPU rank over the transport c and the stream
// its model passes to every collective (model.Options.Stream): c itself
// and the backend's stream, so that each collective is queued in order with
// the backend's ops and waited for on the device (Work.Wait on the
// backend's stream), with no host synchronisation; or, with
// ASYNCTP_SYNC_COLLECTIVES=1, c behind the comm/hostsync decorator and no
// stream. how says which, for the log.
func gpuWorld(c comm.Comm, b *cudabackend.Backend, getenv func(string) string) (world comm.Comm, stream comm.Stream, how string) {
	if getenv(EnvSyncCollectives) == "1" {
		return hostsync.New(c, b), nil, "collectives synchronised on the host (" + EnvSyncCollectives + "=1)"
	}
	// A *cuda.Stream: comm/nccl takes it as is, comm/nvshmem by its Handle.
	s := b.Stream()
	if s == nil { // no CUDA stream (the kernel emulator): nothing to order on
		return hostsync.New(c, b), nil, "collectives synchronised on the host (the backend has no CUDA stream)"
	}
	return c, s, "collectives ordered on the backend's stream"
}
