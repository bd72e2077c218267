//go:build asynctp_emu

package peerep

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// bitsRun runs steps of the EP MoE layer on P emulated ranks with the
// grouped GEMM on: the collective dispatcher (host counts) when st is nil,
// else the strategy's expert path (the device step for peerep's). The
// aux-gradient scale is P, as cmd/train sets it (gradients averaged over
// the token group).
func bitsRun(t *testing.T, P int, cfg layers.MoEConfig, dt tensor.DType, tokens []int, maxTok, steps int,
	st func(bar *emuworld.Barrier) overlap.Strategy) []moeResult {
	t.Helper()
	return moeRun(t, P, cfg, dt, tokens, maxTok, steps, moeRunOpts{st: st, params: 23, rng: [2]uint64{5, 77},
		aux: float64(P)})
}

// TestEmuDeviceStepBitsMatchCollective: the pipelined path's device step
// and the fused path (stream hooks) give the collective dispatcher's bits
// — the layer's output, its input gradient, the router's and every
// expert's weight gradient, the aux loss and the statistics — with the
// grouped GEMM on both sides (cmd/train --grouped-gemm on: the collective
// step runs the grouped GEMMs on host counts), at EP 2 and 4, bf16 and
// f32, dropless and with capacity drops, token counts whose total is not a
// power of two (the aux and z-loss gradients' 1/T), the aux gradient
// scaled by P as in training, over two steps (gradients accumulate).
func TestEmuDeviceStepBitsMatchCollective(t *testing.T) {
	for _, tc := range []struct {
		P      int
		cf     float64
		tokens []int
	}{
		{2, 0, []int{7, 5}},
		{2, 1, []int{9, 4}},
		{4, 0, []int{5, 3, 8, 6}},
		{4, 1.25, []int{4, 9, 2, 7}},
		{4, 0, []int{37, 29, 40, 33}}, // enough tokens for bf16's rounding to show an fp32 difference
	} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("P%d/cf%v/%v", tc.P, tc.cf, dt), func(t *testing.T) {
				cfg := layers.MoEConfig{Dim: 16, Hidden: 24, Experts: 8, TopK: 2, CapacityFactor: tc.cf,
					AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}
				maxTok, steps := slices.Max(tc.tokens), 2
				col := bitsRun(t, tc.P, cfg, dt, tc.tokens, maxTok, steps, nil)
				for _, s := range deviceStrategies {
					got := bitsRun(t, tc.P, cfg, dt, tc.tokens, maxTok, steps, s.st)
					nonzero := false
					for r := range tc.P {
						same := func(what string, g, w []float64) {
							if len(g) != len(w) {
								t.Fatalf("%s rank %d %s: %d values, collective %d", s.name, r, what, len(g), len(w))
							}
							diff, first := 0, -1
							for i := range g {
								if math.Float64bits(g[i]) != math.Float64bits(w[i]) {
									diff++
									if first < 0 {
										first = i
									}
								}
								if g[i] != 0 {
									nonzero = true
								}
							}
							if diff > 0 {
								t.Errorf("%s rank %d %s: %d of %d values differ from collective, first [%d] = %v, collective %v (expected identical bits)",
									s.name, r, what, diff, len(g), first, g[first], w[first])
							}
						}
						same("out", got[r].out, col[r].out)
						same("dx", got[r].dx, col[r].dx)
						names := []string{"router", "w_gate", "w_up", "w_down"}
						for i := range col[r].grads {
							same("grad "+names[i], got[r].grads[i], col[r].grads[i])
						}
						same("aux loss, balance, z-loss", []float64{got[r].aux, got[r].stats.LoadBalance, got[r].stats.ZLoss},
							[]float64{col[r].aux, col[r].stats.LoadBalance, col[r].stats.ZLoss})
						if fmt.Sprint(got[r].stats.TokensPerExpert, got[r].stats.Tokens, got[r].stats.Dropped) !=
							fmt.Sprint(col[r].stats.TokensPerExpert, col[r].stats.Tokens, col[r].stats.Dropped) {
							t.Errorf("%s rank %d stats %+v, collective %+v", s.name, r, got[r].stats, col[r].stats)
						}
					}
					if !nonzero {
						t.Fatal("every output and gradient is zero: the comparison proves nothing")
					}
				}
				t.Logf("routing %v, dropped %d", col[0].stats.TokensPerExpert, col[0].stats.Dropped)
			})
		}
	}
}
