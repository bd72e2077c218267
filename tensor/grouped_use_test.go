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

// byCount prefers its grouped GEMM from 16 groups, and declines it in
// general (PreferGrouped false): for a layer, the count decides.
type byCount struct{ *cpu.Backend }

func (byCount) PreferGrouped() bool              { return false }
func (byCount) PreferGroupedFor(groups int) bool { return groups >= 16 }

// UseGroupedFor asks a backend with a count preference for the layer's
// groups, and falls back to UseGrouped for one without it.
func TestUseGroupedFor(t *testing.T) {
	b := cpu.New()
	if tensor.UseGroupedFor(b, 4) == nil {
		t.Error("the CPU backend (no preference): want its grouped GEMM for 4 groups")
	}
	if tensor.UseGroupedFor(declines{b}, 64) != nil {
		t.Error("a backend that declines in general and has no count preference: want nil for 64 groups")
	}
	if tensor.UseGroupedFor(byCount{b}, 4) != nil {
		t.Error("count preference from 16, 4 groups: want nil")
	}
	if tensor.UseGroupedFor(byCount{b}, 32) == nil {
		t.Error("count preference from 16, 32 groups: want the grouped GEMM (it overrides PreferGrouped)")
	}
	if tensor.UseGroupedFor(struct{ tensor.Backend }{b}, 32) != nil {
		t.Error("a backend without GroupedGEMM: want nil")
	}
}
