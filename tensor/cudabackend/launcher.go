package cudabackend

import (
	"fmt"
	"sync"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// The narrow launcher: what code outside this package needs to own the host
// side of kernels of the image (a protocol's engine beside the protocol it
// serves: parallel/ep/peerep's expert dispatch, overlap/peercopy's put
// transfer and signal waits). Queue runs a function with the device; its
// Launcher queues a kernel by name with its grid, block, shared memory and
// arguments, fills and copies, on the backend's stream or a side stream,
// and hands out the kernels' data-check words. Allocation is the
// backend's own (Zeros, Free, Upload; DevicePtr, PtrOf). Nothing here is
// specific to one protocol.

// Ptr is a device address as a kernel argument (a pointer parameter).
type Ptr = gpu.Ptr

// Dim3 is a grid or block size.
type Dim3 = gpu.Dim3

// D1 is the 1-D size (x, 1, 1).
func D1(x int) Dim3 { return gpu.D1(x) }

// PtrOf is the device address of t's first element as a kernel argument (0
// for nil).
func PtrOf(t *tensor.Tensor) Ptr { return ptr(t) }

// KernelSuffix is the name suffix of the kernel of a float dtype: "_f32"
// for Float32, else "_bf16".
func KernelSuffix(dt tensor.DType) string { return sfx(dt) }

// maxDataChecks is the most DataChecks a program may make.
const maxDataChecks = 8

// DataCheck is a slot of the kernels' data checks (a pair of int32 words a
// kernel sets when its data is wrong or a wait ran out: err[0] |= 1, err[1] =
// one value), read back when the host waits for the device anyway; the
// explanation of the earliest launch whose slot is set becomes the
// backend's error. Launches whose failures are explained differently get
// different slots.
type DataCheck struct {
	slot flagSlot
	name string
}

var dataChecks struct {
	sync.Mutex
	names []string
}

// NewDataCheck makes the slot called name. A program has a fixed few (at
// most 8, shared by every package): make them in package-level variables,
// and have the constructor of whatever launches with them return the error
// (a zero DataCheck must not be used). Past 8 it returns an error naming
// the checks already made.
func NewDataCheck(name string) (DataCheck, error) {
	dataChecks.Lock()
	defer dataChecks.Unlock()
	n := len(dataChecks.names)
	if n == maxDataChecks {
		return DataCheck{}, fmt.Errorf("cudabackend: data check %q: %d made already (%q), expected at most %d in a program (the slots of the backend's check words)", name, n, dataChecks.names, maxDataChecks)
	}
	dataChecks.names = append(dataChecks.names, name)
	return DataCheck{slot: firstDataCheck + flagSlot(n), name: name}, nil
}

// Launcher queues work on the backend's device inside Queue: on the
// backend's stream, or on the stream OnStream names.
type Launcher struct {
	b   *Backend
	dev gpu.Device
}

// Queue runs fn with the device acquired and the backend locked, for code
// that queues kernels of its own (Launcher). An error fn returns is
// recorded as the backend's sticky error, "cuda: <op>: <err>"; once an
// error is recorded fn is not run.
func (b *Backend) Queue(op string, fn func(l *Launcher) error) {
	b.do(op, func(d gpu.Device) error { return fn(&Launcher{b: b, dev: d}) })
}

// Launch queues the kernel called kernel with grid, block, smem bytes of
// dynamic shared memory and args (Ptr, int32, int64 or float32, matching
// its parameters in order).
func (l *Launcher) Launch(kernel string, grid, block Dim3, smem int, args ...any) error {
	return l.dev.Launch(kernel, grid, block, smem, args...)
}

// Memset8 queues a fill of n bytes at p with v.
func (l *Launcher) Memset8(p Ptr, v uint8, n int) error { return l.dev.Memset8(p, v, n) }

// Memset32 queues a fill of n 4-byte words at p with v.
func (l *Launcher) Memset32(p Ptr, v uint32, n int) error { return l.dev.Memset32(p, v, n) }

// CopyDtoD queues a copy of bytes from src to dst on the device.
func (l *Launcher) CopyDtoD(dst, src Ptr, bytes int) error { return l.dev.CopyDtoD(dst, src, bytes) }

// Check is the address of c's words for the kernel queued next, and
// remembers explain, which turns the value the kernel reports into its
// error (see DataCheck).
func (l *Launcher) Check(c DataCheck, explain func(bad int32) error) Ptr {
	return l.b.flagPtr(c.slot, explain)
}

// WriteValue64 queues a write of the 64-bit word at p (8-byte aligned,
// this device's memory or a peer's through a peer pointer) to v, after the
// work queued before it, which it fences (cuStreamWriteValue64; the
// emulator stores at once).
func (l *Launcher) WriteValue64(p Ptr, v uint64) error {
	vd, err := l.values()
	if err != nil {
		return err
	}
	return vd.WriteValue64(p, v)
}

// WaitValue64 queues a wait of the stream until the 64-bit word at p is ≥
// v (wrap-around safe): cuStreamWaitValue64 with GEQ, which holds no SM and
// has no deadline. The emulator, whose work runs as it is queued, waits
// on the host instead, letting the other emulated devices run (they write
// the word), for at most emu.WaitTimeout.
func (l *Launcher) WaitValue64(p Ptr, v uint64) error {
	vd, err := l.values()
	if err != nil {
		return err
	}
	return vd.WaitValue64(p, v)
}

func (l *Launcher) values() (gpu.Values, error) {
	vd, ok := l.dev.(gpu.Values)
	if !ok {
		return nil, fmt.Errorf("%s has no 64-bit stream memory operations", l.dev.Name())
	}
	return vd, nil
}

// Stream is the stream the launches go to: the backend's, or OnStream's;
// nil on a device without CUDA streams (the kernel emulator, whose work is
// in order on its one stream). Record events on it, or make it wait on
// one.
func (l *Launcher) Stream() *cuda.Stream {
	if cd, ok := l.dev.(*cudaDevice); ok {
		return cd.stream
	}
	return nil
}

// OnStream runs fn with every launch, fill, copy and stream memory
// operation of l going to s (a stream of this backend's context,
// NewStream's); the backend's stream again after. A nil s is the
// backend's stream (also on the emulator, whose one stream runs its work
// in order); a device without CUDA streams (the emulator) refuses any
// other.
func (l *Launcher) OnStream(s *cuda.Stream, fn func() error) error {
	if s == nil {
		return fn()
	}
	cd, ok := l.dev.(*cudaDevice)
	if !ok {
		return fmt.Errorf("a launch on a side stream needs a GPU; %s has only its own stream", l.dev.Name())
	}
	main := cd.stream
	cd.stream = s
	defer func() { cd.stream = main }()
	return fn()
}

// ReserveSMs is the SMs the GEMM engine leaves free while it waits or
// signals (GEMMWait.ReserveSMs's default, of this process's share of the
// GPU): the grid of a kernel meant to run beside a waiting engine.
func (l *Launcher) ReserveSMs() int {
	avail := l.dev.SMCount()
	if cd, ok := l.dev.(*cudaDevice); ok {
		avail = cd.engineSMs
	}
	return l.b.reserveOf(avail, 0)
}

// OnGPU reports whether the backend runs on a GPU (a CUDA context with
// streams and events), not on the kernel emulator.
func (b *Backend) OnGPU() bool {
	_, ok := b.dev.(*cudaDevice)
	return ok
}

// Check starts the argument checks of op in the backend's terms
// (tensor/opcheck: its own live tensors, its dtypes), on the host before
// anything is queued; a failure becomes the sticky error when op asks OK.
func (b *Backend) Check(op string) *opcheck.Checker { return b.check(op) }
