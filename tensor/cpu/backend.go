package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynctp/asynctp/tensor"
)

// Backend is the CPU implementation of tensor.Backend. Create it with New.
type Backend struct {
	threads int

	mu  sync.Mutex
	err error

	stop atomic.Pointer[func() bool] // SetInterrupt's; nil: off
}

var (
	_ tensor.Backend       = (*Backend)(nil)
	_ tensor.Interruptible = (*Backend)(nil)
	_ tensor.ErrClearer    = (*Backend)(nil)
)

// SetInterrupt has every op call stop first, and the long loops (attention,
// its backward) every few rows; once stop returns true the backend records
// an error wrapping tensor.ErrInterrupted. nil turns it off.
func (b *Backend) SetInterrupt(stop func() bool) {
	if stop == nil {
		b.stop.Store(nil)
		return
	}
	b.stop.Store(&stop)
}

// ClearInterrupt turns the interrupt off and clears the backend's error if
// it is the interrupt's.
func (b *Backend) ClearInterrupt() {
	b.stop.Store(nil)
	b.mu.Lock()
	defer b.mu.Unlock()
	if errors.Is(b.err, tensor.ErrInterrupted) {
		b.err = nil
	}
}

// interrupted reports whether an interrupt asks the ops to stop, recording
// the error the first time (op names the op).
func (b *Backend) interrupted(op string) bool {
	f := b.stop.Load()
	if f == nil || !(*f)() {
		return false
	}
	b.setErr(fmt.Errorf("cpu: %s: %w", op, tensor.ErrInterrupted))
	return true
}

// Option configures a Backend.
type Option func(*Backend)

// WithThreads limits the goroutines one op may use (at least 1). The default
// is runtime.GOMAXPROCS(0) at the time of New. Results do not depend on it.
// GEMMs are run by gonum, which picks its own parallelism (also
// deterministic).
func WithThreads(n int) Option {
	return func(b *Backend) { b.threads = max(1, n) }
}

// New returns a CPU backend.
func New(opts ...Option) *Backend {
	b := &Backend{threads: runtime.GOMAXPROCS(0)}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Device returns tensor.HostDevice.
func (b *Backend) Device() tensor.Device { return tensor.HostDevice }

// Threads returns the number of goroutines an op may use.
func (b *Backend) Threads() int { return b.threads }

// Err returns the first error recorded by an op, or nil.
func (b *Backend) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// Sync returns Err: the CPU runs every op to completion before returning.
func (b *Backend) Sync() error { return b.Err() }

// ClearErr forgets the recorded error so that the ops run again; it
// always succeeds on the CPU, whose errors leave the backend intact (an
// op's arguments are checked before it writes). The tensors the failed op
// and the ops skipped after it would have written hold what they held
// before: recompute or upload them. Call it while no other goroutine
// queues ops on the backend.
func (b *Backend) ClearErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = nil
	return nil
}

// setErr records err if no error was recorded before.
func (b *Backend) setErr(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		b.err = err
	}
}

// Zeros allocates a zeroed host tensor. It allocates even after an error was
// recorded (allocation is not an op of the step). A negative dimension or an
// invalid dtype records an error and returns an empty Float32 tensor, so the
// caller does not crash before it checks Err.
func (b *Backend) Zeros(dt tensor.DType, shape ...int) *tensor.Tensor {
	t, err := tensor.Host(dt, shape...)
	if err != nil {
		b.setErr(fmt.Errorf("cpu: Zeros(%v, %v): %w", dt, tensor.Shape(shape), err))
		return tensor.MustHost(tensor.Float32, 0)
	}
	return t
}

// Free does nothing: the garbage collector owns host memory.
func (b *Backend) Free(t *tensor.Tensor) {}

// minParallelWork is the amount of work (roughly, inner-loop iterations)
// below which a kernel runs on the calling goroutine.
const minParallelWork = 1 << 15

// parallelFor calls fn on contiguous chunks that cover [0, n), on up to
// b.threads goroutines, and waits for them. cost is the rough work of one
// item; small loops run inline. fn must write only the outputs of its items,
// so the result does not depend on the split.
func (b *Backend) parallelFor(n, cost int, fn func(lo, hi int)) {
	t := min(b.threads, n)
	if t <= 1 || n*max(cost, 1) < minParallelWork {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for i := range t {
		lo, hi := i*n/t, (i+1)*n/t
		wg.Go(func() { fn(lo, hi) })
	}
	wg.Wait()
}

// float is the element type of the generic kernels.
type float interface{ ~float32 | ~float64 }
