package rowmajor_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/internal/rowmajor"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// TestSliceMatchesCut compares Slice with parallel/shard's Cut of the same
// part, for every dimension of a random tensor and the whole of it.
func TestSliceMatchesCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	full := []int{3, 4, 5}
	v := make([]float64, tensor.Shape(full).Numel())
	for i := range v {
		v[i] = rng.Float64() + 0.5
	}
	x, err := tensor.FromFloat64(v, full...)
	if err != nil {
		t.Fatal(err)
	}
	parts := []shard.Slice{{Full: full, Dim: -1}}
	for d, n := range full {
		parts = append(parts, shard.Slice{Full: full, Dim: d, Lo: 1, Hi: n - 1}, shard.Slice{Full: full, Dim: d, Lo: 0, Hi: 1})
	}
	for _, s := range parts {
		want, err := shard.Cut(x, s)
		if err != nil {
			t.Fatal(err)
		}
		if got := rowmajor.Slice(v, full, s.Dim, s.Lo, s.Hi); !slices.Equal(got, want.F64()) {
			t.Errorf("slice %+v: got %d values %v..., want %d", s, len(got), got[:min(3, len(got))], len(want.F64()))
		}
	}
}
