package testutil

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// TopKDiff compares two routings of the same tokens, idx and ref (N·K
// expert ids, row-major (N, K), as Router.Indices gives them), and returns
// the tokens whose sets of K experts differ (the order of a token's choices
// is ignored). It measures how often two models (a bf16 GPU model and its
// f32 CPU reference, two layouts of one model) route a token differently.
func TopKDiff(idx, ref []int32, k int) ([]int, error) {
	if k < 1 || len(idx) != len(ref) || len(idx)%k != 0 {
		return nil, fmt.Errorf("testutil: TopKDiff of %d and %d expert ids with K = %d: expected the same number of ids, a multiple of K ≥ 1", len(idx), len(ref), k)
	}
	var diff []int
	a, b := make([]int32, k), make([]int32, k)
	for n := 0; n < len(idx)/k; n++ {
		copy(a, idx[n*k:(n+1)*k])
		copy(b, ref[n*k:(n+1)*k])
		slices.Sort(a)
		slices.Sort(b)
		if !slices.Equal(a, b) {
			diff = append(diff, n)
		}
	}
	return diff, nil
}

// TopKGaps returns, for each row of probs (N, E) row-major, the gap between
// its K-th and (K+1)-th largest values (+Inf when K = E): how far the row is
// from a change of its top-k set. A token that two models route differently
// with a large gap in the reference points to a bug, not to rounding.
func TopKGaps(probs []float64, e, k int) ([]float64, error) {
	if e < 1 || k < 1 || k > e || len(probs)%e != 0 {
		return nil, fmt.Errorf("testutil: TopKGaps of %d values, E = %d, K = %d: expected rows of E values and 1 ≤ K ≤ E", len(probs), e, k)
	}
	gaps := make([]float64, len(probs)/e)
	row := make([]float64, e)
	for n := range gaps {
		if k == e {
			gaps[n] = math.Inf(1)
			continue
		}
		copy(row, probs[n*e:(n+1)*e])
		sort.Sort(sort.Reverse(sort.Float64Slice(row)))
		gaps[n] = row[k-1] - row[k]
	}
	return gaps, nil
}
