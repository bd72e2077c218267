package cudabackend

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

var _ tensor.AsyncReader = (*Backend)(nil)

// ReadAsync implements tensor.AsyncReader: it queues a copy of src (at most
// a few hundred values) and of the kernels' data-check flags into a pinned
// buffer, after the work queued so far, and returns at once. Wait waits for
// that copy only (an event), not for work queued after it, so a training
// loop can queue step s+1 before it reads step s's loss. When the copied
// flags show a kernel's data check failed, Wait reads them back as Sync
// does (waiting for the GPU) so the op's error is recorded and returned.
func (b *Backend) ReadAsync(src *tensor.Tensor) tensor.HostRead {
	c := b.check("ReadAsync")
	c.Float("src", src)
	if !c.OK() {
		return tensor.DoneRead(nil, b.Err())
	}
	dt, n := src.DType(), src.Numel()
	bytes := n * dt.Size()
	if bytes+flagBytes > gpu.ReadAsyncMax {
		err := fmt.Errorf("cuda: ReadAsync: src %v has %d bytes, at most %d", src, bytes, gpu.ReadAsyncMax-flagBytes)
		b.fail(err)
		return tensor.DoneRead(nil, err)
	}
	var wait func() ([]byte, error)
	b.do("ReadAsync", func(d gpu.Device) error {
		var err error
		wait, err = d.ReadAsync([]gpu.Span{{Ptr: ptr(src), Bytes: bytes}, {Ptr: b.flags, Bytes: flagBytes}})
		return err
	})
	if wait == nil {
		return tensor.DoneRead(nil, b.Err())
	}
	return &asyncRead{b: b, wait: wait, dt: dt, n: n, shape: src.Shape().Clone()}
}

type asyncRead struct {
	b     *Backend
	wait  func() ([]byte, error)
	dt    tensor.DType
	n     int
	shape tensor.Shape
	done  bool
}

func (r *asyncRead) Wait() ([]float64, error) {
	if r.done {
		return nil, errors.New("cuda: ReadAsync: Wait called twice")
	}
	r.done = true
	b := r.b
	var raw []byte
	var werr error
	func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.closed {
			werr = fmt.Errorf("cuda: ReadAsync: %w", errClosed)
			return
		}
		if err := b.dev.Acquire(); err != nil {
			werr = fmt.Errorf("cuda: ReadAsync: %w", err)
			return
		}
		defer b.dev.Release()
		// The wait runs even when an error is recorded: it gives the
		// pinned buffer back.
		if raw, werr = r.wait(); werr != nil {
			werr = fmt.Errorf("cuda: ReadAsync: %w", werr)
			b.setFatal(werr)
			return
		}
		flags := raw[len(raw)-flagBytes:]
		for _, f := range flags {
			if f != 0 {
				if err := b.dev.Sync(); err == nil {
					b.readFlags()
				}
				break
			}
		}
	}()
	if werr != nil {
		return nil, werr
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	h := tensor.MustHost(tensor.Float64, r.shape...)
	if r.n > 0 {
		storeHost(h, raw[:r.n*r.dt.Size()], r.dt)
	}
	return h.F64(), nil
}
