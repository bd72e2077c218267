package cudabackend

import (
	"fmt"
	"time"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

// The stream fork/join of the communication sites (tensor.Streams): a site
// queues its communication on a side stream of its own, ordered after the
// backend's work by an event, and the backend's stream waits on the
// site's Work the same way. Streams are *cuda.Stream; nil names the
// backend's stream.

var _ tensor.Streams = (*Backend)(nil)

// NewStream makes a non-blocking stream on the backend's device. On the
// kernel emulator, whose one stream runs its work in issue order, it is
// that stream (a nil *cuda.Stream, which names the backend's own).
func (b *Backend) NewStream() (any, error) {
	var s *cuda.Stream
	if !b.OnGPU() {
		return s, nil
	}
	err := b.OnDevice(func(*cuda.Stream) error {
		var err error
		s, err = cuda.NewStream()
		return err
	})
	return s, err
}

// StreamWait makes waiter wait for the work queued so far on on (on the
// emulator, one stream, nothing to do).
func (b *Backend) StreamWait(waiter, on any) error {
	if !b.OnGPU() {
		_, err := b.streamOf(waiter, nil)
		if err == nil {
			_, err = b.streamOf(on, nil)
		}
		return err
	}
	return b.OnDevice(func(own *cuda.Stream) error {
		w, err := b.streamOf(waiter, own)
		if err != nil {
			return err
		}
		o, err := b.streamOf(on, own)
		if err != nil {
			return err
		}
		if w == o {
			return nil
		}
		// One event serves every call: a stream wait captures the event's
		// latest record when it is queued, so recording it again for the
		// next call leaves this wait as it was.
		if b.fork == nil {
			e, err := cuda.NewEvent(false)
			if err != nil {
				return err
			}
			b.fork = e
		}
		if err := b.fork.Record(o); err != nil {
			return err
		}
		return w.WaitEvent(b.fork)
	})
}

// DestroyStream destroys a stream of NewStream (after its queued work).
func (b *Backend) DestroyStream(s any) error {
	if !b.OnGPU() {
		_, err := b.streamOf(s, nil)
		return err
	}
	return b.OnDevice(func(own *cuda.Stream) error {
		st, err := b.streamOf(s, own)
		if err != nil || st == own {
			return err
		}
		return st.Destroy()
	})
}

func (b *Backend) streamOf(s any, own *cuda.Stream) (*cuda.Stream, error) {
	switch v := s.(type) {
	case nil:
		return own, nil
	case *cuda.Stream:
		if v == nil {
			return own, nil
		}
		return v, nil
	}
	return nil, fmt.Errorf("stream %T: expected a *cuda.Stream of this backend, or nil for its own", s)
}

// OnDevice runs fn on this goroutine with the backend's CUDA context bound
// (and the backend locked), for code that queues driver calls of its own
// on the backend's stream, given to fn, or on streams of NewStream: the
// communication sites' copies and stream memory operations. It returns
// fn's error; it does not record it as the backend's.
func (b *Backend) OnDevice(fn func(stream *cuda.Stream) error) error {
	return b.bound(func(d *cudaDevice) error { return fn(d.stream) })
}

// SyncAll waits on the host for all work of the backend's CUDA context:
// every stream, the transports' included (cuCtxSynchronize). NVSHMEM's
// symmetric allocations are world collectives during which no NVSHMEM
// kernel may be in flight; a site calls this before one.
//
// On the kernel emulator, whose one stream has done its work when it is
// queued, there is nothing to wait for.
func (b *Backend) SyncAll() error {
	if !b.OnGPU() {
		return nil
	}
	return b.bound(func(d *cudaDevice) error { return d.ctx.Synchronize() })
}

// bound runs fn with the backend locked and its CUDA context bound to this
// goroutine's thread.
func (b *Backend) bound(fn func(d *cudaDevice) error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("cuda: %w", errClosed)
	}
	d, ok := b.dev.(*cudaDevice)
	if !ok {
		return fmt.Errorf("cuda: the backend runs on %s, which has no CUDA context or streams", b.dev.Name())
	}
	if err := d.Acquire(); err != nil {
		return err
	}
	defer d.Release()
	return fn(d)
}

// DeviceBuffer is device memory that another allocator owns (NVSHMEM's
// symmetric heap, a transport's buffers): the backend's ops accept tensors
// of such buffers on its own device, and never free them.
type DeviceBuffer interface {
	tensor.Buffer
	// Ptr is the device address of element 0.
	Ptr() uint64
}

// isForeign reports whether t is a tensor of device memory on b's device
// that another allocator owns (a DeviceBuffer that is not a *Buffer).
func isForeign(b *Backend, t *tensor.Tensor) bool {
	if t == nil {
		return false
	}
	buf, ok := t.Buffer().(DeviceBuffer)
	if !ok || buf.Device() != b.Device() || buf.Ptr() == 0 {
		return false
	}
	_, own := buf.(*Buffer)
	return !own
}

// TimeEvents runs fn and returns the device time of the work fn queued on
// the backend's stream, by CUDA events recorded before and after it (the
// host waits for the second); an error of fn, of the events, or the
// backend's sticky error after it is returned instead.
func (b *Backend) TimeEvents(fn func() error) (time.Duration, error) {
	var start, end *cuda.Event
	if err := b.OnDevice(func(s *cuda.Stream) error {
		var err error
		if start, err = cuda.NewEvent(true); err != nil {
			return err
		}
		if end, err = cuda.NewEvent(true); err != nil {
			return err
		}
		return start.Record(s)
	}); err != nil {
		_ = b.OnDevice(func(*cuda.Stream) error { destroyEvents(start, end); return nil })
		return 0, err
	}
	defer func() { _ = b.OnDevice(func(*cuda.Stream) error { destroyEvents(start, end); return nil }) }()
	if err := fn(); err != nil {
		return 0, err
	}
	var d time.Duration
	err := b.OnDevice(func(s *cuda.Stream) error {
		if err := end.Record(s); err != nil {
			return err
		}
		if err := end.Synchronize(); err != nil {
			return err
		}
		var err error
		d, err = cuda.Elapsed(start, end)
		return err
	})
	if err == nil {
		err = b.Err()
	}
	return d, err
}

func destroyEvents(es ...*cuda.Event) {
	for _, e := range es {
		if e != nil {
			e.Destroy()
		}
	}
}
