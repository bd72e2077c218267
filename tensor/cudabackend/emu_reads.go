//go:build asynctp_emu

package cudabackend

import (
	"sync/atomic"
	"unsafe"

	"github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// EmuReads counts the blocking host reads of an emulated backend (every
// device-to-host copy that waits for the queued work, and every Sync):
// the no-host-sync tests of the layers above count what a step reads,
// including the reads made inside this package. Reads queued with
// ReadAsync are not counted. While Paused, nothing is counted (a test's
// emulated transport moving device tensors through the host).
type EmuReads struct {
	n      atomic.Int64
	Paused atomic.Bool
}

// Count returns the reads so far.
func (r *EmuReads) Count() int { return int(r.n.Load()) }

type countingDevice struct {
	gpu.Device
	r *EmuReads
}

func (d countingDevice) CopyDtoH(dst unsafe.Pointer, src gpu.Ptr, bytes int) error {
	if !d.r.Paused.Load() {
		d.r.n.Add(1)
	}
	return d.Device.CopyDtoH(dst, src, bytes)
}

func (d countingDevice) Sync() error {
	if !d.r.Paused.Load() {
		d.r.n.Add(1)
	}
	return d.Device.Sync()
}

// NewEmulatedCounting is NewEmulated with its blocking host reads counted.
func NewEmulatedCounting(opts ...Option) (*Backend, *EmuReads, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	r := &EmuReads{}
	b, err := newBackend(countingDevice{emu.New(8), r}, 0, cfg)
	return b, r, err
}
