package cudabackend

import (
	"testing"
)

// openGPU opens GPU 0, or skips the test with the reason (no driver, no GPU,
// no kernels image).
func openGPU(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	b, err := New(0, opts...)
	if err != nil {
		t.Skipf("no CUDA backend here: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Logf("Close: %v", err)
		}
	})
	return b
}

func TestConformance(t *testing.T) { runConformance(t, openGPU) }

// TestConformanceSIMT runs the suite with the CUDA-core attention kernels
// only (the tensor-core ones are the default where they apply).
func TestConformanceSIMT(t *testing.T) { runConformance(t, openGPU, WithAttention(AttentionSIMT)) }

func TestDeterminism(t *testing.T) { runDeterminism(t, openGPU) }

func TestAttentionShapes(t *testing.T) { runAttentionShapes(t, openGPU) }

func TestAttentionShapesSIMT(t *testing.T) {
	runAttentionShapes(t, openGPU, WithAttention(AttentionSIMT))
}

func TestRoutingPlan(t *testing.T) { runRoutingPlan(t, openGPU) }

func TestGPT(t *testing.T) { runGPT(t, openGPU) }
