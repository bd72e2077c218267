package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/train"
)

// par is a run small enough for the parallel tests whose sizes divide by
// 4: one block of width 32 with 4 heads (FFN 128, vocabulary 256), 20
// steps of 4 sequences of 16 tokens.
func par(out string, extra ...string) []string {
	args := []string{"--layers", "1", "--dim", "32", "--heads", "4", "--seq", "16", "--batch", "4",
		"--steps", "20", "--warmup", "2", "--log-every", "100", "--device", "cpu", "--out", out}
	return append(args, extra...)
}

// moe turns par's model into an MoE of 4 experts, top-2, with the aux and
// z losses of the tiny-moe preset.
var moe = []string{"--experts", "4", "--topk", "2"}

func metrics(t *testing.T, dir string) []train.StepMetrics {
	t.Helper()
	recs, err := train.ReadMetrics(filepath.Join(dir, train.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func relErr(a, b float64) float64 { return math.Abs(a-b) / math.Max(math.Abs(b), 1e-30) }

// sameRun checks that two runs' metrics agree step by step: the loss (and
// the aux loss) within tol, the tokens per expert exactly.
func sameRun(t *testing.T, name string, got, want []train.StepMetrics, tol float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d steps, want %d", name, len(got), len(want))
	}
	worst := 0.0
	for i := range want {
		g, w := got[i], want[i]
		if g.Step != w.Step {
			t.Fatalf("%s: record %d is step %d, want %d", name, i, g.Step, w.Step)
		}
		e := relErr(g.Loss, w.Loss)
		if !(e <= tol) {
			t.Fatalf("%s: step %d: loss %v, want %v (relative error %.3g)", name, w.Step, g.Loss, w.Loss, e)
		}
		worst = max(worst, e)
		if wa, ok := w.Extra["aux_loss"].(float64); ok {
			ga, _ := g.Extra["aux_loss"].(float64)
			if e := relErr(ga, wa); !(e <= tol) {
				t.Fatalf("%s: step %d: aux loss %v, want %v", name, w.Step, ga, wa)
			}
			if !reflect.DeepEqual(g.Extra["tokens_per_expert"], w.Extra["tokens_per_expert"]) {
				t.Fatalf("%s: step %d: tokens per expert %v, want %v", name, w.Step, g.Extra["tokens_per_expert"], w.Extra["tokens_per_expert"])
			}
		}
	}
	t.Logf("%s: worst relative loss error over %d steps %.3g", name, len(want), worst)
}

// trainRun runs the command in process and returns its out dir.
func trainRun(t *testing.T, args ...string) string {
	t.Helper()
	out := t.TempDir()
	if err := run(context.Background(), par(out, args...)); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out
}

// checkParallelOutputs: rank 0's metrics, plot and the config in the out
// dir, each rank's checkpoints in its rank dir, no metrics there.
func checkParallelOutputs(t *testing.T, out string, world int, want ParallelConfig) {
	t.Helper()
	for _, f := range []string{train.MetricsFile, train.PlotFile, "config.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing %s in the out dir: %v", f, err)
		}
	}
	for r := range world {
		rd := train.RankDir(out, r)
		if _, err := train.ResolveCheckpoint(rd); err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
		if _, err := os.Stat(filepath.Join(rd, train.MetricsFile)); err == nil {
			t.Errorf("rank %d wrote its own %s", r, train.MetricsFile)
		}
	}
	if _, err := os.Stat(train.RankDir(out, world)); err == nil {
		t.Errorf("a rank dir beyond the world of %d", world)
	}
	cfg, err := loadConfig([]string{"--config", filepath.Join(out, "config.json")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Parallel != want {
		t.Errorf("config.json: parallel %+v, want %+v", cfg.Parallel, want)
	}
}

// --tp 1, 2, 4 (4 also with sequence parallelism) write the losses of the
// single-rank run step by step.
func TestParallelTP(t *testing.T) {
	single := metrics(t, trainRun(t))
	for _, args := range [][]string{{"--tp", "2"}, {"--tp", "4"}, {"--tp", "4", "--sequence-parallel"}} {
		out := trainRun(t, args...)
		sameRun(t, strings.Join(args, " "), metrics(t, out), single, 1e-4)
		if args[1] == "2" {
			checkParallelOutputs(t, out, 2, ParallelConfig{TP: 2, DP: 1, EP: 1, World: 2, CommTimeout: Duration(defaultCommTimeout), Comm: CommLocal})
		}
	}
}

// --dp 1, 2 (and 2 with --tp 2) write the same losses.
func TestParallelDP(t *testing.T) {
	single := metrics(t, trainRun(t, "--dp", "1"))
	for _, args := range [][]string{{"--dp", "2"}, {"--dp", "2", "--tp", "2"}, {"--world", "4", "--tp", "2"}} {
		sameRun(t, strings.Join(args, " "), metrics(t, trainRun(t, args...)), single, 1e-4)
	}
}

// --ep 1, 2, 4 on an MoE model write the losses, the aux losses and the
// tokens per expert of the single-rank run.
func TestParallelEP(t *testing.T) {
	single := metrics(t, trainRun(t, moe...))
	if _, ok := single[0].Extra["aux_loss"]; !ok {
		t.Fatalf("the single-rank MoE run logs no aux_loss: %+v", single[0])
	}
	for _, args := range [][]string{
		{"--tp", "2", "--ep", "1"}, {"--dp", "2", "--ep", "2"}, {"--tp", "2", "--ep", "2"},
		{"--tp", "2", "--dp", "2", "--ep", "4"}, {"--tp", "4", "--ep", "4", "--sequence-parallel"},
	} {
		out := trainRun(t, append(append([]string{}, moe...), args...)...)
		sameRun(t, strings.Join(args, " "), metrics(t, out), single, 1e-4)
	}
}

// Bad layouts fail before any work, saying what is wrong; nothing is
// written.
func TestParallelLayoutErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"tp does not divide heads", []string{"--tp", "3"}, "--tp 3 does not divide the model's heads = 4"},
		{"tp does not divide ffn", []string{"--tp", "4", "--ffn", "66"}, "--tp 4 does not divide the model's ffn = 66"},
		{"tp does not divide vocab", []string{"--tp", "2", "--data", "TOKENS", "--vocab", "301"}, "--tp 2 does not divide the model's vocab = 301"},
		{"ep does not divide experts", append([]string{"--dp", "3", "--batch", "6", "--ep", "3"}, moe...), "--ep 3 does not divide the 4 experts"},
		{"ep does not divide world", append([]string{"--tp", "2", "--ep", "4"}, moe...), "--ep 4 does not divide the world of 2 ranks"},
		{"ep on a dense model", []string{"--dp", "2", "--ep", "2"}, "the model is dense"},
		{"world is not dp × tp", []string{"--world", "4", "--dp", "2", "--tp", "1"}, "a world of 4 ranks with --dp 2 × --tp 1 = 2"},
		{"top-k over experts", append([]string{"--tp", "2", "--ep", "2"}, "--experts", "4", "--topk", "5"), "TopK = 5"},
		{"batch not divisible by dp", []string{"--dp", "3"}, "--batch 4 is not divisible by --dp 3"},
		{"sequence parallel without tp", []string{"--sequence-parallel"}, "needs --tp > 1"},
		{"bad comm timeout", []string{"--tp", "2", "--comm-timeout", "-1s"}, "--comm-timeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := par(out, c.args...)
			for i, a := range args {
				if a == "TOKENS" {
					args[i] = writeTokens(t, 301)
				}
			}
			msg, code := runMain(t, args...)
			if code == 0 || !strings.Contains(msg, c.want) {
				t.Fatalf("exit %d, want non-zero with %q; output:\n%s", code, c.want, msg)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("the out dir was created before the layout error")
			}
		})
	}
}

