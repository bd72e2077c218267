package layers

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// Finite-difference checks in float64 of every layer's input and parameter
// gradients. Each layer's output is reduced to L = Σ out·w with a random w,
// so ∂L/∂out = w is the gradient handed to Backward.

const (
	fdStep = 1e-5
	fdTol  = 1e-5 // relative, by norm
)

// gradCase is one layer under test: forward writes out from the current
// input and parameters; backward(dout) writes dx (if x is not nil) and adds
// into the parameter gradients.
type gradCase struct {
	b        tensor.Backend
	ps       *ParamSet
	x, dx    *tensor.Tensor // the input and its gradient buffer; nil for none
	out      *tensor.Tensor
	forward  func() error
	backward func(dout *tensor.Tensor) error
	window   int // check at most this many elements per parameter (0: all)
}

// maxErrs keeps the largest relative error seen per test, for the report.
func logErr(t *testing.T, name string, got, want []float64) {
	t.Helper()
	e := testutil.RelErr(got, want)
	t.Logf("%-28s rel err %.2e", name, e)
	if !(e <= fdTol) {
		t.Errorf("%s: relative error %.3g > %.3g (got %v want %v)", name, e, fdTol, got[:min(4, len(got))], want[:min(4, len(want))])
	}
}

func runGradCase(t *testing.T, c gradCase) {
	t.Helper()
	b := c.b
	rng := testutil.Rng(99)
	w := testutil.RandFloats(rng, c.out.Numel(), 0.1, 1)
	loss := func() float64 {
		noErr(t, b, c.forward())
		return testutil.Dot(c.out.F64(), w)
	}

	// Analytic gradients: parameter gradients start from a known value g0
	// (they must accumulate), dx from garbage (it must be overwritten).
	_, g := c.ps.Flat()
	g0 := testutil.RandFloats(rng, g.Numel(), 0.1, 1)
	upload(t, b, g, g0)
	if c.dx != nil {
		b.Fill(c.dx, 1e3)
	}
	loss()
	dout := b.Zeros(tensor.Float64, c.out.Shape()...)
	upload(t, b, dout, w)
	noErr(t, b, c.backward(dout))
	gotG := download(t, b, g)
	for i := range gotG {
		gotG[i] -= g0[i]
	}

	if c.x != nil {
		want := testutil.NumGrad(loss, c.x.F64(), fdStep)
		logErr(t, "dx", download(t, b, c.dx), want)
	}
	checkParamGrads(t, c.ps, gotG, loss, rng, c.window)
}

// checkParamGrads compares the flat gradient got of the parameters ps
// with central differences of loss, on every parameter's elements or, with
// window > 0, on a random window of at most window of them.
func checkParamGrads(t *testing.T, ps *ParamSet, got []float64, loss func() float64, rng *rand.Rand, window int) {
	t.Helper()
	for _, p := range ps.Params() {
		n := p.Numel()
		lo, hi := 0, n
		if window > 0 && n > window {
			lo = rng.IntN(n - window)
			hi = lo + window
		}
		want := testutil.NumGrad(loss, p.W.F64()[lo:hi], fdStep)
		logErr(t, fmt.Sprintf("d%s[%d:%d]", p.Name, lo, hi), got[p.Offset()+lo:p.Offset()+hi], want)
	}
}

// checkLayerGrads runs the check of a layer that newLayer registers, on an
// input x of the given shape (drawn from rng, times scale) and an output
// of the same shape.
func checkLayerGrads(t *testing.T, rng *rand.Rand, scale float64, shape []int, window int,
	newLayer func(b tensor.Backend, ps *ParamSet) (rowLayer, error)) {
	t.Helper()
	b, ps := newBackend(), NewParamSet(1)
	l, err := newLayer(b, ps)
	noErr(t, b, err)
	materialize(t, b, ps)
	x := randDevice(t, b, rng, tensor.Float64, scale, shape...)
	dx, out := b.Zeros(tensor.Float64, shape...), b.Zeros(tensor.Float64, shape...)
	runGradCase(t, gradCase{b: b, ps: ps, x: x, dx: dx, out: out,
		forward:  func() error { return l.Forward(out, x) },
		backward: func(d *tensor.Tensor) error { return l.Backward(dx, d) },
		window:   window,
	})
}

