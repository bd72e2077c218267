package cuda

/*
#include "atp_cuda.h"
*/
import "C"

import (
	"fmt"
	"time"
)

// Stream is a CUDA stream. A nil *Stream is the legacy default stream
// (handle 0) wherever a stream is taken.
type Stream struct {
	h C.CUstream
}

// CU_STREAM_NON_BLOCKING (cuda.h): the stream does not synchronise with the
// legacy default stream.
const streamNonBlocking = 0x1

// NewStream creates a non-blocking stream in the current context.
func NewStream() (*Stream, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	var h C.CUstream
	if r := Result(C.atp_cuStreamCreate(&h, streamNonBlocking)); r != Success {
		return nil, fail(r, "cuStreamCreate on %s", currentDeviceName())
	}
	return &Stream{h: h}, nil
}

// NewStreamWithPriority creates a non-blocking stream with a priority
// (lower numbers are higher priority; see StreamPriorityRange). Useful to
// let communication kernels overtake computation.
func NewStreamWithPriority(priority int) (*Stream, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	var h C.CUstream
	if r := Result(C.atp_cuStreamCreateWithPriority(&h, streamNonBlocking, C.int(priority))); r != Success {
		return nil, fail(r, "cuStreamCreateWithPriority(%d) on %s", priority, currentDeviceName())
	}
	return &Stream{h: h}, nil
}

// StreamPriorityRange returns the current context's stream priorities: least
// (the default, numerically largest) and greatest (numerically smallest).
func StreamPriorityRange() (least, greatest int, err error) {
	if err := Init(); err != nil {
		return 0, 0, err
	}
	var l, g C.int
	if r := Result(C.atp_cuCtxGetStreamPriorityRange(&l, &g)); r != Success {
		return 0, 0, fail(r, "cuCtxGetStreamPriorityRange on %s", currentDeviceName())
	}
	return int(l), int(g), nil
}

// StreamFromHandle wraps a CUstream (or cudaStream_t) made elsewhere. The
// Stream does not own it: do not Destroy it unless you own the handle.
func StreamFromHandle(h uintptr) *Stream { return &Stream{h: C.CUstream(h)} }

func (s *Stream) handle() C.CUstream {
	if s == nil {
		return 0
	}
	return s.h
}

// Handle is the CUstream, which is also a cudaStream_t, for NCCL, cuBLASLt
// and kernels launched by other libraries. The nil stream's handle is 0.
func (s *Stream) Handle() uintptr { return uintptr(s.handle()) }

func (s *Stream) String() string { return fmt.Sprintf("stream 0x%x", s.Handle()) }

// Synchronize waits until all work queued on s is done.
func (s *Stream) Synchronize() error {
	if r := Result(C.atp_cuStreamSynchronize(s.handle())); r != Success {
		return fail(r, "cuStreamSynchronize(%v)", s)
	}
	return nil
}

// Query reports whether all work queued on s is done, without waiting.
func (s *Stream) Query() (bool, error) {
	switch r := Result(C.atp_cuStreamQuery(s.handle())); r {
	case Success:
		return true, nil
	case ErrNotReady:
		return false, nil
	default:
		return false, fail(r, "cuStreamQuery(%v)", s)
	}
}

// WaitEvent makes later work on s wait until the work recorded by e is done
// (cuStreamWaitEvent). The host does not wait.
func (s *Stream) WaitEvent(e *Event) error {
	if r := Result(C.atp_cuStreamWaitEvent(s.handle(), e.h, 0)); r != Success {
		return fail(r, "cuStreamWaitEvent(%v)", s)
	}
	return nil
}

// WaitCondition says when a stream wait on a memory word is satisfied
// (CUstreamWaitValue_flags, cuda.h).
type WaitCondition uint32

const (
	// WaitGEQ waits until (int64)(*addr - value) >= 0 (wrap-around
	// safe), the usual condition for a monotonically increasing signal.
	WaitGEQ WaitCondition = 0x0
	// WaitEQ waits until *addr == value.
	WaitEQ WaitCondition = 0x1
	// WaitAND waits until (*addr & value) != 0.
	WaitAND WaitCondition = 0x2
	// WaitNOR waits until ^(*addr | value) != 0.
	WaitNOR WaitCondition = 0x3
	// WaitFlush may be or-ed in: flush outstanding remote (RDMA) writes
	// after the wait; needs CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES.
	WaitFlush WaitCondition = 1 << 30
)

// WaitValue64 makes later work on s wait until the 64-bit word at addr
// satisfies cond against value (cuStreamWaitValue64_v2). addr is device
// memory (or host memory mapped for the device), 8-byte aligned. Another
// stream, a kernel, another GPU or the host sets the word.
//
// The driver does not see this dependency: work ordered only by it can
// deadlock if the writer cannot run (for instance a writer queued behind
// the waiter on the same stream). Keep the writer on another stream.
func (s *Stream) WaitValue64(addr DevicePtr, value uint64, cond WaitCondition) error {
	if r := Result(C.atp_cuStreamWaitValue64(s.handle(), C.CUdeviceptr(addr), C.uint64_t(value), C.uint(cond))); r != Success {
		return fail(r, "cuStreamWaitValue64(%v, %v, %d, cond %#x)", s, addr, value, uint32(cond))
	}
	return nil
}

