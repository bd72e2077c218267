package cudabackend

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// runGPT runs a tiny GPT (dense, and with MoE blocks) forward and backward
// on the backend and on the CPU in float64 from the same parameters, and
// compares the losses and the flat gradients: the ops in the combinations
// and dtypes the layers use them (fp32 side tensors next to bf16
// activations, views, in-place ops).
func runGPT(t *testing.T, open opener, opts ...Option) {
	dense := layers.GPTConfig{Layers: 2, Dim: 128, Heads: 2, Vocab: 61, Seq: 70, Seed: 3} // head dim 64: the tensor-core attention in bf16
	moe := dense
	moe.Experts, moe.TopK, moe.MoEEvery, moe.AuxLossCoef, moe.ZLossCoef = 4, 2, 1, 0.01, 0.001
	for _, tc := range []struct {
		name string
		cfg  layers.GPTConfig
	}{{"dense", dense}, {"moe", moe}} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("%s/%v", tc.name, dt), func(t *testing.T) {
				lossTol, gradTol := 1e-5, 1e-4
				if dt == tensor.BFloat16 {
					lossTol, gradTol = 1e-2, 5e-2
				}
				rng := testutil.Rng(11)
				ids := testutil.RandInts(rng, tc.cfg.Vocab, 2, 67)
				tg := testutil.RandInts(rng, tc.cfg.Vocab, 2, 67)
				tg.I32()[5] = -1

				ref := cpu.New()
				rm, err := layers.NewGPT(ref, tc.cfg, tensor.Float64)
				if err != nil {
					t.Fatal(err)
				}
				b := open(t, opts...)
				m, err := layers.NewGPT(b, tc.cfg, dt)
				if err != nil {
					t.Fatal(err)
				}
				// The same parameters on both sides: the backend's, rounded to dt.
				w, _ := m.Params().Flat()
				rw, _ := rm.Params().Flat()
				copy(rw.F64(), values(t, b, w))

				loss, err := m.Forward(ids, tg)
				if err != nil {
					t.Fatal(err)
				}
				if err := m.Backward(); err != nil {
					t.Fatal(err)
				}
				rloss, err := rm.Forward(ids, tg)
				if err != nil {
					t.Fatal(err)
				}
				if err := rm.Backward(); err != nil {
					t.Fatal(err)
				}
				if math.Abs(loss-rloss) > lossTol*math.Abs(rloss) {
					t.Errorf("loss %v, reference %v", loss, rloss)
				}
				_, g := m.Params().Flat()
				_, rg := rm.Params().Flat()
				closeTo(t, "gradients", values(t, b, g), rg.F64(), gradTol)
				for _, p := range m.Params().Params() {
					rp := rm.Params().Lookup(p.Name)
					if e := testutil.RelErr(values(t, b, p.G), rp.G.F64()); !(e <= 3*gradTol) {
						t.Errorf("gradient of %s: relative error %.3g", p.Name, e)
					}
				}
			})
		}
	}
}
