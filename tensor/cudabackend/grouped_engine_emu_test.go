//go:build asynctp_emu

package cudabackend

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"
)

// TestEmuGroupedEngine: the emulator has no TMA or wgmma, so the grouped
// engine is refused there with a clear error, GroupedMatMul stays on the
// (emulated) SIMT kernels, and PreferGrouped follows WithGroupedGEMM: false
// by default (no engine), true when asked for.
func TestEmuGroupedEngine(t *testing.T) {
	b := openEmu(t)
	if b.PreferGrouped() {
		t.Error("PreferGrouped() = true on the emulator by default; want false (no grouped engine there)")
	}
	if err := b.groupedEngineErr(); err == nil || !strings.Contains(err.Error(), "needs a GPU") {
		t.Errorf("groupedEngineErr on the emulator: %v; want a refusal saying it needs a GPU", err)
	}
	c, a, w := b.Zeros(tensor.BFloat16, 8, 8), b.Zeros(tensor.BFloat16, 8, 8), b.Zeros(tensor.BFloat16, 1, 8, 8)
	offs := b.Zeros(tensor.Int32, 2)
	if err := b.EngineGroupedMatMul(c, a, w, offs, true, 1, 0); err == nil || !strings.Contains(err.Error(), "EngineGroupedMatMul: the GEMM engine needs a GPU") {
		t.Fatalf("EngineGroupedMatMul on the emulator: %v", err)
	}
	for _, tc := range []struct {
		on   bool
		want bool
	}{{true, true}, {false, false}} {
		var cfg config
		WithGroupedGEMM(tc.on)(&cfg)
		bb, err := newBackend(emu.New(8), 0, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := bb.PreferGrouped(); got != tc.want {
			t.Errorf("WithGroupedGEMM(%v): PreferGrouped() = %v, want %v", tc.on, got, tc.want)
		}
		bb.Close()
	}
}
