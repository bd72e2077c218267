package model_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

// corpus is a learnable token stream: a repeated random phrase with noise.
func corpus(n, vocab int) *tokens.Stream {
	rng := testutil.Rng(99)
	phrase := make([]int32, 37)
	for i := range phrase {
		phrase[i] = int32(rng.IntN(vocab))
	}
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = phrase[i%len(phrase)]
		if rng.IntN(8) == 0 {
			toks[i] = int32(rng.IntN(vocab))
		}
	}
	return tokens.FromIDs("phrase", toks)
}

func trainConfig(steps int, outDir string) train.Config {
	return train.Config{Steps: steps, Batch: 4, Seq: 8, LR: 3e-3, MinLR: 3e-4, Warmup: 3, WeightDecay: 0.1,
		Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 0.5, Seed: 5, LogEvery: 100, OutDir: outDir}
}

func loader(t testing.TB, ds *tokens.Stream, cfg layers.GPTConfig) *train.Loader {
	l, err := train.NewLoader(ds, train.LoaderConfig{Batch: 4, Seq: 8, Vocab: cfg.Vocab, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// runSharded trains on every rank of l with train.RunSharded and returns world
// rank 0's result and its gradient norms.
func runSharded(l layout, cfg layers.GPTConfig, ds *tokens.Stream, tc train.Config) (train.Result, []float64, error) {
	res, norms, _, err := runShardedWeights(l, cfg, ds, tc)
	return res, norms, err
}

// runShardedWeights is runSharded that also returns every rank's weights
// after the run.
func runShardedWeights(l layout, cfg layers.GPTConfig, ds *tokens.Stream, tc train.Config) (train.Result, []float64, [][]float64, error) {
	var res train.Result
	var norms []float64
	weights := make([][]float64, l.tp*l.dp)
	err := onGrid(l, func(b tensor.Backend, g *comm.Grid) error {
		m, err := newModel(b, g, cfg, l, tensor.Float32)
		if err != nil {
			return err
		}
		ld, err := train.NewLoader(ds, train.LoaderConfig{Batch: 4, Seq: 8, Vocab: cfg.Vocab, Seed: 5})
		if err != nil {
			return err
		}
		var mine []float64
		r, err := train.RunSharded(context.Background(), b, m, ld, tc, train.WithOutput(io.Discard), train.WithProgressBar(false),
			train.WithStepHook(func(sm train.StepMetrics) { mine = append(mine, sm.GradNorm) }))
		if g.World.Rank() == 0 {
			res, norms = r, mine
		}
		if err := errors.Join(err, m.Close()); err != nil {
			return err
		}
		w, _ := m.Params().Flat()
		weights[g.World.Rank()] = testutil.Download(b, w)
		return nil
	})
	return res, norms, weights, err
}

// TestTrainMatchesGPT: 20 AdamW steps (warm-up, cosine decay, weight decay,
// clipping at a norm the gradients exceed) through train.Run give the same
// loss and gradient norm step by step as layers.GPT, within 1e-4.
func TestTrainMatchesGPT(t *testing.T) {
	cfg := smallConfig()
	ds := corpus(4000, cfg.Vocab)
	ref, refNorms := trainReference(t, cfg, ds)
	clipped := 0
	for _, n := range refNorms {
		if n > 0.5 {
			clipped++
		}
	}
	if clipped == 0 || ref.Losses[19] >= ref.Losses[0] {
		t.Fatalf("reference run: %d clipped steps, losses %v: expected clipping to act and the loss to fall", clipped, ref.Losses)
	}
	for _, l := range []layout{{tp: 1, dp: 1, sp: false}, {tp: 2, dp: 1, sp: false}, {tp: 4, dp: 1, sp: true}, {tp: 1, dp: 2, sp: false}, {tp: 2, dp: 2, sp: true}, {tp: 4, dp: 1, sp: false}} {
		t.Run(l.String(), func(t *testing.T) { matchReference(t, l, cfg, ds, ref, refNorms) })
	}
}

// trainReference trains layers.GPT for 20 steps through train.Run: the run
// the sharded ones are compared with, and its gradient norms.
func trainReference(t *testing.T, cfg layers.GPTConfig, ds *tokens.Stream) (train.Result, []float64) {
	t.Helper()
	b := cpu.New()
	gpt, err := layers.NewGPT(b, cfg, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	var norms []float64
	ref, err := train.Run(context.Background(), b, gpt, loader(t, ds, cfg), trainConfig(20, t.TempDir()),
		train.WithOutput(io.Discard), train.WithProgressBar(false),
		train.WithStepHook(func(sm train.StepMetrics) { norms = append(norms, sm.GradNorm) }))
	if err != nil {
		t.Fatal(err)
	}
	return ref, norms
}

// matchReference trains 20 steps at layout l through train.RunSharded and
// compares the loss and the gradient norm of every step with the
// reference run's, within 1e-4.
func matchReference(t *testing.T, l layout, cfg layers.GPTConfig, ds *tokens.Stream, ref train.Result, refNorms []float64) {
	t.Helper()
	res, norms, err := runSharded(l, cfg, ds, trainConfig(20, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Losses) != 20 || len(norms) != 20 {
		t.Fatalf("%d losses and %d norms, want 20", len(res.Losses), len(norms))
	}
	worst := 0.0
	for i := range res.Losses {
		e, en := relErr(res.Losses[i], ref.Losses[i]), relErr(norms[i], refNorms[i])
		if !(e <= 1e-4) || !(en <= 1e-4) {
			t.Fatalf("step %d: loss %v (reference %v), gradient norm %v (reference %v)", i+1, res.Losses[i], ref.Losses[i], norms[i], refNorms[i])
		}
		worst = max(worst, e, en)
	}
	t.Logf("worst relative error over 20 steps (loss, gradient norm): %.3g", worst)
}

// TestCheckpointResume: every rank saves its own shards under rank-NNNNN,
// with the layout in state.json, and rank 0 alone writes metrics.jsonl and
// the plot in the out dir; a resume at the same layout continues exactly; a
// resume at another layout is refused on every rank; ranks at different
// steps resume from the newest step all of them hold, and are refused when
// one lacks it. Dense at TP 2 × DP 2 with SP, and MoE at TP 2 × DP 2, EP 4.
func TestCheckpointResume(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  layers.GPTConfig
		l    layout
	}{
		{"dense", smallConfig(), layout{tp: 2, dp: 2, sp: true}},
		{"moe", moeConfig(), layout{tp: 2, dp: 2, ep: 4}},
	} {
		t.Run(c.name, func(t *testing.T) { checkResume(t, c.cfg, c.l) })
	}
}

func checkResume(t *testing.T, cfg layers.GPTConfig, l layout) {
	ds := corpus(4000, cfg.Vocab)
	dir := t.TempDir()
	tc := trainConfig(12, dir)
	tc.CheckpointEvery = 6
	full, _, err := runSharded(l, cfg, ds, tc)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := train.ReadMetrics(filepath.Join(dir, train.MetricsFile))
	if err != nil || len(recs) != 12 {
		t.Fatalf("%s in the out dir: %d records, %v", train.MetricsFile, len(recs), err)
	}
	if _, err := os.Stat(filepath.Join(dir, train.PlotFile)); err != nil {
		t.Fatalf("no plot in the out dir: %v", err)
	}
	for r := range 4 {
		rd := train.RankDir(dir, r)
		if _, err := os.Stat(filepath.Join(rd, train.MetricsFile)); err == nil {
			t.Fatalf("rank %d wrote its own %s", r, train.MetricsFile)
		}
		st, err := train.ReadState(filepath.Join(rd, train.CheckpointName(6), train.StateFile))
		if err != nil {
			t.Fatal(err)
		}
		var got model.Layout
		if err := json.Unmarshal(st.Layout, &got); err != nil {
			t.Fatal(err)
		}
		if want := (model.Layout{TP: 2, DP: 2, EP: max(l.ep, 1), SequenceParallel: l.sp, Rank: r, TPRank: r % 2, DPRank: r / 2, World: 4}); got != want {
			t.Fatalf("rank %d: layout %+v, want %+v", r, got, want)
		}
		// Go back to the checkpoint of step 6 on every rank.
		if err := os.WriteFile(filepath.Join(rd, train.LatestFile), []byte(train.CheckpointName(6)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tc.Resume = dir
	// At another layout, into another out dir: the checkpoints resharded,
	// the losses of the run continued at its own layout.
	other := layout{tp: 4, dp: 1, sp: true, ep: l.ep}
	oc := tc
	oc.OutDir = t.TempDir()
	moved, _, err := runSharded(other, cfg, ds, oc)
	if err != nil {
		t.Fatalf("resume at %v from a %v checkpoint: %v", other, l, err)
	}
	for i, loss := range moved.Losses {
		if w := full.Losses[6+i]; math.Abs(loss-w) > 1e-6*math.Abs(w) {
			t.Fatalf("step %d after a resume at %v: loss %v, want %v (the uninterrupted run's at %v) within 1e-6", 7+i, other, loss, w, l)
		}
	}
	resumed, _, err := runSharded(l, cfg, ds, tc)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.StartStep != 6 || len(resumed.Losses) != 6 {
		t.Fatalf("resumed at step %d with %d losses, want 6 and 6", resumed.StartStep, len(resumed.Losses))
	}
	for i, loss := range resumed.Losses {
		if loss != full.Losses[6+i] {
			t.Fatalf("step %d after resume: loss %v, want %v (the uninterrupted run's), bit for bit", 7+i, loss, full.Losses[6+i])
		}
	}
	if recs, err := train.ReadMetrics(filepath.Join(dir, train.MetricsFile)); err != nil || len(recs) != 12 || recs[11].Loss != full.Losses[11] {
		t.Fatalf("%s after the resume: %d records, %v", train.MetricsFile, len(recs), err)
	}

	tc.Steps = 20
	// Ranks at different steps (one died before its peers' checkpoint of
	// step 12): every rank resumes from step 6, the newest all hold.
	if err := os.WriteFile(filepath.Join(train.RankDir(dir, 2), train.LatestFile), []byte(train.CheckpointName(6)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	again, _, err := runSharded(l, cfg, ds, tc)
	if err != nil || again.StartStep != 6 || again.Losses[0] != full.Losses[6] {
		t.Fatalf("resume from ranks at steps 6 and 12: start %d, %v; want step 6 and the uninterrupted run's loss at step 7", again.StartStep, err)
	}
	// ... unless a rank lacks that step: refused, naming the steps.
	if err := os.WriteFile(filepath.Join(train.RankDir(dir, 2), train.LatestFile), []byte(train.CheckpointName(6)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(train.RankDir(dir, 1), train.CheckpointName(6))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runSharded(l, cfg, ds, tc); err == nil || !strings.Contains(err.Error(), "the newest step every one of the 4 ranks") || !strings.Contains(err.Error(), "is 6, but rank 1's") {
		t.Fatalf("resume from ranks at steps 6 and 20 without step 6 on rank 1: error %v, want one naming both steps", err)
	}
}

// countingBackend counts allocations, to prove layout errors come before
// any work.
type countingBackend struct {
	tensor.Backend
	mu     sync.Mutex
	allocs int
}

func (c *countingBackend) Zeros(dt tensor.DType, shape ...int) *tensor.Tensor {
	c.mu.Lock()
	c.allocs++
	c.mu.Unlock()
	return c.Backend.Zeros(dt, shape...)
}

// newFails checks that model.New on b fails with an error containing want
// before it allocates a tensor (cb counts b's allocations).
func newFails(b tensor.Backend, cb *countingBackend, g *comm.Grid, cfg layers.GPTConfig, sp bool, want string) error {
	_, err := model.New(b, g, cfg, model.Options{SequenceParallel: sp}, tensor.Float32)
	if err == nil || !strings.Contains(err.Error(), want) {
		return fmt.Errorf("New: error %v, want one containing %q", err, want)
	}
	if cb.allocs != 0 {
		return fmt.Errorf("New allocated %d tensors before failing, want none", cb.allocs)
	}
	return nil
}

func TestLayoutErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		l    layout
		edit func(*layers.GPTConfig)
		want string
	}{
		{"heads", layout{tp: 4, dp: 1, sp: false}, func(c *layers.GPTConfig) { c.Heads, c.Dim = 6, 48 }, "Heads = 6"},
		{"ffn", layout{tp: 4, dp: 1, sp: false}, func(c *layers.GPTConfig) { c.FFN = 66 }, "FFN = 66"},
		{"vocab", layout{tp: 2, dp: 2, sp: true}, func(c *layers.GPTConfig) { c.Vocab = 65 }, "Vocab = 65"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig()
			c.edit(&cfg)
			err := onGrid(c.l, func(b tensor.Backend, g *comm.Grid) error {
				cb := &countingBackend{Backend: b}
				return newFails(cb, cb, g, cfg, c.l.sp, c.want)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	// A grid whose DP × TP is not the world.
	err := onGrid(layout{tp: 2, dp: 2, sp: false}, func(b tensor.Backend, g *comm.Grid) error {
		bad := *g
		bad.DP = 1
		_, err := model.New(b, &bad, smallConfig(), model.Options{}, tensor.Float32)
		if err == nil || !strings.Contains(err.Error(), "dp 1 × tp 2 does not match the world of 4") {
			return fmt.Errorf("New with dp 1 × tp 2 on 4 ranks: error %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Batches the layout cannot split: found before any collective, on every rank.
	err = onGrid(layout{tp: 4, dp: 2, sp: true}, func(b tensor.Backend, g *comm.Grid) error {
		m, err := model.New(b, g, smallConfig(), model.Options{SequenceParallel: true}, tensor.Float32)
		if err != nil {
			return err
		}
		ids, targets := batch(1, 3, 8, 64)
		if _, err := m.Forward(ids, targets); err == nil || !strings.Contains(err.Error(), "not divisible by DP = 2") {
			return fmt.Errorf("Forward of 3 sequences at dp 2: error %v", err)
		}
		ids, targets = batch(1, 2, 2, 64)
		if _, err := m.Forward(ids, targets); err == nil || !strings.Contains(err.Error(), "not divisible by TP = 4") {
			return fmt.Errorf("Forward of 2 tokens per replica at tp 4 with SP: error %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
