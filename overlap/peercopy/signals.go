package peercopy

import (
	"time"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// waitSignals queues on b's stream a wait until each of the n
// 64-bit words at words (a device address: local, or a peer's through a
// peer pointer) is ≥ target, each for at most deadline. It is a one-warp
// kernel (ep_wait, cuda/kernels/ep_signals.cu) spinning on acquire loads at
// system scope, not a stream memory operation: it can give up. It holds
// almost nothing of its SM, so kernels of other processes sharing the GPU
// (MPS) still run beside it. A word still short records an error for the
// next Sync, what(i) naming the signal of word i; status (an Int32 tensor,
// zero at first) then stays set, and later waits with it return at once.
// The work queued after it on the stream sees everything the signalling
// side wrote before its release.
func waitSignals(b *cudabackend.Backend, words uint64, n int, target uint64, deadline time.Duration, status *tensor.Tensor, what func(i int) error) {
	queueWait(b, "WaitSignals", "ep_wait", words, n, target, deadline, status, what)
}

// waitSignalsRaising is waitSignals for words in this process's own memory
// that stream memory operations elsewhere also wait on (cuStreamWaitValue64,
// which cannot give up): a word still short at the deadline (or when status
// was already set) is then set to target, so those waits pass — on stale
// data — and the step fails at the next Sync with the error of what(i)
// instead of hanging.
func waitSignalsRaising(b *cudabackend.Backend, words uint64, n int, target uint64, deadline time.Duration, status *tensor.Tensor, what func(i int) error) {
	queueWait(b, "WaitSignalsRaising", "ep_wait_raise", words, n, target, deadline, status, what)
}

// checkWait is the signal waits' data check: err[1] = the word that stayed
// short.
var checkWait, errCheckWait = cudabackend.NewDataCheck("peercopy: signal wait")

func queueWait(b *cudabackend.Backend, op, kernel string, words uint64, n int, target uint64, deadline time.Duration, status *tensor.Tensor, what func(i int) error) {
	c := b.Check(op)
	c.Own("status", status)
	c.DType("status", status, tensor.Int32)
	if words%8 != 0 || n <= 0 || deadline <= 0 {
		c.Failf("words %#x, n %d, deadline %v: expected an 8-byte aligned address, n > 0 and a deadline > 0", words, n, deadline)
	}
	if !c.OK() {
		return
	}
	b.Queue(op, func(l *cudabackend.Launcher) error {
		flag := l.Check(checkWait, func(v int32) error { return what(int(v) % 65536) })
		return l.Launch(kernel, cudabackend.D1(1), cudabackend.D1(32), 0, cudabackend.Ptr(words), int32(n), int64(target),
			int64(deadline), int32(0), cudabackend.PtrOf(status), flag)
	})
}
