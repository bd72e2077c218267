package layers

import (
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

var tinyConfig = GPTConfig{Layers: 2, Dim: 32, Heads: 4, Vocab: 29, Seq: 16, Seed: 42}

func TestGPTConfigDefaults(t *testing.T) {
	c := GPTConfig{Layers: 1, Dim: 768, Heads: 12, Vocab: 10, Seq: 4}.WithDefaults()
	if c.FFN != 2048 || c.RopeTheta != 10000 || c.NormEps != 1e-5 || c.InitStd != 0.02 {
		t.Fatalf("defaults: %+v", c)
	}
	if got := (GPTConfig{Dim: 64}).WithDefaults().FFN; got != 192 { // ceil(170.7) → 192
		t.Errorf("FFN default for Dim 64: %d, want 192", got)
	}
	if got := (GPTConfig{Dim: 64, FFN: 100}).WithDefaults().FFN; got != 100 {
		t.Errorf("explicit FFN replaced: %d", got)
	}
}

func TestGPTConfigValidate(t *testing.T) {
	ok := tinyConfig
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod  func(*GPTConfig)
		want string
	}{
		{func(c *GPTConfig) { c.Layers = 0 }, "Layers = 0"},
		{func(c *GPTConfig) { c.Dim = -4 }, "Dim = -4"},
		{func(c *GPTConfig) { c.Heads = 0 }, "Heads = 0"},
		{func(c *GPTConfig) { c.Vocab = 0 }, "Vocab = 0"},
		{func(c *GPTConfig) { c.Seq = 0 }, "Seq = 0"},
		{func(c *GPTConfig) { c.Heads = 5 }, "Heads = 5 does not divide Dim = 32"},
		{func(c *GPTConfig) { c.Heads = 32 }, "head dim Dim/Heads = 32/32 = 1 is odd"},
		{func(c *GPTConfig) { c.KVHeads = 3 }, "KVHeads = 3 does not divide Heads = 4"},
		{func(c *GPTConfig) { c.KVHeads = -2 }, "KVHeads = -2 does not divide Heads = 4"},
		{func(c *GPTConfig) { c.FFN = -1 }, "FFN = -1"},
		{func(c *GPTConfig) { c.RopeTheta = math.NaN() }, "RopeTheta = NaN"},
		{func(c *GPTConfig) { c.NormEps = -1 }, "NormEps = -1"},
		{func(c *GPTConfig) { c.InitStd = math.Inf(1) }, "InitStd = +Inf"},
	} {
		cfg := ok
		c.mod(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", cfg, err, c.want)
		}
		if _, err2 := NewGPT(newBackend(), cfg, tensor.Float32); err2 == nil {
			t.Errorf("NewGPT accepted %+v", cfg)
		}
	}
}

// TestGPTDeterminism: the same seed gives the same parameters, loss and
// gradients bit for bit; another seed gives other parameters.
func TestGPTDeterminism(t *testing.T) {
	rng := testutil.Rng(3)
	ids := testutil.RandInts(rng, tinyConfig.Vocab, 2, 12)
	tg := testutil.RandInts(rng, tinyConfig.Vocab, 2, 12)
	run := func(seed uint64) (w, g []float64, loss float64) {
		b := newBackend()
		cfg := tinyConfig
		cfg.Seed = seed
		m, err := NewGPT(b, cfg, tensor.Float32)
		noErr(t, b, err)
		fw, fg := m.Params().Flat()
		w = download(t, b, fw)
		loss, err = m.Forward(ids, tg)
		noErr(t, b, err)
		noErr(t, b, m.Backward())
		// A second forward of the same model gives the same loss too.
		loss2, err := m.Forward(ids, tg)
		noErr(t, b, err)
		if math.Float64bits(loss2) != math.Float64bits(loss) {
			t.Errorf("the same model gives loss %v then %v", loss, loss2)
		}
		return w, download(t, b, fg), loss
	}
	w1, g1, l1 := run(42)
	w2, g2, l2 := run(42)
	w3, _, l3 := run(43)
	if math.Float64bits(l1) != math.Float64bits(l2) {
		t.Errorf("loss %v then %v with the same seed", l1, l2)
	}
	for i := range w1 {
		if math.Float64bits(w1[i]) != math.Float64bits(w2[i]) {
			t.Fatalf("parameter %d: %v then %v with the same seed", i, w1[i], w2[i])
		}
		if math.Float64bits(g1[i]) != math.Float64bits(g2[i]) {
			t.Fatalf("gradient %d: %v then %v with the same seed", i, g1[i], g2[i])
		}
	}
	if l1 == l3 || w1[0] == w3[0] {
		t.Errorf("seeds 42 and 43 agree: loss %v %v, w[0] %v %v", l1, l3, w1[0], w3[0])
	}
}

