package model_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// TestRecomputeBitsSharded: at TP (with and without sequence parallelism,
// collective and pipelined sites), DP and EP layouts (an MoE model with
// capacity drops among them), with micro-batches and the gradient sums
// behind the backward, the attention and block recompute give the loss
// and the main gradients of recompute none bit for bit: a recomputed
// block's forward runs its collectives again, in the same order on every
// rank.
func TestRecomputeBitsSharded(t *testing.T) {
	const B, T = 8, 8
	dense := smallConfig()
	capped := moeConfig()
	capped.CapacityFactor = 1
	for _, c := range []struct {
		cfg layers.GPTConfig
		l   layout
		k   int
	}{
		{dense, layout{tp: 2, dp: 1, sp: true, overlap: "pipelined"}, 1},
		{dense, layout{tp: 2, dp: 2}, 2},
		{capped, layout{tp: 2, dp: 2, ep: 2, sp: true}, 2},
		{capped, layout{tp: 1, dp: 2, ep: 2}, 1},
	} {
		name := fmt.Sprintf("%s/k=%d", c.l, c.k)
		if c.cfg.Experts > 0 {
			name = "moe/" + name
		}
		t.Run(name, func(t *testing.T) {
			ids, targets := batch(7, B, T, c.cfg.Vocab)
			err := onGrid(c.l, func(b tensor.Backend, g *comm.Grid) error {
				var loss [3]float64
				var grads [3][]float64
				for i, r := range []layers.Recompute{layers.RecomputeNone, layers.RecomputeAttention, layers.RecomputeBlock} {
					m, err := microModel(b, g, c.cfg, c.l, tensor.Float32, 4096, false)
					if err != nil {
						return err
					}
					if err := m.SetRecompute(r); err != nil {
						return err
					}
					if loss[i], grads[i], err = microStepOn(b, m, c.k, ids, targets); err != nil {
						return err
					}
				}
				for i := 1; i < 3; i++ {
					if math.Float64bits(loss[i]) != math.Float64bits(loss[0]) {
						return fmt.Errorf("recompute %v: loss %v, want %v (none) bit for bit", layers.Recompute(i), loss[i], loss[0])
					}
					for j := range grads[0] {
						if math.Float64bits(grads[i][j]) != math.Float64bits(grads[0][j]) {
							return fmt.Errorf("recompute %v: gradient %d = %v, want %v (none) bit for bit", layers.Recompute(i), j, grads[i][j], grads[0][j])
						}
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