// rowLayer is a layer whose output has its input's shape.
type rowLayer interface {
	Forward(out, x *tensor.Tensor) error
	Backward(dx, dout *tensor.Tensor) error
}

// materialize randomizes ps's weights after materializing it in float64.
func materialize(t *testing.T, b tensor.Backend, ps *ParamSet) {
	t.Helper()
	noErr(t, b, ps.Materialize(b, tensor.Float64))
	randomizeParams(t, ps, testutil.Rng(7), 0.5)
}

func TestGradLinear(t *testing.T) {
	for _, bias := range []bool{false, true} {
		t.Run(fmt.Sprintf("bias=%v", bias), func(t *testing.T) {
			b, ps := newBackend(), NewParamSet(1)
			l, err := NewLinear(b, ps, "fc", LinearConfig{In: 5, Out: 3, Bias: bias, Std: 0.1})
			noErr(t, b, err)
			materialize(t, b, ps)
			rng := testutil.Rng(2)
			x := randDevice(t, b, rng, tensor.Float64, 1, 2, 4, 5)
			dx, out := b.Zeros(tensor.Float64, 2, 4, 5), b.Zeros(tensor.Float64, 2, 4, 3)
			runGradCase(t, gradCase{b: b, ps: ps, x: x, dx: dx, out: out,
				forward:  func() error { return l.Forward(out, x) },
				backward: func(d *tensor.Tensor) error { return l.Backward(dx, d) },
			})
		})
	}
}

func TestLinearBackwardAccumulate(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	l, err := NewLinear(b, ps, "fc", LinearConfig{In: 4, Out: 3, Std: 0.5})
	noErr(t, b, err)
	noErr(t, b, ps.Materialize(b, tensor.Float64))
	rng := testutil.Rng(3)
	x := randDevice(t, b, rng, tensor.Float64, 1, 6, 4)
	dy := randDevice(t, b, rng, tensor.Float64, 1, 6, 3)
	y, dx := b.Zeros(tensor.Float64, 6, 3), b.Zeros(tensor.Float64, 6, 4)
	noErr(t, b, l.Forward(y, x))
	noErr(t, b, l.Backward(dx, dy))
	once := download(t, b, dx)
	noErr(t, b, l.BackwardAccumulate(dx, dy))
	twice := download(t, b, dx)
	for i := range once {
		once[i] *= 2
	}
	testutil.AllClose(t, "dx accumulated twice", twice, once, 1e-14)
}

func TestGradEmbedding(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	e, err := NewEmbedding(b, ps, "emb", 7, 4, 0.1)
	noErr(t, b, err)
	materialize(t, b, ps)
	ids := b.Zeros(tensor.Int32, 2, 5)
	b.Upload(ids, hostInts(t, []int32{0, 3, 3, 6, 1, 2, 3, 0, 0, 5}, 2, 5))
	out := b.Zeros(tensor.Float64, 2, 5, 4)
	runGradCase(t, gradCase{b: b, ps: ps, out: out,
		forward:  func() error { return e.Forward(out, ids) },
		backward: func(d *tensor.Tensor) error { return e.Backward(d) },
	})
}

func TestGradRMSNorm(t *testing.T) {
	checkLayerGrads(t, testutil.Rng(4), 2, []int{3, 2, 6}, 0, func(b tensor.Backend, ps *ParamSet) (rowLayer, error) {
		return NewRMSNorm(b, ps, "norm", 6, 1e-5)
	})
}

