package layers

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// stepResult is what a step leaves: its loss and every parameter's main
// gradient, by name.
type stepResult struct {
	loss  float64
	grads map[string][]float64
	aux   float64
	stats []MoEStats
}

// gradsOf downloads every parameter's main gradient of m.
func gradsOf(t testing.TB, m *GPT) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	mg := m.Params().MainGrads()
	for _, p := range m.Params().Params() {
		v, err := mg.View(p.Offset(), p.Numel())
		if err != nil {
			t.Fatal(err)
		}
		out[p.Name] = download(t, m.Params().Backend(), v)
	}
	return out
}

// microStep runs one step of m as k micro-batches.
func microStep(t testing.TB, m *GPT, k int, ids, targets *tensor.Tensor) stepResult {
	t.Helper()
	b := m.Params().Backend()
	noErr(t, b, m.SetMicroBatches(k))
	m.ZeroGrad()
	noErr(t, b, m.ForwardBackward(ids, targets))
	loss, err := m.ReadLoss()
	noErr(t, b, err)
	return stepResult{loss: loss, grads: gradsOf(t, m), aux: m.AuxLoss(), stats: m.RouterStats()}
}

// compareSteps checks got against want: the loss and every gradient
// (relative to the gradient's norm) within tol.
func compareSteps(t testing.TB, what string, got, want stepResult, tol float64) {
	t.Helper()
	if e := testutil.RelErr([]float64{got.loss}, []float64{want.loss}); !(e <= tol) {
		t.Errorf("%s: loss %v, want %v (relative error %.3g > %g)", what, got.loss, want.loss, e, tol)
	}
	worst := 0.0
	for name, w := range want.grads {
		e := testutil.RelErr(got.grads[name], w)
		if !(e <= tol) {
			t.Errorf("%s: gradient of %s: relative error %.3g > %g", what, name, e, tol)
		}
		worst = math.Max(worst, e)
	}
	t.Logf("%s: loss error %.3g, worst gradient error %.3g", what, testutil.RelErr([]float64{got.loss}, []float64{want.loss}), worst)
}

// TestForwardBackwardMicroBatches: a step of k micro-batches of a dense
// model (or of an MoE model without capacity or auxiliary losses, whose
// routing is per token) gives the loss and gradients of one batch of all
// of them — with ignored targets spread unevenly over the micro-batches —
// within 1e-12 in f64 and 1e-6 in f32.
func TestForwardBackwardMicroBatches(t *testing.T) {
	dense := GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 23, Seq: 8, Seed: 9, TiedEmbeddings: true}
	moe := dense
	moe.TiedEmbeddings, moe.Experts, moe.TopK, moe.MoEEvery = false, 4, 2, 2
	const B, T = 4, 8
	ids := testutil.RandInts(testutil.Rng(1), dense.Vocab, B, T)
	targets := testutil.RandInts(testutil.Rng(2), dense.Vocab, B, T)
	for _, i := range []int{0, 1, 2, 5, 30} { // all in the first two sequences
		targets.I32()[i] = -1
	}
	for _, tc := range []struct {
		name string
		cfg  GPTConfig
		dt   tensor.DType
		tol  float64
	}{
		{"dense/f64", dense, tensor.Float64, 1e-12},
		{"dense/f32", dense, tensor.Float32, 1e-6},
		{"moe-dropless-no-aux/f64", moe, tensor.Float64, 1e-12},
	} {
		b := newBackend()
		one, err := NewGPT(b, tc.cfg, tc.dt)
		noErr(t, b, err)
		want := microStep(t, one, 1, ids, targets)
		for _, k := range []int{2, 4} {
			m, err := NewGPT(b, tc.cfg, tc.dt)
			noErr(t, b, err)
			compareSteps(t, fmt.Sprintf("%s/k=%d", tc.name, k), microStep(t, m, k, ids, targets), want, tc.tol)
		}
	}
}

