package layers

import (
	"github.com/asynctp/asynctp/internal/layerkit"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestSeqFormsMatch: the rows forms (ForwardSeq, the Mixer and the shared
// block's form) compute exactly what the (B, T, Dim) forms do, gradients
// included, and check their shapes as rows.
func TestSeqFormsMatch(t *testing.T) {
	const B, T, C = 2, 3, 8
	for _, tc := range []struct {
		name string
		make func(b tensor.Backend, ps *ParamSet) (seqForms, error)
	}{
		{"attention", func(b tensor.Backend, ps *ParamSet) (seqForms, error) {
			return NewAttention(b, ps, "attn", AttentionConfig{Dim: C, Heads: 2, RopeTheta: 100, Std: 0.3, OutStd: 0.3})
		}},
		{"block", func(b tensor.Backend, ps *ParamSet) (seqForms, error) {
			return NewBlock(b, ps, "blk", BlockConfig{Dim: C, Heads: 2, FFN: 12, RopeTheta: 100, NormEps: 1e-5, Std: 0.3, OutStd: 0.3})
		}},
		{"moe block", func(b tensor.Backend, ps *ParamSet) (seqForms, error) {
			return NewBlock(b, ps, "blk", BlockConfig{Dim: C, Heads: 2, FFN: 12, RopeTheta: 100, NormEps: 1e-5, Std: 0.3, OutStd: 0.3,
				MoE: &MoEConfig{Experts: 4, TopK: 2, AuxLossCoef: 0.01}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(rows bool) (y, dx, g []float64) {
				b, ps := newBackend(), NewParamSet(3)
				l, err := tc.make(b, ps)
				noErr(t, b, err)
				noErr(t, b, ps.Materialize(b, tensor.Float64))
				rng := testutil.Rng(9)
				randomizeParams(t, ps, rng, 0.5)
				x, dout := randDevice(t, b, rng, tensor.Float64, 1, B, T, C), randDevice(t, b, rng, tensor.Float64, 1, B, T, C)
				out, d := b.Zeros(tensor.Float64, B, T, C), b.Zeros(tensor.Float64, B, T, C)
				if rows {
					r := func(t *tensor.Tensor) *tensor.Tensor { return layerkit.Reshape(t, B*T, C) }
					noErr(t, b, l.ForwardSeq(r(out), r(x), B, T))
					wantErr(t, "rows backward of the wrong size", l.Backward(b.Zeros(tensor.Float64, B*T-1, C), r(dout)), "expected 6 rows of 8")
					noErr(t, b, l.Backward(r(d), r(dout)))
				} else {
					noErr(t, b, l.Forward(out, x))
					noErr(t, b, l.Backward(d, dout))
				}
				_, gr := ps.Flat()
				return download(t, b, out), download(t, b, d), download(t, b, gr)
			}
			y0, dx0, g0 := run(false)
			y1, dx1, g1 := run(true)
			testutil.AllClose(t, "output", y1, y0, 0)
			testutil.AllClose(t, "dx", dx1, dx0, 0)
			testutil.AllClose(t, "parameter gradients", g1, g0, 0)
		})
	}
}

type seqForms interface {
	Forward(out, x *tensor.Tensor) error
	ForwardSeq(out, x *tensor.Tensor, batch, seq int) error
	Backward(dx, dout *tensor.Tensor) error
}
