package nccl

// Device memory for the conformance suite (commtest.Memory): raw cuMemAlloc
// buffers of every dtype (the suite also moves f64, which
// tensor/cudabackend does not store), and tensor/cudabackend's memory with
// raw f64 beside it.

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// devBuf is a raw device allocation holding n elements of dt.
type devBuf struct {
	dev int
	dt  tensor.DType
	n   int
	ptr cuda.DevicePtr
}

func (b *devBuf) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA, Index: b.dev} }
func (b *devBuf) DType() tensor.DType   { return b.dt }
func (b *devBuf) Len() int              { return b.n }
func (b *devBuf) Ptr() uint64           { return uint64(b.ptr) }

// rawMemory is commtest.Memory on raw device memory of one GPU. Copies run
// on its own stream and are waited for; Download first waits for the
// suite's stream (after), when the ops run on one.
type rawMemory struct {
	dev   int
	copy  *cuda.Stream
	after *cuda.Stream

	mu    sync.Mutex
	alloc []cuda.DevicePtr
}

// newRawMemory makes the memory; the test's cleanup frees it.
func newRawMemory(tb testing.TB, dev int, after *cuda.Stream) *rawMemory {
	tb.Helper()
	m := &rawMemory{dev: dev, after: after}
	if err := m.on(func() (err error) { m.copy, err = cuda.NewStream(); return err }); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		m.on(func() error {
			m.copy.Synchronize()
			for _, p := range m.alloc {
				cuda.Free(p)
			}
			return m.copy.Destroy()
		})
	})
	return m
}

// on runs fn with the device's context bound on a locked thread.
func (m *rawMemory) on(fn func() error) error {
	return cuda.OnDevice(m.dev, func(*cuda.Context) error { return fn() })
}

func (m *rawMemory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	n := tensor.Shape(shape).Numel()
	bytes := max(n*dt.Size(), 256)
	b := &devBuf{dev: m.dev, dt: dt, n: n}
	err := m.on(func() (err error) {
		if b.ptr, err = cuda.Alloc(bytes); err != nil {
			return err
		}
		m.mu.Lock()
		m.alloc = append(m.alloc, b.ptr)
		m.mu.Unlock()
		if err := cuda.MemsetD8Async(b.ptr, 0, bytes, m.copy); err != nil {
			return err
		}
		return m.copy.Synchronize()
	})
	if err != nil {
		return nil, err
	}
	return tensor.New(b, 0, shape...)
}

// free gives back the memory of tensors from Alloc (whole allocations).
func (m *rawMemory) free(ts ...*tensor.Tensor) {
	m.on(func() error {
		for _, t := range ts {
			b, ok := t.Buffer().(*devBuf)
			if !ok || b.ptr == 0 {
				continue
			}
			m.mu.Lock()
			if i := slices.Index(m.alloc, b.ptr); i >= 0 {
				m.alloc = slices.Delete(m.alloc, i, i+1)
				cuda.Free(b.ptr)
			}
			m.mu.Unlock()
			b.ptr = 0
		}
		return nil
	})
}

// hostData is the address and size of a host tensor's elements.
func hostData(t *tensor.Tensor) (unsafe.Pointer, int) {
	if t.Numel() == 0 {
		return nil, 0
	}
	switch t.DType() {
	case tensor.Float32:
		return unsafe.Pointer(&t.F32()[0]), t.Bytes()
	case tensor.Float64:
		return unsafe.Pointer(&t.F64()[0]), t.Bytes()
	case tensor.Int32:
		return unsafe.Pointer(&t.I32()[0]), t.Bytes()
	case tensor.BFloat16:
		return unsafe.Pointer(&t.BF16()[0]), t.Bytes()
	}
	return nil, 0
}

func devAddr(t *tensor.Tensor) (cuda.DevicePtr, error) {
	b, ok := t.Buffer().(*devBuf)
	if !ok {
		return 0, fmt.Errorf("%v is not raw device memory", t)
	}
	return b.ptr.Offset(t.Offset() * t.DType().Size()), nil
}

func (m *rawMemory) Upload(dst, src *tensor.Tensor) error {
	if dst.DType() != src.DType() || dst.Numel() != src.Numel() {
		return fmt.Errorf("upload %v into %v: expected the same dtype and size", src, dst)
	}
	p, err := devAddr(dst)
	if err != nil {
		return err
	}
	h, n := hostData(src)
	return m.on(func() error {
		if err := cuda.CopyHtoDAsync(p, h, n, m.copy); err != nil {
			return err
		}
		return m.copy.Synchronize()
	})
}

func (m *rawMemory) Download(dst, src *tensor.Tensor) error {
	if dst.DType() != src.DType() || dst.Numel() != src.Numel() {
		return fmt.Errorf("download %v into %v: expected the same dtype and size", src, dst)
	}
	p, err := devAddr(src)
	if err != nil {
		return err
	}
	h, n := hostData(dst)
	return m.on(func() error {
		if m.after != nil {
			if err := m.after.Synchronize(); err != nil {
				return err
			}
		}
		if err := cuda.CopyDtoHAsync(h, p, n, m.copy); err != nil {
			return err
		}
		return m.copy.Synchronize()
	})
}

// backendMemory is commtest.BackendMemory on a cudabackend.Backend, with f64
// tensors in raw memory.
type backendMemory struct {
	b   *cudabackend.Backend
	be  commtest.Memory
	raw *rawMemory
}

func newBackendMemory(tb testing.TB, b *cudabackend.Backend, dev int, after *cuda.Stream) *backendMemory {
	return &backendMemory{b: b, be: commtest.BackendMemory(b), raw: newRawMemory(tb, dev, after)}
}

func (m *backendMemory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	if dt == tensor.Float64 {
		return m.raw.Alloc(dt, shape...)
	}
	t, err := m.be.Alloc(dt, shape...)
	if err != nil {
		return nil, err
	}
	// The zeroing is queued on the backend's stream, which the ops' streams
	// do not wait for.
	return t, m.b.Sync()
}

func (m *backendMemory) Upload(dst, src *tensor.Tensor) error {
	if _, ok := dst.Buffer().(*devBuf); ok {
		return m.raw.Upload(dst, src)
	}
	return m.be.Upload(dst, src)
}

func (m *backendMemory) Download(dst, src *tensor.Tensor) error {
	if _, ok := src.Buffer().(*devBuf); ok {
		return m.raw.Download(dst, src)
	}
	if m.raw.after != nil {
		if err := m.raw.on(m.raw.after.Synchronize); err != nil {
			return err
		}
	}
	return m.be.Download(dst, src)
}

// suiteMemory is the memory the suite runs on: tensor/cudabackend's when it
// opens on dev (it needs its kernels image) and ASYNCTP_NCCL_TEST_RAW is not
// set, raw device memory otherwise. It says which in the log.
func suiteMemory(tb testing.TB, dev int, after *cuda.Stream) commtest.Memory {
	tb.Helper()
	if os.Getenv("ASYNCTP_NCCL_TEST_RAW") != "" {
		tb.Logf("ASYNCTP_NCCL_TEST_RAW is set: the suite uses raw device memory")
		return newRawMemory(tb, dev, after)
	}
	b, err := cudabackend.New(dev)
	if err != nil {
		tb.Logf("tensor/cudabackend unavailable, the suite uses raw device memory: %v", err)
		return newRawMemory(tb, dev, after)
	}
	tb.Cleanup(func() { b.Close() })
	tb.Logf("the suite uses tensor/cudabackend's memory on %s (f64 in raw device memory)", b.DeviceName())
	return newBackendMemory(tb, b, dev, after)
}