// writeTokens writes a .bin file of uint16 tokens below vocab.
func writeTokens(t *testing.T, vocab int) string {
	t.Helper()
	b := make([]byte, 2*4096)
	for i := range 4096 {
		v := uint16(i * 7 % vocab)
		b[2*i], b[2*i+1] = byte(v), byte(v>>8)
	}
	p := filepath.Join(t.TempDir(), "tokens.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A parallel run resumed from its out dir at the same layout continues
// exactly (a resume at another layout: TestReshardResume); one rank's
// checkpoint and a path that holds no run are refused before any work.
func TestParallelResume(t *testing.T) {
	layoutArgs := append([]string{"--tp", "2", "--dp", "2", "--ep", "2"}, moe...)
	full := trainRun(t, append([]string{"--steps", "10", "--checkpoint-every", "5"}, layoutArgs...)...)
	want := metrics(t, full)
	// Go back to step 5 on every rank.
	for r := range 4 {
		if err := os.WriteFile(filepath.Join(train.RankDir(full, r), train.LatestFile), []byte(train.CheckpointName(5)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resumed := trainRun(t, append([]string{"--steps", "10", "--resume", full}, layoutArgs...)...)
	got := metrics(t, resumed)
	if len(got) != 5 || got[0].Step != 6 {
		t.Fatalf("resumed run recorded %d steps from %d, want steps 6 to 10", len(got), got[0].Step)
	}
	for i, g := range got {
		if w := want[5+i]; g.Loss != w.Loss || !reflect.DeepEqual(g.Extra["tokens_per_expert"], w.Extra["tokens_per_expert"]) {
			t.Fatalf("step %d after the resume: loss %v, want %v bit for bit", g.Step, g.Loss, w.Loss)
		}
	}
	// Resuming into the same out dir keeps the metrics of the earlier
	// steps; with no layout flags, the resume takes the checkpoint's.
	if err := run(context.Background(), par(full, "--steps", "10", "--resume", full)); err != nil {
		t.Fatal(err)
	}
	if again := metrics(t, full); len(again) != 10 || again[9].Loss != want[9].Loss {
		t.Fatalf("resumed in place: %d records", len(again))
	}

	for _, c := range []struct {
		name, from string
		args       []string
		want       string
	}{
		{"a rank's checkpoint", filepath.Join(train.RankDir(full, 0), train.CheckpointName(5)), layoutArgs, "the parent of rank-00000"},
		{"nothing there", filepath.Join(t.TempDir(), "none"), []string{"--tp", "2"}, "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			msg, code := runMain(t, par(out, append([]string{"--steps", "20", "--resume", c.from}, c.args...)...)...)
			if code == 0 || !strings.Contains(msg, c.want) {
				t.Fatalf("exit %d, want non-zero with %q; output:\n%s", code, c.want, msg)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatalf("the out dir was created before the error")
			}
		})
	}
}

// faultyBackend fails (fail) or blocks until release (stall) at its
// at-th MatMul.
type faultyBackend struct {
	*cpu.Backend
	mu      sync.Mutex
	matmuls int
	at      int
	stall   chan struct{}
	err     error
}

func (f *faultyBackend) MatMul(c, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	f.mu.Lock()
	f.matmuls++
	hit := f.matmuls == f.at
	if hit && f.stall == nil {
		f.err = fmt.Errorf("injected fault in MatMul #%d", f.at)
	}
	failed := f.err != nil
	f.mu.Unlock()
	if hit && f.stall != nil {
		<-f.stall
	}
	if !failed {
		f.Backend.MatMul(c, a, b, transA, transB, alpha, beta)
	}
}

func (f *faultyBackend) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	return f.Backend.Err()
}

func (f *faultyBackend) Sync() error { return f.Err() }

// A rank whose backend fails mid-step, or that stalls, makes the run fail
// within the collective deadline with an error naming it.
func TestParallelRankFailure(t *testing.T) {
	for _, stall := range []bool{false, true} {
		t.Run(fmt.Sprint("stall=", stall), func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			saved := newRankBackend
			defer func() { newRankBackend = saved }()
			newRankBackend = func(rank, threads int) tensor.Backend {
				b := cpu.New(cpu.WithThreads(threads))
				if rank != 1 {
					return b
				}
				f := &faultyBackend{Backend: b, at: 50} // in the second step
				if stall {
					f.stall = release
				}
				return f
			}
			start := time.Now()
			err := run(context.Background(), par(t.TempDir(), "--tp", "2", "--dp", "2", "--comm-timeout", "1s"))
			elapsed := time.Since(start)
			if err == nil {
				t.Fatal("no error")
			}
			want := "injected fault"
			if stall {
				want = "rank 1: stalled"
			}
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "rank 1") {
				t.Fatalf("error does not name rank 1 (%q):\n%v", want, err)
			}
			if limit := 8 * time.Second; elapsed > limit {
				t.Fatalf("the run took %v to fail, want under %v", elapsed, limit)
			}
			t.Logf("failed after %v: %v", elapsed.Round(time.Millisecond), err)
		})
	}
}

// The "parallel" section of a config file, overridden by flags.
func TestParallelConfig(t *testing.T) {
	p := writeConfig(t, `{"parallel": {"tp": 2, "dp": 2, "ep": 2, "sequence_parallel": true, "comm_timeout": "90s"}, "model": {"experts": 4}}`)
	cfg, err := loadConfig([]string{"--config", p})
	if err != nil {
		t.Fatal(err)
	}
	want := ParallelConfig{TP: 2, DP: 2, EP: 2, World: 4, SequenceParallel: true, CommTimeout: Duration(90 * time.Second), Comm: CommLocal}
	if cfg.Parallel != want {
		t.Fatalf("parallel %+v, want %+v", cfg.Parallel, want)
	}
	cfg, err = loadConfig([]string{"--config", p, "--tp", "4", "--dp", "1", "--comm-timeout", "2m"})
	want = ParallelConfig{TP: 4, DP: 1, EP: 2, World: 4, SequenceParallel: true, CommTimeout: Duration(2 * time.Minute), Comm: CommLocal}
	if err != nil || cfg.Parallel != want {
		t.Fatalf("flags over the file: %+v, %v; want %+v", cfg.Parallel, err, want)
	}
	// World without DP: DP = world / TP; a timeout in seconds.
	cfg, err = loadConfig([]string{"--config", writeConfig(t, `{"parallel": {"world": 4, "tp": 2, "comm_timeout": 30}}`)})
	if err != nil || cfg.Parallel.DP != 2 || cfg.Parallel.CommTimeout != Duration(30*time.Second) {
		t.Fatalf("world 4, tp 2: %+v, %v", cfg.Parallel, err)
	}
	// The default is one rank.
	if cfg, err := loadConfig(nil); err != nil || !cfg.Parallel.Single() || cfg.Parallel.World != 1 {
		t.Fatalf("default layout %+v, %v", cfg.Parallel, err)
	}
	for body, msg := range map[string]string{
		`{"parallel": {"tp": -1}}`:                  "--tp -1",
		`{"parallel": {"comm_timeout": "soon"}}`:    "comm_timeout",
		`{"parallel": {"comm_timeout": [1]}}`:       "comm_timeout",
		`{"parallel": {"world": 3, "dp": 2}}`:       "world = dp × tp",
		`{"parallel": {"tp": 2, "unknown": true}}`:  "unknown",
		`{"parallel": {"world": 100000}}`:           "--world 100000",
		`{"parallel": {"comm_timeout": -5}}`:        "--comm-timeout",
		`{"parallel": {"tp": 2}, "device": "cuda"}`: "--device cuda takes one rank",
	} {
		if _, err := loadConfig([]string{"--config", writeConfig(t, body)}); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: error %v, want one containing %q", body, err, msg)
		}
	}
}

