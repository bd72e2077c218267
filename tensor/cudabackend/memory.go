package cudabackend

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// Buffer is device memory holding elements of one dtype: the storage of the
// backend's tensors. It implements tensor.Buffer.
type Buffer struct {
	owner   *Backend
	ptr     gpu.Ptr
	dtype   tensor.DType
	n       int
	bucket  int // bytes reserved (the allocator's size class)
	freed   bool
	cleanup runtime.Cleanup
}

var _ tensor.Buffer = (*Buffer)(nil)

// Device is the backend's GPU.
func (b *Buffer) Device() tensor.Device { return b.owner.Device() }

// DType is the element type.
func (b *Buffer) DType() tensor.DType { return b.dtype }

// Len is the number of elements.
func (b *Buffer) Len() int { return b.n }

// Ptr is the device address of element 0 (a CUdeviceptr), for libraries
// such as NCCL that take raw pointers.
func (b *Buffer) Ptr() uint64 { return uint64(b.ptr) }

// DevicePtr returns the device address of t's first element, or 0 when t is
// neither a tensor of a cudabackend Buffer nor of a DeviceBuffer.
func DevicePtr(t *tensor.Tensor) uint64 {
	switch buf := t.Buffer().(type) {
	case *Buffer:
		return uint64(buf.ptr) + uint64(t.Offset()*t.DType().Size())
	case DeviceBuffer:
		return buf.Ptr() + uint64(t.Offset()*t.DType().Size())
	}
	return 0
}

// ptr is the device address of t's first element (t checked by the caller).
func ptr(t *tensor.Tensor) gpu.Ptr {
	if t == nil {
		return 0
	}
	return gpu.Ptr(DevicePtr(t))
}

// ---------------------------------------------------------------------------
// The caching allocator. Device memory is reserved in size classes: 512
// bytes and up, four classes per power of two (2^k, 1.25·2^k, 1.5·2^k,
// 1.75·2^k), so at most a quarter is wasted; from 64 MiB (largeBucket) on,
// 32 classes per power of two (at most 1/32 wasted): the few large blocks
// (the flat parameters, gradients, master weights and moments, the head's
// weight gradient) are one of a kind, and a quarter of them was ~0.26 GiB
// of gpt2-124m's peak (docs/measurements/2026-12-02.md, "Memory"). Freed blocks go to the free list
// of their class and are reused by the next request of that class without
// calling cuMemAlloc; all work runs on the backend's one stream, so a block
// given back while kernels that use it are still queued is only reused by
// work queued after them. When cuMemAlloc fails, the cached blocks are
// released and the allocation is tried once more.

const (
	minBucket   = 512
	largeBucket = 64 << 20
)

// bucketSize is the size class of a request of n bytes.
func bucketSize(n int) int {
	if n <= minBucket {
		return minBucket
	}
	k := bits.Len(uint(n)) - 1 // 2^k ≤ n < 2^(k+1)
	step := 1 << (k - 2)
	if n >= largeBucket {
		step = 1 << (k - 5)
	}
	return (n + step - 1) / step * step
}

type allocator struct {
	mu     sync.Mutex // guards everything below (cleanups run on other goroutines)
	dev    gpu.Device
	free   map[int][]gpu.Ptr
	held   map[gpu.Ptr]int // blocks handed out, by address: size
	closed bool            // releaseAll ran: put drops blocks
	live   int64           // bytes handed out
	cached int64           // bytes in free lists
	peak   int64           // most bytes reserved from the device at once
	ledger *ledger         // WithMemLedger: the blocks by call site; nil: off
}

func newAllocator(d gpu.Device, withLedger bool) *allocator {
	a := &allocator{dev: d, free: make(map[int][]gpu.Ptr), held: make(map[gpu.Ptr]int)}
	if withLedger {
		a.ledger = newLedger()
	}
	return a
}