func TestGradMLP(t *testing.T) {
	checkLayerGrads(t, testutil.Rng(5), 1, []int{2, 3, 6}, 0, func(b tensor.Backend, ps *ParamSet) (rowLayer, error) {
		return NewMLP(b, ps, "mlp", MLPConfig{Dim: 6, Hidden: 10, Std: 0.1, OutStd: 0.1})
	})
}

// TestGradAttention: multi-head, and grouped-query with 2 and 1 key/value
// heads for 4 query heads.
func TestGradAttention(t *testing.T) {
	for _, c := range []struct{ heads, kv int }{{2, 0}, {4, 2}, {4, 1}} {
		t.Run(fmt.Sprintf("heads=%d/kv=%d", c.heads, c.kv), func(t *testing.T) {
			checkLayerGrads(t, testutil.Rng(6), 1, []int{2, 5, 8}, 0, func(b tensor.Backend, ps *ParamSet) (rowLayer, error) {
				return NewAttention(b, ps, "attn", AttentionConfig{Dim: 8, Heads: c.heads, KVHeads: c.kv, RopeTheta: 100, Std: 0.1, OutStd: 0.1})
			})
		})
	}
}

func TestGradBlock(t *testing.T) {
	checkLayerGrads(t, testutil.Rng(7), 1, []int{2, 4, 8}, 24, func(b tensor.Backend, ps *ParamSet) (rowLayer, error) {
		return NewBlock(b, ps, "block", BlockConfig{Dim: 8, Heads: 2, FFN: 12, RopeTheta: 100, NormEps: 1e-5, Std: 0.1, OutStd: 0.1})
	})
}

// lossOf is the loss of m on ids and targets tg, as a function of m's
// parameters for finite differences.
func lossOf(t *testing.T, b tensor.Backend, m *GPT, ids, tg *tensor.Tensor) func() float64 {
	return func() float64 {
		l, err := m.Forward(ids, tg)
		noErr(t, b, err)
		return l
	}
}

// TestGradGPT checks the gradient of the whole model's mean loss against
// finite differences on a window of every parameter, with tied and untied
// heads and some ignored targets.
func TestGradGPT(t *testing.T) {
	for _, c := range []struct {
		tied      bool
		heads, kv int
	}{{false, 2, 0}, {true, 2, 0}, {false, 4, 2}} {
		tied := c.tied
		t.Run(fmt.Sprintf("tied=%v/heads=%d/kv=%d", tied, c.heads, c.kv), func(t *testing.T) {
			b := newBackend()
			cfg := GPTConfig{Layers: 2, Dim: 8, Heads: c.heads, KVHeads: c.kv, Vocab: 11, Seq: 6, FFN: 12, TiedEmbeddings: tied, InitStd: 0.3, Seed: 5}
			m, err := NewGPT(b, cfg, tensor.Float64)
			noErr(t, b, err)
			rng := testutil.Rng(8)
			ids := testutil.RandInts(rng, cfg.Vocab, 2, 5)
			tg := testutil.RandInts(rng, cfg.Vocab, 2, 5)
			tg.I32()[3], tg.I32()[7] = -1, -100
			loss := lossOf(t, b, m, ids, tg)
			m.ZeroGrad()
			loss()
			noErr(t, b, m.Backward())
			_, g := m.Params().Flat()
			got := download(t, b, g)
			if tied != (m.Params().Lookup("lm_head.weight") == nil) {
				t.Fatalf("tied = %v but lm_head.weight registered = %v", tied, m.Params().Lookup("lm_head.weight") != nil)
			}
			checkParamGrads(t, m.Params(), got, loss, rng, 16)
			// The whole embedding gradient, where the tied head adds to it.
			e := m.Params().Lookup("embed.weight")
			want := testutil.NumGrad(loss, e.W.F64(), fdStep)
			logErr(t, "dembed.weight (all)", got[e.Offset():e.Offset()+e.Numel()], want)
			if l := loss(); math.Abs(l-math.Log(float64(cfg.Vocab))) > 2 {
				t.Errorf("loss %v far from log(Vocab)", l)
			}
		})
	}
}
