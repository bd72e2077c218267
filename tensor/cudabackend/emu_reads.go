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
//
// The emulator runs every op when it is queued, so a ReadAsync's Wait
// never waits; on a GPU it waits when the copy was queued in the step
// the host is still queuing (the host then stalls until the device gets
// there). A test that calls NewStep at the start of each step has those
// waits counted apart (InStepWaits): the waits for a read queued since
// the last NewStep.
type EmuReads struct {
	n      atomic.Int64
	Paused atomic.Bool
	step   atomic.Int64
	inStep atomic.Int64
}

// Count returns the reads so far.
func (r *EmuReads) Count() int { return int(r.n.Load()) }

// NewStep marks the start of a step: the ReadAsyncs queued before it are
// the earlier steps'.
func (r *EmuReads) NewStep() { r.step.Add(1) }

// InStepWaits returns how many ReadAsync waits so far were for a read
// queued in the step of the wait (since the last NewStep).
func (r *EmuReads) InStepWaits() int { return int(r.inStep.Load()) }

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

func (d countingDevice) ReadAsync(spans []gpu.Span) (func() ([]byte, error), error) {
	wait, err := d.Device.ReadAsync(spans)
	if err != nil {
		return nil, err
	}
	at := d.r.step.Load()
	return func() ([]byte, error) {
		if !d.r.Paused.Load() && d.r.step.Load() == at {
			d.r.inStep.Add(1)
		}
		return wait()
	}, nil
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