// get returns a block of the size class of n bytes. The caller has acquired
// the device.
func (a *allocator) get(n int) (gpu.Ptr, int, error) {
	size := bucketSize(n)
	var site string
	if a.ledger != nil { // set once, before any allocation
		site = callSite()
	}
	a.mu.Lock()
	if l := a.free[size]; len(l) > 0 {
		p := l[len(l)-1]
		a.free[size] = l[:len(l)-1]
		a.cached -= int64(size)
		a.live += int64(size)
		a.held[p] = size
		if a.ledger != nil {
			a.ledger.add(p, site, int64(n), int64(size), a.live, a.cached)
		}
		a.mu.Unlock()
		return p, size, nil
	}
	a.mu.Unlock()
	p, err := a.dev.Alloc(size)
	if err != nil {
		// Give the cache back to the device and try once more.
		if rerr := a.releaseCached(); rerr != nil {
			return 0, 0, fmt.Errorf("%w (releasing the cache: %v)", err, rerr)
		}
		if p, err = a.dev.Alloc(size); err != nil {
			return 0, 0, err
		}
	}
	a.mu.Lock()
	a.live += int64(size)
	a.held[p] = size
	a.peak = max(a.peak, a.live+a.cached)
	if a.ledger != nil {
		a.ledger.add(p, site, int64(n), int64(size), a.live, a.cached)
	}
	a.mu.Unlock()
	return p, size, nil
}

// put gives a block back to its free list (no device call: safe from a
// cleanup).
func (a *allocator) put(p gpu.Ptr, size int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	delete(a.held, p)
	if a.ledger != nil {
		a.ledger.remove(p, int64(size))
	}
	a.free[size] = append(a.free[size], p)
	a.live -= int64(size)
	a.cached += int64(size)
}