// overfit trains m for 50 steps of plain SGD (learning rate 1) on one
// random batch of 4 sequences of 16 tokens, and returns the loss of the
// first step and the loss after the last.
func overfit(t *testing.T, b tensor.Backend, m *GPT) (first, loss float64) {
	t.Helper()
	rng := testutil.Rng(5)
	V := m.Config().Vocab
	ids := testutil.RandInts(rng, V, 4, 16)
	tg := testutil.RandInts(rng, V, 4, 16)
	w, g := m.Params().Flat()
	for step := range 50 {
		m.ZeroGrad()
		l, err := m.Forward(ids, tg)
		noErr(t, b, err)
		noErr(t, b, m.Backward())
		if step == 0 {
			first = l
		}
		b.Axpy(w, -1.0, g)
		noErr(t, b, nil)
	}
	loss, err := m.Forward(ids, tg)
	noErr(t, b, err)
	return first, loss
}

// TestGPTOverfit: a tiny model learns one small batch with plain SGD.
func TestGPTOverfit(t *testing.T) {
	b := newBackend()
	m, err := NewGPT(b, tinyConfig, tensor.Float32)
	noErr(t, b, err)
	first, loss := overfit(t, b, m)
	t.Logf("loss %.4f → %.4f after 50 SGD steps (log V = %.4f)", first, loss, math.Log(float64(tinyConfig.Vocab)))
	if math.Abs(first-math.Log(float64(tinyConfig.Vocab))) > 0.1 {
		t.Errorf("initial loss %v, want about log(V) = %v", first, math.Log(float64(tinyConfig.Vocab)))
	}
	if !(loss < 0.25*first) {
		t.Errorf("loss fell from %v to %v only", first, loss)
	}
}

