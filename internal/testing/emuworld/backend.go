//go:build asynctp_emu

package emuworld

import (
	"testing"

	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Backend is an emulated backend of opts, closed with the test (a failed
// close is logged).
func Backend(t testing.TB, opts ...cudabackend.Option) *cudabackend.Backend {
	t.Helper()
	b, err := cudabackend.NewEmulated(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Logf("Close: %v", err)
		}
	})
	return b
}
