//go:build asynctp_emu

package cudabackend

import "github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"

// NewEmulated returns a backend on the CPU kernel emulator, for the tests
// of packages above this one (built with -tags asynctp_emu). Several may
// live in one process (emulated ranks: their device addresses are host
// addresses, so one rank's kernels can store into another's buffers).
func NewEmulated(opts ...Option) (*Backend, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	return newBackend(emu.New(8), 0, cfg)
}
