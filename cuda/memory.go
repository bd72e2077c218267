package cuda

/*
#include "atp_cuda.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// DevicePtr is a device memory address (CUdeviceptr). With unified
// addressing (every 64-bit platform CUDA supports) it is also what a kernel
// sees as a pointer, and what NCCL and cuBLASLt take as void*.
type DevicePtr uint64

// Offset returns p advanced by bytes.
func (p DevicePtr) Offset(bytes int) DevicePtr { return p + DevicePtr(bytes) }

func (p DevicePtr) String() string { return fmt.Sprintf("0x%x", uint64(p)) }

// Elem is the set of element types the typed copies accept.
type Elem interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// sliceBytes returns the address and size in bytes of s's elements.
func sliceBytes[T Elem](s []T) (unsafe.Pointer, int) {
	if len(s) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&s[0]), len(s) * int(unsafe.Sizeof(s[0]))
}

// Alloc allocates device memory in the current context (cuMemAlloc). The
// memory is not initialised. The address is aligned to at least 256 bytes.
func Alloc(bytes int) (DevicePtr, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: cuMemAlloc(%d bytes): size must be positive", bytes)
	}
	var p C.CUdeviceptr
	if r := Result(C.atp_cuMemAlloc(&p, C.size_t(bytes))); r != Success {
		return 0, fail(r, "cuMemAlloc(%d bytes) on %s", bytes, currentDeviceName())
	}
	return DevicePtr(p), nil
}

// Free gives back memory from Alloc (cuMemFree). Freeing 0 is a no-op.
func Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemFree(C.CUdeviceptr(p))); r != Success {
		return fail(r, "cuMemFree(%v) on %s", p, currentDeviceName())
	}
	return nil
}

// MemsetD8 sets n bytes at p to v, on the legacy default stream (see the
// note on synchronous copies below).
func MemsetD8(p DevicePtr, v uint8, n int) error {
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemsetD8(C.CUdeviceptr(p), C.uchar(v), C.size_t(n))); r != Success {
		return fail(r, "cuMemsetD8(%v, %d, %d)", p, v, n)
	}
	return nil
}

// MemsetD16 sets n 16-bit words at p (2-byte aligned) to v.
func MemsetD16(p DevicePtr, v uint16, n int) error {
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemsetD16(C.CUdeviceptr(p), C.ushort(v), C.size_t(n))); r != Success {
		return fail(r, "cuMemsetD16(%v, %d, %d)", p, v, n)
	}
	return nil
}

// MemsetD32 sets n 32-bit words at p (4-byte aligned) to v.
func MemsetD32(p DevicePtr, v uint32, n int) error {
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemsetD32(C.CUdeviceptr(p), C.uint(v), C.size_t(n))); r != Success {
		return fail(r, "cuMemsetD32(%v, %d, %d)", p, v, n)
	}
	return nil
}

// MemsetD8Async is MemsetD8 queued on s.
func MemsetD8Async(p DevicePtr, v uint8, n int, s *Stream) error {
	if r := Result(C.atp_cuMemsetD8Async(C.CUdeviceptr(p), C.uchar(v), C.size_t(n), s.handle())); r != Success {
		return fail(r, "cuMemsetD8Async(%v, %d, %d)", p, v, n)
	}
	return nil
}

// MemsetD16Async is MemsetD16 queued on s.
func MemsetD16Async(p DevicePtr, v uint16, n int, s *Stream) error {
	if r := Result(C.atp_cuMemsetD16Async(C.CUdeviceptr(p), C.ushort(v), C.size_t(n), s.handle())); r != Success {
		return fail(r, "cuMemsetD16Async(%v, %d, %d)", p, v, n)
	}
	return nil
}

// MemsetD32Async is MemsetD32 queued on s.
func MemsetD32Async(p DevicePtr, v uint32, n int, s *Stream) error {
	if r := Result(C.atp_cuMemsetD32Async(C.CUdeviceptr(p), C.uint(v), C.size_t(n), s.handle())); r != Success {
		return fail(r, "cuMemsetD32Async(%v, %d, %d)", p, v, n)
	}
	return nil
}

// The "synchronous" copies and memsets (no Async suffix) are queued on the
// legacy default stream, and CUDA only partly waits for them: a
// device-to-host copy returns when it is complete, but a host-to-device copy
// from pageable memory may return once the data is staged, and memsets and
// device-to-device copies return at once. They are ordered with each other
// and with blocking streams, but NOT with the non-blocking streams NewStream
// creates. So:
//   - before a synchronous copy reads what work on a stream wrote,
//     synchronise that stream (or an event recorded on it);
//   - before work on a stream uses what synchronous copies or memsets
//     wrote, call Context.Synchronize;
//   - or, simplest, use the Async variants on the stream that does the work.
//
// Host memory given as an unsafe.Pointer must hold bytes at least; Go
// memory is allowed (it must not contain Go pointers). For the Async copies,
// CUDA's rules for pageable (ordinary Go) memory apply: a host-to-device copy
// returns once the source has been staged, and a device-to-host copy returns
// once it is complete, so Go memory is never used after the call returns.
// Only pinned memory (AllocHost) makes them truly asynchronous.

// CopyHtoD copies bytes from host memory src to device memory dst.
func CopyHtoD(dst DevicePtr, src unsafe.Pointer, bytes int) error {
	if bytes == 0 {
		return nil
	}
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemcpyHtoD(C.CUdeviceptr(dst), src, C.size_t(bytes))); r != Success {
		return fail(r, "cuMemcpyHtoD(%v, %d bytes) on %s", dst, bytes, currentDeviceName())
	}
	return nil
}

// CopyDtoH copies bytes from device memory src to host memory dst.
func CopyDtoH(dst unsafe.Pointer, src DevicePtr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemcpyDtoH(dst, C.CUdeviceptr(src), C.size_t(bytes))); r != Success {
		return fail(r, "cuMemcpyDtoH(%v, %d bytes) on %s", src, bytes, currentDeviceName())
	}
	return nil
}

// CopyDtoD copies bytes between device buffers.
func CopyDtoD(dst, src DevicePtr, bytes int) error {
	if bytes == 0 {
		return nil
	}
	if err := Init(); err != nil {
		return err
	}
	if r := Result(C.atp_cuMemcpyDtoD(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(bytes))); r != Success {
		return fail(r, "cuMemcpyDtoD(%v <- %v, %d bytes) on %s", dst, src, bytes, currentDeviceName())
	}
	return nil
}

// CopyHtoDAsync queues a host-to-device copy on s.
func CopyHtoDAsync(dst DevicePtr, src unsafe.Pointer, bytes int, s *Stream) error {
	if bytes == 0 {
		return nil
	}
	if r := Result(C.atp_cuMemcpyHtoDAsync(C.CUdeviceptr(dst), src, C.size_t(bytes), s.handle())); r != Success {
		return fail(r, "cuMemcpyHtoDAsync(%v, %d bytes) on %s", dst, bytes, currentDeviceName())
	}
	return nil
}

// CopyDtoHAsync queues a device-to-host copy on s.
func CopyDtoHAsync(dst unsafe.Pointer, src DevicePtr, bytes int, s *Stream) error {
	if bytes == 0 {
		return nil
	}
	if r := Result(C.atp_cuMemcpyDtoHAsync(dst, C.CUdeviceptr(src), C.size_t(bytes), s.handle())); r != Success {
		return fail(r, "cuMemcpyDtoHAsync(%v, %d bytes) on %s", src, bytes, currentDeviceName())
	}
	return nil
}

// CopyDtoDAsync queues a device-to-device copy on s.
func CopyDtoDAsync(dst, src DevicePtr, bytes int, s *Stream) error {
	if bytes == 0 {
		return nil
	}
	if r := Result(C.atp_cuMemcpyDtoDAsync(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(bytes), s.handle())); r != Success {
		return fail(r, "cuMemcpyDtoDAsync(%v <- %v, %d bytes) on %s", dst, src, bytes, currentDeviceName())
	}
	return nil
}

// Upload copies a host slice to dst (synchronous, legacy default stream).
func Upload[T Elem](dst DevicePtr, src []T) error {
	p, n := sliceBytes(src)
	return CopyHtoD(dst, p, n)
}

// Download copies len(dst) elements from src into a host slice
// (synchronous, legacy default stream).
func Download[T Elem](dst []T, src DevicePtr) error {
	p, n := sliceBytes(dst)
	return CopyDtoH(p, src, n)
}

// UploadAsync queues a copy of a host slice to dst on s (see the note on
// pageable memory above).
func UploadAsync[T Elem](dst DevicePtr, src []T, s *Stream) error {
	p, n := sliceBytes(src)
	return CopyHtoDAsync(dst, p, n, s)
}

// DownloadAsync queues a copy into a host slice on s. For Go memory it
// returns once the copy is done; for pinned memory, synchronise s first.
func DownloadAsync[T Elem](dst []T, src DevicePtr, s *Stream) error {
	p, n := sliceBytes(dst)
	return CopyDtoHAsync(p, src, n, s)
}

// HostBuffer is page-locked ("pinned") host memory from cuMemAllocHost,
// which the GPU's copy engines read and write directly, so that async
// copies overlap with computation. It is C memory: the Go garbage collector
// does not free it; call Free.
type HostBuffer struct {
	p unsafe.Pointer
	n int
}

// AllocHost allocates bytes of pinned host memory in the current context.
func AllocHost(bytes int) (*HostBuffer, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	if bytes <= 0 {
		return nil, fmt.Errorf("cuda: cuMemAllocHost(%d bytes): size must be positive", bytes)
	}
	var p unsafe.Pointer
	if r := Result(C.atp_cuMemAllocHost(&p, C.size_t(bytes))); r != Success {
		return nil, fail(r, "cuMemAllocHost(%d bytes) on %s", bytes, currentDeviceName())
	}
	return &HostBuffer{p: p, n: bytes}, nil
}

// Ptr is the buffer's address.
func (h *HostBuffer) Ptr() unsafe.Pointer { return h.p }

// Len is the buffer's size in bytes.
func (h *HostBuffer) Len() int { return h.n }

// Bytes views the buffer as a byte slice (valid until Free).
func (h *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// HostSlice views a pinned buffer as a slice of T (valid until Free).
func HostSlice[T Elem](h *HostBuffer) []T {
	var zero T
	return unsafe.Slice((*T)(h.p), h.n/int(unsafe.Sizeof(zero)))
}

// Free releases the buffer (cuMemFreeHost).
func (h *HostBuffer) Free() error {
	if h.p == nil {
		return nil
	}
	if r := Result(C.atp_cuMemFreeHost(h.p)); r != Success {
		return fail(r, "cuMemFreeHost(%d bytes)", h.n)
	}
	h.p, h.n = nil, 0
	return nil
}