// paramCount agrees with layers.GPT for dense, MoE, untied and
// grouped-query models.
func TestParamCount(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-moe"} {
		for _, tied := range []bool{true, false} {
			for _, kv := range []int{0, 2, 1} {
				c := presets[name]().Model
				c.TiedEmbeddings, c.KVHeads = tied, kv
				c.MoEEvery = map[bool]int{true: 2, false: c.MoEEvery}[name == "tiny-moe" && tied]
				c = c.WithDefaults()
				m, err := newGPTForCount(c)
				if err != nil {
					t.Fatal(err)
				}
				if got := paramCount(c); got != m {
					t.Errorf("%s tied=%v kv_heads=%d: paramCount %d, layers.GPT has %d", name, tied, kv, got, m)
				}
			}
		}
	}
}

func newGPTForCount(c layers.GPTConfig) (int, error) {
	m, err := layers.NewGPT(cpu.New(), c, tensor.Float32)
	if err != nil {
		return 0, err
	}
	return m.Params().Numel(), nil
}

// cancellingBackend cancels the run's context at its at-th MatMul, as a
// signal arriving in the middle of a step on one rank would.
type cancellingBackend struct {
	*cpu.Backend
	mu      sync.Mutex
	matmuls int
	at      int
	cancel  context.CancelFunc
}

