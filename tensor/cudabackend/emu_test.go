//go:build asynctp_emu

package cudabackend

import (
	"testing"

	"github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"
)

// openEmu opens a backend on the kernel emulator (CPU).
func openEmu(t *testing.T, opts ...Option) *Backend {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	b, err := newBackend(emu.New(8), 0, cfg)
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

func TestEmuConformance(t *testing.T) { runConformance(t, openEmu) }

func TestEmuConformanceSIMT(t *testing.T) {
	runConformance(t, openEmu, WithAttention(AttentionSIMT))
}

func TestEmuDeterminism(t *testing.T) { runDeterminism(t, openEmu) }

func TestEmuAttentionShapes(t *testing.T) { runAttentionShapes(t, openEmu) }

func TestEmuAttentionShapesSIMT(t *testing.T) {
	runAttentionShapes(t, openEmu, WithAttention(AttentionSIMT))
}

func TestEmuRoutingPlan(t *testing.T) { runRoutingPlan(t, openEmu) }
