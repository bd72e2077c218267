package tensor_test

import (
	"testing"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

type declines struct{ *cpu.Backend }

func (declines) PreferGrouped() bool { return false }

// UseGrouped takes a backend's grouped GEMM unless the backend declines it.
func TestUseGrouped(t *testing.T) {
	b := cpu.New()
	if tensor.UseGrouped(b) == nil {
		t.Error("the CPU backend has GroupedGEMM and no preference: want it used")
	}
	if g := tensor.UseGrouped(declines{b}); g != nil {
		t.Error("a backend whose PreferGrouped is false: want the per-expert loop (nil)")
	}
	if g := tensor.UseGrouped(struct{ tensor.Backend }{b}); g != nil {
		t.Error("a backend without GroupedGEMM: want nil")
	}
}
