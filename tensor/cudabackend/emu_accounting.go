//go:build asynctp_emu

package cudabackend

import (
	"fmt"
	"unsafe"

	"github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// accountingDevice is the emulated device with the arithmetic left out: it
// hands out addresses but no memory, and every copy, fill, kernel and GEMM
// does nothing (a read gives zeros). The backend above it takes every
// decision it takes on the emulator (the same kernels image, so the same
// kernels and workspaces) and allocates every buffer it allocates there:
// the memory ledger's account of a step at shapes far too large to
// emulate. Its numbers are not the model's (every value read is 0).
type accountingDevice struct {
	*emu.Device
	next   gpu.Ptr
	allocs map[gpu.Ptr]int
}

func (d *accountingDevice) Alloc(bytes int) (gpu.Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("emu accounting: alloc of %d bytes", bytes)
	}
	p := d.next
	d.next += gpu.Ptr((bytes + 255) / 256 * 256)
	d.allocs[p] = bytes
	return p, nil
}

func (d *accountingDevice) Free(p gpu.Ptr) error {
	if _, ok := d.allocs[p]; !ok {
		return fmt.Errorf("emu accounting: free of %#x, not an allocation", uint64(p))
	}
	delete(d.allocs, p)
	return nil
}

func (*accountingDevice) Memset8(gpu.Ptr, uint8, int) error                    { return nil }
func (*accountingDevice) Memset16(gpu.Ptr, uint16, int) error                  { return nil }
func (*accountingDevice) Memset32(gpu.Ptr, uint32, int) error                  { return nil }
func (*accountingDevice) CopyHtoD(gpu.Ptr, unsafe.Pointer, int) error          { return nil }
func (*accountingDevice) CopyDtoD(_, _ gpu.Ptr, _ int) error                   { return nil }
func (*accountingDevice) Launch(string, gpu.Dim3, gpu.Dim3, int, ...any) error { return nil }
func (*accountingDevice) Gemm(gpu.Gemm) error                                  { return nil }

func (*accountingDevice) CopyDtoH(dst unsafe.Pointer, _ gpu.Ptr, bytes int) error {
	clear(unsafe.Slice((*byte)(dst), bytes))
	return nil
}

func (*accountingDevice) ReadAsync(spans []gpu.Span) (func() ([]byte, error), error) {
	n := 0
	for _, sp := range spans {
		n += sp.Bytes
	}
	if n > gpu.ReadAsyncMax {
		return nil, fmt.Errorf("ReadAsync of %d bytes, at most %d", n, gpu.ReadAsyncMax)
	}
	return func() ([]byte, error) { return make([]byte, n), nil }, nil
}

// NewEmulatedAccounting returns a backend on the emulator's kernels image
// whose ops allocate as they do on the emulator but compute nothing (every
// value read back is 0): with WithMemLedger, the memory ledger of a
// training step at shapes too large to emulate (gpt2-124m's, llama-1b's),
// in seconds. Only the allocations mean anything.
func NewEmulatedAccounting(opts ...Option) (*Backend, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	return newBackend(&accountingDevice{Device: emu.New(8), next: 1 << 40, allocs: map[gpu.Ptr]int{}}, 0, cfg)
}