// TestForwardBackwardMicroBatchesMoE: with capacity drops and auxiliary
// losses an MoE model's step of k micro-batches is the mean of k separate
// steps, one per micro-batch (each a plain Forward and Backward of its
// rows, every target counted): each micro-batch routes, drops and weighs
// its auxiliary losses over its own tokens, the auxiliary losses enter
// with weight 1/k, and the statistics are the micro-batches' combined
// (CombineMoEStats). f64, within 1e-12.
func TestForwardBackwardMicroBatchesMoE(t *testing.T) {
	cfg := GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 23, Seq: 8, Seed: 9,
		Experts: 4, TopK: 2, MoEEvery: 1, CapacityFactor: 0.5, AuxLossCoef: 0.1, ZLossCoef: 0.01}
	const B, T, k = 4, 8, 2
	ids := testutil.RandInts(testutil.Rng(3), cfg.Vocab, B, T)
	targets := testutil.RandInts(testutil.Rng(4), cfg.Vocab, B, T)
	b := newBackend()

	// The reference: each micro-batch alone, its gradient downloaded, the
	// mean taken on the host.
	ref := stepResult{grads: map[string][]float64{}}
	var perMicro [][]MoEStats
	var auxSum float64
	for j := range k {
		m, err := NewGPT(b, cfg, tensor.Float64)
		noErr(t, b, err)
		rows := B / k
		idj, err := ids.Rows(j*rows, (j+1)*rows)
		noErr(t, b, err)
		tj, err := targets.Rows(j*rows, (j+1)*rows)
		noErr(t, b, err)
		loss, err := m.Forward(idj, tj)
		noErr(t, b, err)
		noErr(t, b, m.Backward())
		ref.loss += loss / k
		auxSum += m.AuxLoss()
		st := m.RouterStats()
		perMicro = append(perMicro, st)
		for name, g := range gradsOf(t, m) {
			if ref.grads[name] == nil {
				ref.grads[name] = make([]float64, len(g))
			}
			for i, v := range g {
				ref.grads[name][i] += v / k
			}
		}
	}
	dropped := 0
	for _, st := range perMicro {
		for _, s := range st {
			dropped += s.Dropped
		}
	}
	if dropped == 0 {
		t.Fatal("the micro-batches dropped no token-slot: the test needs the capacity to act")
	}

	m, err := NewGPT(b, cfg, tensor.Float64)
	noErr(t, b, err)
	got := microStep(t, m, k, ids, targets)
	compareSteps(t, "moe k=2", got, ref, 1e-12)
	if e := math.Abs(got.aux - auxSum/k); !(e <= 1e-12*math.Abs(got.aux)) {
		t.Errorf("AuxLoss %v, want the micro-batches' mean %v", got.aux, auxSum/k)
	}
	if len(got.stats) != cfg.Layers {
		t.Fatalf("RouterStats: %d blocks, want %d", len(got.stats), cfg.Layers)
	}
	for i, s := range got.stats {
		want := CombineMoEStats([]MoEStats{perMicro[0][i], perMicro[1][i]})
		if fmt.Sprint(s.TokensPerExpert) != fmt.Sprint(want.TokensPerExpert) || s.Dropped != want.Dropped || s.Tokens != B*T {
			t.Errorf("block %d statistics %+v, want the micro-batches' sums %+v over %d tokens", i, s, want, B*T)
		}
		if math.Abs(s.LoadBalance-want.LoadBalance) > 1e-12 || math.Abs(s.AuxLoss-want.AuxLoss) > 1e-12 {
			t.Errorf("block %d: load balance %v and aux loss %v, want their means %v and %v", i, s.LoadBalance, s.AuxLoss, want.LoadBalance, want.AuxLoss)
		}
	}
	// The async form gives the same.
	aux, st, err := m.RouterStatsAsync()()
	noErr(t, b, err)
	if aux != got.aux || fmt.Sprint(st) != fmt.Sprint(got.stats) {
		t.Errorf("RouterStatsAsync %v %v, want %v %v", aux, st, got.aux, got.stats)
	}
	// A Forward after it (a validation) reports its own statistics again,
	// and the aux weight is back to 1: a plain step equals the reference
	// step of one micro-batch.
	one, err := NewGPT(b, cfg, tensor.Float64)
	noErr(t, b, err)
	wantOne := microStep(t, one, 1, ids, targets)
	m2, err := NewGPT(b, cfg, tensor.Float64)
	noErr(t, b, err)
	_ = microStep(t, m2, 2, ids, targets)
	m2.ZeroGrad()
	loss, err := m2.Forward(ids, targets)
	noErr(t, b, err)
	noErr(t, b, m2.Backward())
	compareSteps(t, "a plain step after micro-batches", stepResult{loss: loss, grads: gradsOf(t, m2)}, wantOne, 1e-12)
	if fmt.Sprint(m2.RouterStats()) != fmt.Sprint(wantOne.stats) {
		t.Errorf("statistics after a plain Forward %v, want %v", m2.RouterStats(), wantOne.stats)
	}
}

// TestForwardBackwardErrors: a batch that does not split into the
// micro-batches, no targets and a bad count are refused before any work.
func TestForwardBackwardErrors(t *testing.T) {
	b := newBackend()
	m, err := NewGPT(b, GPTConfig{Layers: 1, Dim: 8, Heads: 2, Vocab: 11, Seq: 4, Seed: 1}, tensor.Float32)
	noErr(t, b, err)
	ids := testutil.RandInts(testutil.Rng(1), 11, 3, 4)
	if err := m.SetMicroBatches(0); err == nil || !strings.Contains(err.Error(), "expected at least 1") {
		t.Errorf("SetMicroBatches(0): %v", err)
	}
	noErr(t, b, m.SetMicroBatches(2))
	if err := m.ForwardBackward(ids, ids); err == nil || !strings.Contains(err.Error(), "does not split into 2 micro-batches") {
		t.Errorf("3 sequences in 2 micro-batches: %v", err)
	}
	if err := m.ForwardBackward(ids, nil); err == nil || !strings.Contains(err.Error(), "needs targets") {
		t.Errorf("no targets: %v", err)
	}
	if _, err := m.ReadLoss(); err == nil {
		t.Error("ReadLoss after refused steps: no error")
	}
	noErr(t, b, nil)
}
