//go:build asynctp_emu

package emu

/*
#cgo CXXFLAGS: -std=c++17 -O2 -fno-strict-aliasing -DASYNCTP_EMU -I${SRCDIR}/../../../../cuda/kernels
#include <stdlib.h>
int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned smem, void** args, const long long* sizes, int nargs, char* err, int errlen);
int emu_kernel_args(const char* name);
void emu_set_reverse(int r);
int emu_gemm(int type, int transA, int transB, int M, int N, int K, int batch, float alpha, float beta,
             const void* A, const void* B, void* C);
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// The emulator has global state (one block runs at a time): every device
// shares this lock.
var mu sync.Mutex

// Device is a gpu.Device whose memory is C heap memory and whose kernels run
// in the emulator.
type Device struct {
	sms    int
	allocs map[gpu.Ptr]int
	closed bool
}

var _ gpu.Device = (*Device)(nil)

// New returns an emulated device that reports sms multiprocessors (grid
// sizing only).
func New(sms int) *Device { return &Device{sms: sms, allocs: make(map[gpu.Ptr]int)} }

func (d *Device) Acquire() error { mu.Lock(); return nil }
func (d *Device) Release()       { mu.Unlock() }
func (d *Device) Name() string   { return "emulated GPU" }
func (d *Device) SMCount() int   { return d.sms }

// Allocated returns the number of live allocations (tests of the caching
// allocator).
func (d *Device) Allocated() int { return len(d.allocs) }

func (d *Device) Alloc(bytes int) (gpu.Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("emu: alloc of %d bytes", bytes)
	}
	n := (bytes + 255) / 256 * 256
	p := C.aligned_alloc(256, C.size_t(n))
	if p == nil {
		return 0, fmt.Errorf("emu: out of memory allocating %d bytes", bytes)
	}
	// Garbage, as cuMemAlloc gives: NaN in every float format.
	b := unsafe.Slice((*byte)(p), n)
	for i := range b {
		b[i] = 0xff
	}
	ptr := gpu.Ptr(uintptr(p))
	d.allocs[ptr] = n
	return ptr, nil
}

func (d *Device) Free(p gpu.Ptr) error {
	if _, ok := d.allocs[p]; !ok {
		return fmt.Errorf("emu: free of %#x, not an allocation", uint64(p))
	}
	delete(d.allocs, p)
	C.free(cptr(p))
	return nil
}

// cptr turns a device address (C heap memory) back into a pointer.
func cptr(p gpu.Ptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

func (d *Device) mem(p gpu.Ptr, bytes int) []byte {
	return unsafe.Slice((*byte)(cptr(p)), bytes)
}

func (d *Device) Memset8(p gpu.Ptr, v uint8, n int) error {
	b := d.mem(p, n)
	for i := range b {
		b[i] = v
	}
	return nil
}

func (d *Device) Memset16(p gpu.Ptr, v uint16, n int) error {
	s := unsafe.Slice((*uint16)(cptr(p)), n)
	for i := range s {
		s[i] = v
	}
	return nil
}

func (d *Device) Memset32(p gpu.Ptr, v uint32, n int) error {
	s := unsafe.Slice((*uint32)(cptr(p)), n)
	for i := range s {
		s[i] = v
	}
	return nil
}

func (d *Device) CopyHtoD(dst gpu.Ptr, src unsafe.Pointer, bytes int) error {
	copy(d.mem(dst, bytes), unsafe.Slice((*byte)(src), bytes))
	return nil
}

func (d *Device) CopyDtoH(dst unsafe.Pointer, src gpu.Ptr, bytes int) error {
	copy(unsafe.Slice((*byte)(dst), bytes), d.mem(src, bytes))
	return nil
}

// ReadAsync copies at once: the emulator's work is done when it is queued.
func (d *Device) ReadAsync(spans []gpu.Span) (func() ([]byte, error), error) {
	var out []byte
	for _, sp := range spans {
		out = append(out, d.mem(sp.Ptr, sp.Bytes)...)
	}
	if len(out) > gpu.ReadAsyncMax {
		return nil, fmt.Errorf("ReadAsync of %d bytes, at most %d", len(out), gpu.ReadAsyncMax)
	}
	return func() ([]byte, error) { return out, nil }, nil
}

func (d *Device) CopyDtoD(dst, src gpu.Ptr, bytes int) error {
	copy(d.mem(dst, bytes), d.mem(src, bytes))
	return nil
}

// Launch runs the kernel to completion. The emulator checks the number of
// arguments and each one's size against the kernel's C signature.
func (d *Device) Launch(name string, grid, block gpu.Dim3, smem int, args ...any) error {
	n := len(args)
	vals := (*[1 << 20]byte)(C.calloc(C.size_t(max(n, 1)), 8))[: 8*max(n, 1) : 8*max(n, 1)]
	ptrs := (*[1 << 16]unsafe.Pointer)(C.calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof(uintptr(0)))))[:max(n, 1):max(n, 1)]
	sizes := (*[1 << 16]C.longlong)(C.calloc(C.size_t(max(n, 1)), 8))[:max(n, 1):max(n, 1)]
	defer C.free(unsafe.Pointer(&vals[0]))
	defer C.free(unsafe.Pointer(&ptrs[0]))
	defer C.free(unsafe.Pointer(&sizes[0]))
	le := binary.LittleEndian
	for i, a := range args {
		v := vals[8*i : 8*i+8]
		switch x := a.(type) {
		case gpu.Ptr:
			le.PutUint64(v, uint64(x))
			sizes[i] = 8
		case int32:
			le.PutUint32(v, uint32(x))
			sizes[i] = 4
		case int64:
			le.PutUint64(v, uint64(x))
			sizes[i] = 8
		case float32:
			le.PutUint32(v, math.Float32bits(x))
			sizes[i] = 4
		default:
			return fmt.Errorf("emu: kernel %s: argument %d has type %T (want gpu.Ptr, int32, int64 or float32)", name, i, a)
		}
		ptrs[i] = unsafe.Pointer(&vals[8*i])
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	errbuf := (*C.char)(C.calloc(512, 1))
	defer C.free(unsafe.Pointer(errbuf))
	r := C.emu_launch(cname, C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(smem),
		&ptrs[0], &sizes[0], C.int(n), errbuf, 512)
	if r != 0 {
		return fmt.Errorf("emu: %s", C.GoString(errbuf))
	}
	return nil
}

// SetReverse makes the threads of a block run last to first between
// barriers (true) or first to last (false, the default), for every device.
// A kernel missing a barrier between a shared-memory write and another
// thread's read gives different results in the two orders.
func SetReverse(r bool) {
	mu.Lock()
	defer mu.Unlock()
	v := C.int(0)
	if r {
		v = 1
	}
	C.emu_set_reverse(v)
}

// HasKernel reports whether the emulated image has a kernel called name.
func (d *Device) HasKernel(name string) bool { return HasKernel(name) }

// HasKernel reports whether the emulated image has a kernel called name.
func HasKernel(name string) bool {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.emu_kernel_args(cname) >= 0
}

func (d *Device) Gemm(g gpu.Gemm) error {
	typ := 0
	if g.Type == gpu.BF16 {
		typ = 1
	}
	b2i := func(b bool) C.int {
		if b {
			return 1
		}
		return 0
	}
	if C.emu_gemm(C.int(typ), b2i(g.TransA), b2i(g.TransB), C.int(g.M), C.int(g.N), C.int(g.K), C.int(g.Batch),
		C.float(g.Alpha), C.float(g.Beta), cptr(g.A), cptr(g.B), cptr(g.C)) != 0 {
		return fmt.Errorf("emu: bad gemm %+v", g)
	}
	return nil
}

func (d *Device) Sync() error { return nil }

var _ gpu.Values = (*Device)(nil)

// WriteValue64 stores v at p at once (the work queued before it is done).
func (d *Device) WriteValue64(p gpu.Ptr, v uint64) error {
	if p%8 != 0 {
		return fmt.Errorf("emu: WriteValue64 at %#x: expected an 8-byte aligned address", uint64(p))
	}
	*(*uint64)(cptr(p)) = v
	return nil
}

// WaitTimeout bounds the emulator's stream waits (WaitValue64), which on a
// GPU have no deadline: a word that another emulated rank never writes
// fails the wait instead of hanging the test.
var WaitTimeout = 2 * time.Minute

// WaitValue64 returns once the word at p is ≥ v (wrap-around safe). The
// emulator runs the work of a stream as it is queued, so the wait is the
// caller's: it polls the word and lets the other devices (the other
// emulated ranks, which write it) run between its looks, for at most
// WaitTimeout. The caller holds the device (Acquire); it is held again
// when WaitValue64 returns.
func (d *Device) WaitValue64(p gpu.Ptr, v uint64) error {
	if p%8 != 0 {
		return fmt.Errorf("emu: WaitValue64 at %#x: expected an 8-byte aligned address", uint64(p))
	}
	w := (*uint64)(cptr(p))
	start, pause := time.Now(), time.Microsecond
	for int64(*w-v) < 0 {
		if time.Since(start) > WaitTimeout {
			return fmt.Errorf("emu: stream wait at %#x: the word is %d after %v, expected ≥ %d", uint64(p), *w, WaitTimeout, v)
		}
		mu.Unlock()
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
		mu.Lock()
	}
	return nil
}

func (d *Device) Close() error {
	d.closed = true
	return nil
}
