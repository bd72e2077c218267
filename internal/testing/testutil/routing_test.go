package testutil

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestTopKDiffAndGaps(t *testing.T) {
	// Tokens 0 and 2 agree (order ignored); 1 and 3 differ.
	diff, err := TopKDiff([]int32{0, 3, 1, 2, 4, 5, 0, 1}, []int32{3, 0, 1, 4, 4, 5, 1, 2}, 2)
	if err != nil || !slices.Equal(diff, []int{1, 3}) {
		t.Fatalf("TopKDiff = %v, %v; want [1 3]", diff, err)
	}
	if _, err := TopKDiff([]int32{0, 1, 2}, []int32{0, 1, 2}, 2); err == nil || !strings.Contains(err.Error(), "multiple of K") {
		t.Errorf("TopKDiff of 3 ids with K = 2: error %v", err)
	}
	gaps, err := TopKGaps([]float64{0.1, 0.5, 0.4, 0.3, 0.3, 0.4}, 3, 2)
	if err != nil || math.Abs(gaps[0]-0.3) > 1e-15 || gaps[1] != 0 {
		t.Fatalf("TopKGaps = %v, %v; want [0.3 0]", gaps, err)
	}
	if gaps, _ := TopKGaps([]float64{0.5, 0.5}, 2, 2); !math.IsInf(gaps[0], 1) {
		t.Errorf("TopKGaps with K = E = %v, want +Inf", gaps)
	}
}