func TestGPTFLOPsPerToken(t *testing.T) {
	m, err := NewGPT(newBackend(), GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 10, Seq: 8, FFN: 64, TiedEmbeddings: true}, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	n := 2*(4*16*16+3*16*64) + 10*16
	want := 6*float64(n) + 12*2*16*8
	if got := m.FLOPsPerToken(); got != want {
		t.Errorf("FLOPsPerToken = %v, want %v", got, want)
	}
	// Grouped-query (4 query heads of 4, 1 key/value head): wk and wv are
	// (4, 16), counted among the matmul parameters as such; the attention
	// scores are per query head, as many as before.
	gqa, err := NewGPT(newBackend(), GPTConfig{Layers: 2, Dim: 16, Heads: 4, KVHeads: 1, Vocab: 10, Seq: 8, FFN: 64, TiedEmbeddings: true}, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	n = 2*(2*16*16+2*4*16+3*16*64) + 10*16
	want = 6*float64(n) + 12*2*16*8
	if got := gqa.FLOPsPerToken(); got != want {
		t.Errorf("grouped-query FLOPsPerToken = %v, want %v", got, want)
	}
	if got, want := gqa.Params().Numel(), m.Params().Numel()-2*2*(16-4)*16; got != want {
		t.Errorf("grouped-query model: %d parameters, want %d (wk, wv 1/4 of the multi-head model's)", got, want)
	}
}

// TestGPTIgnoredTargets: the loss is the mean over non-ignored targets only,
// and all-ignored targets give 0 and zero gradients.
func TestGPTIgnoredTargets(t *testing.T) {
	b := newBackend()
	m, err := NewGPT(b, tinyConfig, tensor.Float64)
	noErr(t, b, err)
	ids := hostInts(t, []int32{1, 2, 3, 4}, 1, 4)
	all, err := m.Forward(ids, hostInts(t, []int32{5, 6, 7, 8}, 1, 4))
	noErr(t, b, err)
	losses := download(t, b, m.losses)
	part, err := m.Forward(ids, hostInts(t, []int32{5, -1, 7, -1}, 1, 4))
	noErr(t, b, err)
	if want := (losses[0] + losses[2]) / 2; math.Abs(part-want) > 1e-12 {
		t.Errorf("loss with ignored targets %v, want %v (all: %v)", part, want, all)
	}
	m.ZeroGrad()
	none, err := m.Forward(ids, hostInts(t, []int32{-1, -1, -1, -1}, 1, 4))
	noErr(t, b, err)
	noErr(t, b, m.Backward())
	_, g := m.Params().Flat()
	if none != 0 || b.SumSquares(g) != 0 {
		t.Errorf("all targets ignored: loss %v, Σg² %v, want 0 and 0", none, b.SumSquares(g))
	}
	// Without targets: logits only.
	l, err := m.Forward(ids, nil)
	noErr(t, b, err)
	if l != 0 || !m.Logits().Shape().Equal(tensor.Shape{4, tinyConfig.Vocab}) {
		t.Errorf("forward without targets: loss %v, logits %v", l, m.Logits())
	}
}

// TestGPTShapesChange: the same model runs batches of other shapes, and a
// shorter sequence gives the same logits as the prefix of a longer one
// (causality).
func TestGPTShapesChange(t *testing.T) {
	b := newBackend()
	m, err := NewGPT(b, tinyConfig, tensor.Float64)
	noErr(t, b, err)
	rng := testutil.Rng(6)
	long := testutil.RandInts(rng, tinyConfig.Vocab, 1, 16)
	_, err = m.Forward(long, nil)
	noErr(t, b, err)
	full := download(t, b, m.Logits())
	short := hostInts(t, append([]int32(nil), long.I32()[:5]...), 1, 5)
	_, err = m.Forward(short, short)
	noErr(t, b, err)
	noErr(t, b, m.Backward())
	testutil.AllClose(t, "prefix logits", download(t, b, m.Logits()), full[:5*tinyConfig.Vocab], 1e-12)
}

// TestGPTForwardAsync: ForwardAsync and Backward read nothing back to the
// host; ReadLoss afterwards gives Forward's loss, and the gradients are
// Forward's. ReadLoss before any forward is an error; after a forward
// without targets it is 0.
func TestGPTForwardAsync(t *testing.T) {
	rng := testutil.Rng(21)
	B, T := 2, 8
	ids := testutil.RandInts(rng, tinyConfig.Vocab, B, T)
	targets := testutil.RandInts(rng, tinyConfig.Vocab, B, T)
	targets.I32()[5] = -1

	ref, err := NewGPT(newBackend(), tinyConfig, tensor.Float64)
	noErr(t, ref.b, err)
	want, err := ref.Forward(ids, targets)
	noErr(t, ref.b, err)
	noErr(t, ref.b, ref.Backward())
	_, wg := ref.Params().Flat()

	b := &testutil.HostReads{Backend: newBackend()}
	m, err := NewGPT(b, tinyConfig, tensor.Float64)
	noErr(t, b, err)
	if _, err := m.ReadLoss(); err == nil || !strings.Contains(err.Error(), "needs a successful Forward") {
		t.Errorf("ReadLoss before a forward: %v", err)
	}
	before := b.Count()
	noErr(t, b, m.ForwardAsync(ids, targets))
	noErr(t, b, m.Backward())
	if n := b.Count() - before; n != 0 {
		t.Errorf("ForwardAsync and Backward read the device %d times, want 0", n)
	}
	got, err := m.ReadLoss()
	noErr(t, b, err)
	if math.Abs(got-want) > 1e-12*math.Abs(want) || want == 0 {
		t.Errorf("ReadLoss after Backward = %v, Forward gives %v", got, want)
	}
	_, g := m.Params().Flat()
	if err := testutil.Within("gradients", testutil.Download(b, g), testutil.Download(ref.b, wg), 1e-12); err != nil {
		t.Error(err)
	}
	noErr(t, b, m.ForwardAsync(ids, nil))
	if l, err := m.ReadLoss(); err != nil || l != 0 {
		t.Errorf("ReadLoss after a forward without targets = %v, %v, want 0, nil", l, err)
	}
}
