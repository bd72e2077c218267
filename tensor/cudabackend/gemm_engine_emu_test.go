//go:build asynctp_emu

package cudabackend

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"
)

// TestEmuGEMMEngine: the emulator has no TMA or wgmma, so the engine is
// refused there with a clear error, and MatMul stays on the (emulated)
// cuBLASLt path.
func TestEmuGEMMEngine(t *testing.T) {
	if _, err := newBackend(emu.New(8), 0, config{gemm: GEMMAsyncTP}); err == nil || !strings.Contains(err.Error(), "needs a GPU") {
		t.Fatalf("WithGEMMEngine(asynctp) on the emulator: %v; want a refusal saying it needs a GPU", err)
	}
	if _, err := newBackend(emu.New(8), 0, config{gemm: "cutlass"}); err == nil || !strings.Contains(err.Error(), `unknown engine, expected "cublaslt" or "asynctp"`) {
		t.Fatalf("WithGEMMEngine(cutlass): %v", err)
	}
	b := openEmu(t)
	c, a, w := b.Zeros(tensor.BFloat16, 8, 8), b.Zeros(tensor.BFloat16, 8, 8), b.Zeros(tensor.BFloat16, 8, 8)
	if err := b.EngineSupports(c, a, w, false, true); err == nil || !strings.Contains(err.Error(), "needs a GPU") {
		t.Fatalf("EngineSupports on the emulator: %v", err)
	}
	if err := b.EngineMatMul(c, a, w, false, true, 1, 0, GEMMOptions{}); err == nil || !strings.Contains(err.Error(), "needs a GPU") {
		t.Fatalf("EngineMatMul on the emulator: %v", err)
	}
}
