package model_test

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/train"
)

// trainWeights trains at l through train.RunSharded and returns rank 0's
// result, its gradient norms and every rank's weights after the run.
func trainWeights(t *testing.T, l layout, cfg layers.GPTConfig, tc train.Config) (train.Result, []float64, [][]float64) {
	t.Helper()
	res, norms, weights, err := runShardedWeights(l, cfg, corpus(4000, cfg.Vocab), tc)
	if err != nil {
		t.Fatal(err)
	}
	return res, norms, weights
}

// TestDistributedOptimizer: 8 AdamW steps (warm-up, decay, weight decay,
// clipping at a norm the gradients exceed) with the optimizer's state
// sharded over the replicas (Options.DistributedOptimizer) give, at every
// layout, the losses, gradient norms and every rank's weights of the same
// run with the replicated optimizer within 1e-6 relative per step: DP 2,
// TP 2 × DP 2 with sequence parallelism, DP 4, and an MoE model at DP 4 ×
// EP 2 (its experts sharded over their EDP group of 2) and TP 2 × DP 2 ×
// EP 2; in buckets of 100 bytes, so that most are padded and split over
// the ranks unevenly.
func TestDistributedOptimizer(t *testing.T) {
	for _, c := range []struct {
		l   layout
		cfg layers.GPTConfig
	}{
		{layout{tp: 1, dp: 2}, smallConfig()},
		{layout{tp: 2, dp: 2, sp: true}, smallConfig()},
		{layout{tp: 1, dp: 4}, smallConfig()},
		{layout{tp: 1, dp: 4, ep: 2}, moeConfig()},
		{layout{tp: 2, dp: 2, ep: 2}, moeConfig()},
	} {
		t.Run(c.l.String(), func(t *testing.T) {
			c.l.bucketBytes = 100
			want, wantNorms, wantW := trainWeights(t, c.l, c.cfg, trainConfig(8, t.TempDir()))
			d := c.l
			d.distOpt = true
			got, gotNorms, gotW := trainWeights(t, d, c.cfg, trainConfig(8, t.TempDir()))
			worst := 0.0
			for i := range want.Losses {
				for _, e := range []float64{relErr(got.Losses[i], want.Losses[i]), relErr(gotNorms[i], wantNorms[i])} {
					if !(e <= 1e-6) {
						t.Fatalf("step %d: loss %v, norm %v with the distributed optimizer; %v, %v with the replicated one", i+1, got.Losses[i], gotNorms[i], want.Losses[i], wantNorms[i])
					}
					worst = math.Max(worst, e)
				}
			}
			for r := range wantW {
				if e := testutil.RelErr(gotW[r], wantW[r]); !(e <= 1e-6) {
					t.Fatalf("rank %d's weights after 8 steps: relative error %.3g against the replicated optimizer's", r, e)
				}
			}
			t.Logf("worst relative error of the losses and norms %.3g", worst)
		})
	}
}
