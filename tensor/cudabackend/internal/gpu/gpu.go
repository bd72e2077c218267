// Package gpu is the narrow device interface the CUDA backend runs on: memory,
// copies, kernel launches by name and GEMMs, all ordered on one stream. The
// backend implements it over package cuda (the real GPU); package
// internal/emu implements it over a CPU emulator of the kernels, so the
// backend's launch code (grids, argument lists, scratch buffers) can be
// tested on machines without a GPU.
package gpu

import (
	"fmt"
	"unsafe"
)

// Ptr is a device address. Kernel arguments of this type are pointers.
type Ptr uint64

// Offset returns p advanced by bytes.
func (p Ptr) Offset(bytes int) Ptr { return p + Ptr(bytes) }

// Dim3 is a grid or block size.
type Dim3 [3]uint32

// D1 is the 1-D size (x, 1, 1).
func D1(x int) Dim3 { return Dim3{uint32(x), 1, 1} }

// D2 is the 2-D size (x, y, 1).
func D2(x, y int) Dim3 { return Dim3{uint32(x), uint32(y), 1} }

// ElemType is a GEMM element type.
type ElemType uint8

const (
	F32 ElemType = iota + 1
	BF16
)

func (e ElemType) String() string {
	switch e {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("ElemType(%d)", uint8(e))
}

// Gemm is C = alpha·op(A)·op(B) + beta·C on row-major matrices: op(A) is
// M×K (A stored K×M with TransA), op(B) is K×N (B stored N×K with TransB), C
// is M×N, all packed, repeated Batch times back to back. beta = 0 does not
// read C. A, B and C share Type; accumulation is fp32.
type Gemm struct {
	TransA, TransB bool
	M, N, K, Batch int
	Alpha, Beta    float32
	A, B, C        Ptr
	Type           ElemType
}

// Span is bytes of device memory at Ptr.
type Span struct {
	Ptr   Ptr
	Bytes int
}

// ReadAsyncMax is the most bytes one ReadAsync reads: it is for a few
// values (a loss, a norm, the kernels' data checks), into pinned buffers
// of this size kept for reuse.
const ReadAsyncMax = 4096

// Device is one GPU (or its emulation) with one stream. Every method that
// touches device memory is ordered after the work queued before it.
type Device interface {
	// Acquire readies the calling goroutine to use the device until Release
	// (for a GPU: locks it to its OS thread and makes the device's context
	// current there). The backend serialises its calls; Acquire/Release
	// bracket each of its ops.
	Acquire() error
	// Release undoes Acquire.
	Release()
	// Name says which device this is, for errors.
	Name() string
	// SMCount is the number of multiprocessors (grid sizing).
	SMCount() int
	// Alloc returns bytes of uninitialised device memory, 256-byte aligned.
	Alloc(bytes int) (Ptr, error)
	// Free gives memory from Alloc back. The caller guarantees no queued
	// work uses it (or synchronises first).
	Free(p Ptr) error
	// Memset8/16/32 queue a fill of n elements of 1, 2 or 4 bytes.
	Memset8(p Ptr, v uint8, n int) error
	Memset16(p Ptr, v uint16, n int) error
	Memset32(p Ptr, v uint32, n int) error
	// CopyHtoD copies host memory to the device after the queued work; src
	// may be reused when it returns.
	CopyHtoD(dst Ptr, src unsafe.Pointer, bytes int) error
	// CopyDtoH waits for the queued work, then copies to host memory.
	CopyDtoH(dst unsafe.Pointer, src Ptr, bytes int) error
	// ReadAsync queues copies of the spans (at most ReadAsyncMax bytes in
	// all) into host memory of the device's own after the queued work and
	// returns at once; wait blocks for those copies only and returns the
	// spans' bytes back to back. wait must be called once, with the device
	// acquired.
	ReadAsync(spans []Span) (wait func() ([]byte, error), err error)
	// CopyDtoD queues a device-to-device copy.
	CopyDtoD(dst, src Ptr, bytes int) error
	// HasKernel reports whether the kernels image has a kernel called name.
	HasKernel(name string) bool
	// Launch queues the kernel called name. args are Ptr, int32, int64 or
	// float32, matching the kernel's parameters in order.
	Launch(name string, grid, block Dim3, smem int, args ...any) error
	// Gemm queues a GEMM.
	Gemm(g Gemm) error
	// Sync waits for all queued work.
	Sync() error
	// Close releases the device's resources (not the memory from Alloc).
	Close() error
}

// Values is a Device with 64-bit stream memory operations: a write of a
// word ordered after the work queued before it (which it fences), and a
// wait of the stream until a word is ≥ a value (wrap-around safe: the
// signed difference is ≥ 0), as cuStreamWriteValue64 and
// cuStreamWaitValue64 with CU_STREAM_WAIT_VALUE_GEQ do. Words are 8-byte
// aligned device addresses, local or a peer's.
type Values interface {
	WriteValue64(p Ptr, v uint64) error
	WaitValue64(p Ptr, v uint64) error
}
