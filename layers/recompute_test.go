package layers

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestRecomputeBits: under every recompute mode a step (of one or two
// micro-batches) gives the loss and every gradient of RecomputeNone bit
// for bit, for a dense model (the stacked projections and the three
// linears) and an MoE one; and the modes do share what they say: under
// block the blocks' kept activations are one buffer for all blocks,
// under attention only the attention cores' outputs are.
func TestRecomputeBits(t *testing.T) {
	dense := GPTConfig{Layers: 3, Dim: 16, Heads: 2, Vocab: 23, Seq: 8, Seed: 9, TiedEmbeddings: true}
	moe := dense
	moe.Experts, moe.TopK, moe.MoEEvery, moe.CapacityFactor, moe.AuxLossCoef, moe.ZLossCoef = 4, 2, 2, 1, 0.1, 0.01
	ids := testutil.RandInts(testutil.Rng(5), dense.Vocab, 4, 8)
	targets := testutil.RandInts(testutil.Rng(6), dense.Vocab, 4, 8)
	targets.I32()[3] = -1
	for _, tc := range []struct {
		name      string
		cfg       GPTConfig
		unstacked bool
	}{{"dense", dense, false}, {"dense-unstacked", dense, true}, {"moe", moe, false}} {
		for _, k := range []int{1, 2} {
			run := func(r Recompute) (stepResult, *GPT) {
				unstacked = tc.unstacked
				defer func() { unstacked = false }()
				b := newBackend()
				m, err := NewGPT(b, tc.cfg, tensor.Float32)
				noErr(t, b, err)
				noErr(t, b, m.SetRecompute(r))
				return microStep(t, m, k, ids, targets), m
			}
			want, none := run(RecomputeNone)
			for _, r := range []Recompute{RecomputeAttention, RecomputeBlock} {
				got, m := run(r)
				what := fmt.Sprintf("%s/k=%d/%v", tc.name, k, r)
				if math.Float64bits(got.loss) != math.Float64bits(want.loss) {
					t.Errorf("%s: loss %v, want %v (recompute none) bit for bit", what, got.loss, want.loss)
				}
				for name, w := range want.grads {
					for i := range w {
						if math.Float64bits(got.grads[name][i]) != math.Float64bits(w[i]) {
							t.Fatalf("%s: gradient of %s [%d] = %v, want %v (recompute none) bit for bit", what, name, i, got.grads[name][i], w[i])
						}
					}
				}
				checkShared(t, what, m, none, r)
			}
		}
	}
}

// checkShared checks which kept activations of blocks 0 and 1 of m share
// storage under r (none's, in ref, never do).
func checkShared(t *testing.T, what string, m, ref *GPT, r Recompute) {
	t.Helper()
	same := func(a, b *tensor.Tensor) bool { return a != nil && b != nil && a.Buffer() == b.Buffer() }
	b0, b1 := m.Blocks[0], m.Blocks[1]
	c0, c1 := b0.Attn.core, b1.Attn.core
	if same(ref.Blocks[0].h1, ref.Blocks[1].h1) || same(ref.Blocks[0].Attn.core.att, ref.Blocks[1].Attn.core.att) {
		t.Errorf("%s: recompute none shares the blocks' kept activations", what)
	}
	if got, want := same(c0.att, c1.att) && same(c0.lse, c1.lse), r >= RecomputeAttention; got != want {
		t.Errorf("%s: the attention outputs of blocks 0 and 1 shared: %v, want %v", what, got, want)
	}
	block := r == RecomputeBlock
	for _, p := range []struct {
		name string
		a, b *tensor.Tensor
	}{{"h1", b0.h1, b1.h1}, {"x1", b0.x1, b1.x1}, {"h2", b0.h2, b1.h2}, {"qr", c0.qr, c1.qr}, {"kr", c0.kr, c1.kr}, {"v", c0.v, c1.v}} {
		if same(p.a, p.b) != block {
			t.Errorf("%s: %s of blocks 0 and 1 shared: %v, want %v", what, p.name, same(p.a, p.b), block)
		}
	}
	if b0.MLP != nil && b1.MLP != nil && same(b0.MLP.act.h, b1.MLP.act.h) != block {
		t.Errorf("%s: the MLP activations of blocks 0 and 1 shared: %v, want %v", what, !block, block)
	}
}

func TestParseRecompute(t *testing.T) {
	for i, n := range []string{"none", "attention", "block"} {
		if r, err := ParseRecompute(n); err != nil || int(r) != i || r.String() != n {
			t.Errorf("ParseRecompute(%q) = %v, %v", n, r, err)
		}
	}
	if _, err := ParseRecompute("full"); err == nil {
		t.Error("ParseRecompute(full): no error")
	}
}
