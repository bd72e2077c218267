package train

import (
	"bytes"
	"context"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// TestRunMicroBatches: a run whose steps are micro-batches (MicroBatch 1
// and 2 of a batch of 4) trains as the run of whole batches: the loss of
// every step and the weights after every step within 1e-6 (f32) and 1e-12
// (f64) relative, over 6 steps of AdamW with clipping.
func TestRunMicroBatches(t *testing.T) {
	for _, tc := range []struct {
		dt  tensor.DType
		tol float64
	}{{tensor.Float32, 1e-6}, {tensor.Float64, 1e-12}} {
		run := func(micro int) ([]float64, [][]float64) {
			cfg := smallConfig(t.TempDir(), 6)
			cfg.MicroBatch = micro
			b := newCPU()
			m, err := layers.NewGPT(b, layers.GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 256, Seq: 16, Seed: 5}, tc.dt)
			if err != nil {
				t.Fatal(err)
			}
			var weights [][]float64
			res, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}),
				WithStepHook(func(StepMetrics) { weights = append(weights, paramValues(t, m.Params())) }))
			if err != nil {
				t.Fatal(err)
			}
			return res.Losses, weights
		}
		wantLoss, wantW := run(0)
		for _, micro := range []int{1, 2} {
			loss, w := run(micro)
			for s := range wantLoss {
				if e := testutil.RelErr([]float64{loss[s]}, []float64{wantLoss[s]}); !(e <= tc.tol) {
					t.Errorf("%v micro_batch %d step %d: loss %v, want %v (relative error %.3g)", tc.dt, micro, s+1, loss[s], wantLoss[s], e)
				}
				if e := testutil.RelErr(w[s], wantW[s]); !(e <= tc.tol) {
					t.Errorf("%v micro_batch %d step %d: weights' relative error %.3g", tc.dt, micro, s+1, e)
				}
			}
		}
	}
}

// TestMicroBatchRefused: a batch that is not micro_batch × steps × dp, a
// micro-batch outside [0, batch], and micro-batches for a model that
// cannot run them are refused, naming the three numbers.
func TestMicroBatchRefused(t *testing.T) {
	cfg := smallConfig(t.TempDir(), 4)
	cfg.MicroBatch = 3
	_, err := cfg.MicroBatches(1)
	testutil.ErrorContains(t, err, "batch 4 is not micro_batch 3 × accumulation steps × dp 1")
	cfg.MicroBatch = 2
	_, err = cfg.MicroBatches(4)
	testutil.ErrorContains(t, err, "batch 4 is not micro_batch 2 × accumulation steps × dp 4", "micro_batch × dp = 8")
	if k, err := cfg.MicroBatches(2); k != 1 || err != nil {
		t.Errorf("MicroBatches(2) of batch 4, micro 2: %d, %v", k, err)
	}
	cfg.MicroBatch = 5
	testutil.ErrorContains(t, cfg.Validate(), "micro_batch = 5")
	cfg.MicroBatch = 2
	b := newCPU()
	_, err = Run(context.Background(), b, newBigram(t, b, 256, tensor.Float32, 1), loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
	testutil.ErrorContains(t, err, "micro_batch 2", "cannot run a step as micro-batches")
}
