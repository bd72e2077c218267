package layers

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestWorkspaceBitIdentical: the layers sharing their temporaries through
// the ParamSet's workspace give bit for bit the losses and gradients of
// layers with buffers of their own (noWorkspace), over steps with a
// change of batch size, dense and MoE, with the projections stacked and
// apart.
func TestWorkspaceBitIdentical(t *testing.T) {
	dense := GPTConfig{Layers: 3, Dim: 16, Heads: 2, Vocab: 23, Seq: 9, Seed: 3}
	moe := dense
	moe.Experts, moe.TopK, moe.AuxLossCoef, moe.ZLossCoef = 4, 2, 0.01, 0.001
	run := func(cfg GPTConfig, shared, stack bool) (out []uint32) {
		noWorkspace, unstacked = !shared, !stack
		defer func() { noWorkspace, unstacked = false, false }()
		b := newBackend()
		m, err := NewGPT(b, cfg, tensor.Float32)
		noErr(t, b, err)
		if shared != (m.ps.ws != nil) {
			t.Fatalf("shared %v, workspace %v", shared, m.ps.ws)
		}
		rng := testutil.Rng(5)
		for _, batch := range []int{3, 3, 1, 2} {
			ids := testutil.RandInts(rng, cfg.Vocab, batch, cfg.Seq)
			tg := testutil.RandInts(rng, cfg.Vocab, batch, cfg.Seq)
			m.ZeroGrad()
			loss, err := m.Forward(ids, tg)
			noErr(t, b, err)
			noErr(t, b, m.Backward())
			out = append(out, math.Float32bits(float32(loss)))
			_, g := m.Params().Flat()
			for _, v := range download(t, b, g) {
				out = append(out, math.Float32bits(float32(v)))
			}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		cfg  GPTConfig
	}{{"dense", dense}, {"moe", moe}} {
		for _, stack := range []bool{true, false} {
			own, shared := run(tc.cfg, false, stack), run(tc.cfg, true, stack)
			for i := range own {
				if own[i] != shared[i] {
					t.Fatalf("%s (stacked %v): value %d differs with the workspace: %#x, own buffers %#x", tc.name, stack, i, shared[i], own[i])
				}
			}
		}
	}
}