// releaseCached frees the cached blocks. The caller has acquired the
// device; queued work may still use them, so it synchronises first.
func (a *allocator) releaseCached() error {
	if err := a.dev.Sync(); err != nil {
		return err
	}
	a.mu.Lock()
	free := a.free
	a.free = make(map[int][]gpu.Ptr)
	a.cached = 0
	a.mu.Unlock()
	var first error
	for _, l := range free {
		for _, p := range l {
			if err := a.dev.Free(p); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// releaseAll frees every block, cached or held by tensors (Close: the
// tensors must not be used afterwards), and stops taking blocks back.
func (a *allocator) releaseAll() error {
	first := a.releaseCached()
	a.mu.Lock()
	held := a.held
	a.held = make(map[gpu.Ptr]int)
	a.closed = true
	a.live = 0
	if l := a.ledger; l != nil {
		clear(l.blocks)
		clear(l.now)
	}
	a.mu.Unlock()
	for p := range held {
		if err := a.dev.Free(p); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// MemStats reports the allocator's device memory in bytes: live (held by
// tensors), cached (free, kept for reuse) and the peak reserved.
type MemStats struct {
	Live, Cached, Peak int64
}

// MemStats returns the allocator's current statistics.
func (b *Backend) MemStats() MemStats {
	a := b.alloc
	a.mu.Lock()
	defer a.mu.Unlock()
	return MemStats{Live: a.live, Cached: a.cached, Peak: a.peak}
}

// EmptyCache gives the cached free blocks back to the device (cuMemFree),
// after waiting for the queued work.
func (b *Backend) EmptyCache() {
	b.do("EmptyCache", func(d gpu.Device) error { return b.alloc.releaseCached() })
}

// blockRef is what a Buffer's cleanup needs to give its block back.
type blockRef struct {
	a    *allocator
	p    gpu.Ptr
	size int
}

// newBuffer reserves a buffer of n elements of dt (the caller has the
// device acquired). The block returns to the cache by Free, or when the
// Buffer becomes unreachable.
func (b *Backend) newBuffer(dt tensor.DType, n int) (*Buffer, error) {
	bytes := max(n*dt.Size(), 1)
	p, size, err := b.alloc.get(bytes)
	if err != nil {
		return nil, err
	}
	buf := &Buffer{owner: b, ptr: p, dtype: dt, n: n, bucket: size}
	buf.cleanup = runtime.AddCleanup(buf, func(r blockRef) { r.a.put(r.p, r.size) }, blockRef{b.alloc, p, size})
	return buf, nil
}

// scratch returns a temporary device buffer of n elements of dt for an op's
// internal use, given back with putScratch after the op's launches are
// queued (stream order makes the reuse safe).
func (b *Backend) scratch(dt tensor.DType, n int) (gpu.Ptr, int, error) {
	return b.alloc.get(max(n*dt.Size(), 1))
}

func (b *Backend) putScratch(p gpu.Ptr, size int) { b.alloc.put(p, size) }

// Zeros allocates a zeroed tensor of dt (Float32, BFloat16 or Int32) on the
// GPU. It allocates even after an error was recorded. On failure (bad shape,
// unsupported dtype, out of memory) it records an error and returns a tensor
// of the requested shape whose storage is not usable (ops on it are no-ops,
// since the error is sticky), or an empty tensor for an invalid shape.
func (b *Backend) Zeros(dt tensor.DType, shape ...int) *tensor.Tensor {
	s := tensor.Shape(shape)
	for _, d := range s {
		if d < 0 {
			b.fail(fmt.Errorf("cuda: Zeros(%v, %v): negative dimension", dt, s))
			return b.dead(dt, 0)
		}
	}
	n := s.Numel()
	if dt != tensor.Float32 && dt != tensor.BFloat16 && dt != tensor.Int32 {
		b.fail(fmt.Errorf("cuda: Zeros(%v, %v): the cuda backend stores f32, bf16 and i32, not %v", dt, s, dt))
		return b.dead(tensor.Float32, n, shape...)
	}
	var buf *Buffer
	var err error
	b.mu.Lock()
	if b.closed {
		err = errClosed
	} else if err = b.dev.Acquire(); err == nil {
		buf, err = b.newBuffer(dt, n)
		if err == nil {
			err = b.dev.Memset8(buf.ptr, 0, max(n*dt.Size(), 1))
		}
		b.dev.Release()
	}
	b.mu.Unlock()
	if err != nil {
		b.fail(fmt.Errorf("cuda: Zeros(%v, %v): %w", dt, s, err))
		return b.dead(dt, n, shape...)
	}
	t, err := tensor.New(buf, 0, shape...)
	if err != nil { // cannot happen: the buffer fits the shape
		b.fail(fmt.Errorf("cuda: Zeros(%v, %v): %w", dt, s, err))
		return b.dead(dt, 0)
	}
	return t
}

// dead is the tensor Zeros returns on failure: the right shape over a buffer
// with no device memory.
func (b *Backend) dead(dt tensor.DType, n int, shape ...int) *tensor.Tensor {
	buf := &Buffer{owner: b, dtype: dt, n: n, freed: true}
	t, err := tensor.New(buf, 0, shape...)
	if err != nil {
		t, _ = tensor.New(buf, 0, 0)
	}
	return t
}

// Free gives a tensor's storage back to the cache. Only whole allocations
// from Zeros may be freed, once; the tensor and its views must not be used
// afterwards. Freeing is optional: storage that becomes unreachable returns
// to the cache when the garbage collector finds it.
func (b *Backend) Free(t *tensor.Tensor) {
	if t == nil {
		return
	}
	buf, ok := t.Buffer().(*Buffer)
	switch {
	case !ok && isForeign(b, t):
		b.fail(fmt.Errorf("cuda: Free: %v is device memory of another allocator (%T): expected a tensor of this backend's Zeros; its owner frees it", t, t.Buffer()))
		return
	case !ok || buf.owner != b:
		b.fail(fmt.Errorf("cuda: Free: %v is not a tensor of this backend (%v)", t, b.Device()))
		return
	case t.Offset() != 0 || t.Numel() != buf.n:
		b.fail(fmt.Errorf("cuda: Free: %v is a view of %d elements at offset %d of a buffer of %d; only whole allocations from Zeros may be freed", t, t.Numel(), t.Offset(), buf.n))
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if buf.freed {
		if buf.ptr != 0 {
			b.setErr(fmt.Errorf("cuda: Free: %v was already freed", t))
		}
		return
	}
	buf.freed = true
	buf.cleanup.Stop()
	b.alloc.put(buf.ptr, buf.bucket)
}