func (c *cancellingBackend) MatMul(d, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	c.mu.Lock()
	c.matmuls++
	if c.matmuls == c.at {
		c.cancel()
	}
	c.mu.Unlock()
	c.Backend.MatMul(d, a, b, transA, transB, alpha, beta)
}

// An interrupt seen by one rank mid-step stops every rank after that same
// step, each with a checkpoint of it, and the run resumes from them.
func TestParallelInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	saved := newRankBackend
	defer func() { newRankBackend = saved }()
	newRankBackend = func(rank, threads int) tensor.Backend {
		b := cpu.New(cpu.WithThreads(threads))
		if rank != 2 {
			return b
		}
		return &cancellingBackend{Backend: b, at: 100, cancel: cancel}
	}
	out := t.TempDir()
	args := par(out, "--tp", "2", "--dp", "2", "--comm-timeout", "10s")
	err := run(ctx, args)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want one wrapping context.Canceled", err)
	}
	var step string
	for r := range 4 {
		ck, err := train.ResolveCheckpoint(train.RankDir(out, r))
		if err != nil {
			t.Fatal(err)
		}
		if r == 0 {
			step = filepath.Base(ck)
		} else if filepath.Base(ck) != step {
			t.Fatalf("rank %d stopped at %s, rank 0 at %s", r, filepath.Base(ck), step)
		}
	}
	newRankBackend = saved
	if err := run(context.Background(), append(args, "--resume", out)); err != nil {
		t.Fatalf("resume after the interrupt at %s: %v", step, err)
	}
	if recs := metrics(t, out); len(recs) != 20 {
		t.Fatalf("%d steps recorded after the resume, want 20", len(recs))
	}
	t.Logf("stopped at %s on every rank, resumed to step 20", step)
}

// The 1B preset is the size its name says (paramCount is checked against
// layers.GPT on the small presets above; building this one on the CPU takes
// minutes).
func TestLlama1BPresetSize(t *testing.T) {
	c := presets["llama-1b"]().Model.WithDefaults()
	if n := paramCount(c); n < 1.0e9 || n > 1.2e9 || c.Dim/c.Heads != 128 {
		t.Errorf("llama-1b: %d parameters, head dim %d; want 1.0–1.2 B and 128", n, c.Dim/c.Heads)
	}
}