// WriteValue64 queues on s a write of value to the 64-bit word at addr
// (cuStreamWriteValue64_v2), after all earlier work of s, with a memory
// barrier making that work's writes visible first.
func (s *Stream) WriteValue64(addr DevicePtr, value uint64) error {
	if r := Result(C.atp_cuStreamWriteValue64(s.handle(), C.CUdeviceptr(addr), C.uint64_t(value), 0)); r != Success {
		return fail(r, "cuStreamWriteValue64(%v, %v, %d)", s, addr, value)
	}
	return nil
}

// WaitValue32 is WaitValue64 on a 32-bit word (4-byte aligned).
func (s *Stream) WaitValue32(addr DevicePtr, value uint32, cond WaitCondition) error {
	if r := Result(C.atp_cuStreamWaitValue32(s.handle(), C.CUdeviceptr(addr), C.uint32_t(value), C.uint(cond))); r != Success {
		return fail(r, "cuStreamWaitValue32(%v, %v, %d, cond %#x)", s, addr, value, uint32(cond))
	}
	return nil
}

// WriteValue32 is WriteValue64 on a 32-bit word.
func (s *Stream) WriteValue32(addr DevicePtr, value uint32) error {
	if r := Result(C.atp_cuStreamWriteValue32(s.handle(), C.CUdeviceptr(addr), C.uint32_t(value), 0)); r != Success {
		return fail(r, "cuStreamWriteValue32(%v, %v, %d)", s, addr, value)
	}
	return nil
}

// Destroy destroys the stream (cuStreamDestroy_v2). Work already queued
// still completes. Destroying the nil stream is a no-op.
func (s *Stream) Destroy() error {
	if s == nil || s.h == 0 {
		return nil
	}
	if r := Result(C.atp_cuStreamDestroy(s.h)); r != Success {
		return fail(r, "cuStreamDestroy(%v)", s)
	}
	s.h = 0
	return nil
}

// Event is a CUDA event: a marker recorded on a stream, to wait for from the
// host or from other streams, and to time work with.
type Event struct {
	h      C.CUevent
	timing bool
}

// CUevent_flags (cuda.h).
const (
	eventDisableTiming = 0x2
)

// NewEvent creates an event in the current context. Events without timing
// are cheaper to record and wait for; only timing events work with Elapsed.
func NewEvent(timing bool) (*Event, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	flags := C.uint(0)
	if !timing {
		flags = eventDisableTiming
	}
	var h C.CUevent
	if r := Result(C.atp_cuEventCreate(&h, flags)); r != Success {
		return nil, fail(r, "cuEventCreate on %s", currentDeviceName())
	}
	return &Event{h: h, timing: timing}, nil
}

// Handle is the CUevent (also a cudaEvent_t).
func (e *Event) Handle() uintptr { return uintptr(e.h) }

// Record marks the current end of s's queue (cuEventRecord).
func (e *Event) Record(s *Stream) error {
	if r := Result(C.atp_cuEventRecord(e.h, s.handle())); r != Success {
		return fail(r, "cuEventRecord(on %v)", s)
	}
	return nil
}

// Synchronize waits until the recorded work is done.
func (e *Event) Synchronize() error {
	if r := Result(C.atp_cuEventSynchronize(e.h)); r != Success {
		return fail(r, "cuEventSynchronize")
	}
	return nil
}

// Query reports whether the recorded work is done, without waiting.
func (e *Event) Query() (bool, error) {
	switch r := Result(C.atp_cuEventQuery(e.h)); r {
	case Success:
		return true, nil
	case ErrNotReady:
		return false, nil
	default:
		return false, fail(r, "cuEventQuery")
	}
}

// Destroy destroys the event (cuEventDestroy_v2).
func (e *Event) Destroy() error {
	if e == nil || e.h == 0 {
		return nil
	}
	if r := Result(C.atp_cuEventDestroy(e.h)); r != Success {
		return fail(r, "cuEventDestroy")
	}
	e.h = 0
	return nil
}

// Elapsed returns the GPU time between two completed timing events
// (cuEventElapsedTime, resolution about 0.5 µs).
func Elapsed(start, end *Event) (time.Duration, error) {
	if !start.timing || !end.timing {
		return 0, fmt.Errorf("cuda: Elapsed needs events created with NewEvent(true)")
	}
	var ms C.float
	if r := Result(C.atp_cuEventElapsedTime(&ms, start.h, end.h)); r != Success {
		return 0, fail(r, "cuEventElapsedTime")
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
