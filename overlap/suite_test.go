package overlap_test

import (
	"testing"

	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/overlaptest"
	"github.com/asynctp/asynctp/overlap/strategies"
)

// Every strategy that runs on the CPU passes the conformance suite on
// group sizes 1–8 (5 and 7: ranks that are not a power of two).
func TestSuite(t *testing.T) {
	sizes := []int{1, 2, 3, 4, 5, 8}
	if testing.Short() {
		sizes = []int{1, 2, 4}
	}
	for _, s := range []overlap.Strategy{overlap.Collective{}, strategies.Pipelined{}, strategies.Pipelined{Options: strategies.Options{Chunks: 3}}} {
		overlaptest.RunLocal(t, s, sizes, false)
	}
}

// With an asynchronous transport a strategy that reads a result before
// waiting for it fails.
func TestSuiteAsync(t *testing.T) {
	for _, s := range []overlap.Strategy{overlap.Collective{}, strategies.Pipelined{}} {
		overlaptest.RunLocal(t, s, []int{2, 3}, true)
	}
}
