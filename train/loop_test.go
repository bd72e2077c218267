package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
)

func smallConfig(out string, steps int) Config {
	return Config{
		Steps: steps, Batch: 4, Seq: 16, LR: 0.05, MinLR: 0.005, Warmup: 3,
		WeightDecay: 0.1, GradClip: 1.0, Seed: 3, LogEvery: 5, OutDir: out,
	}
}

func loaderFor(t testing.TB, cfg Config) *Loader {
	return mustLoader(t, corpus(3000), LoaderConfig{Batch: cfg.Batch, Seq: cfg.Seq, Vocab: 256, Seed: cfg.Seed})
}

func TestRunLearnsAndRecords(t *testing.T) {
	out := t.TempDir()
	cfg := smallConfig(out, 40)
	cfg.CheckpointEvery, cfg.KeepCheckpoints = 10, 2
	var log bytes.Buffer
	var hooked int
	res, err := Run(context.Background(), newCPU(), newBigram(t, newCPU(), 256, tensor.Float32, 1), loaderFor(t, cfg), cfg,
		WithOutput(&log), WithStepHook(func(StepMetrics) { hooked++ }),
		WithExtraMetrics(func(step int) map[string]any { return map[string]any{"aux_loss": float64(step) / 10} }))
	if err != nil {
		t.Fatal(err)
	}
	if res.Step != 40 || res.StepsRun != 40 || len(res.Losses) != 40 || hooked != 40 || res.StartStep != 0 {
		t.Fatalf("result %+v (hooked %d)", res, hooked)
	}
	if !(res.Losses[39] < res.Losses[0]-1) {
		t.Errorf("loss went from %.3f to %.3f, expected it to fall", res.Losses[0], res.Losses[39])
	}
	if res.FinalLoss != res.Losses[39] || !(res.TokensPerSec > 0) {
		t.Errorf("final loss %v, tokens/s %v", res.FinalLoss, res.TokensPerSec)
	}
	if want := filepath.Join(out, "step-000040"); res.LastCheckpoint != want {
		t.Errorf("last checkpoint %s, want %s", res.LastCheckpoint, want)
	}
	cks, _ := ListCheckpoints(out)
	if len(cks) != 2 || filepath.Base(cks[0]) != "step-000030" {
		t.Errorf("checkpoints kept: %v, want step-000030 and step-000040", cks)
	}
	recs, err := ReadMetrics(filepath.Join(out, MetricsFile))
	if err != nil || len(recs) != 40 {
		t.Fatalf("metrics.jsonl: %d records, %v", len(recs), err)
	}
	for i, r := range recs {
		if r.Step != i+1 || r.Loss != res.Losses[i] || r.LR != cfg.Schedule().LR(i+1) || !(r.GradNorm > 0) || !(r.TokensPerSec > 0) || !(r.ElapsedS > 0) {
			t.Fatalf("record %d: %+v", i, r)
		}
		if r.Extra["aux_loss"] != float64(i+1)/10 || r.Extra["flops_per_s"] == nil {
			t.Fatalf("record %d extra: %v", i, r.Extra)
		}
	}
	if fi, err := os.Stat(filepath.Join(out, PlotFile)); err != nil || fi.Size() < 1000 {
		t.Errorf("loss plot: %v", err)
	}
	// Plain log lines every LogEvery steps (and the first), no bar.
	lines := strings.Count(log.String(), "| loss ")
	if lines != 9 {
		t.Errorf("%d log lines, want 9 (step 1 and every 5th):\n%s", lines, log.String())
	}
	if !strings.Contains(log.String(), "checkpoint "+filepath.Join(out, "step-000010")) {
		t.Errorf("log does not mention the checkpoint:\n%s", log.String())
	}
}

// runSteps trains a fresh model (initialised from initSeed) to cfg.Steps,
// resuming when cfg.Resume is set, and returns the result and final params.
type newModel func(t testing.TB, b tensor.Backend) Model

func runSteps(t *testing.T, mk newModel, cfg Config, opts ...Option) (Result, []float64) {
	t.Helper()
	b := newCPU()
	m := mk(t, b)
	res, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, append([]Option{WithOutput(&bytes.Buffer{})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return res, paramValues(t, m.Params())
}

func checkResumeIdentical(t *testing.T, mk newModel, steps int) {
	full, fullParams := runSteps(t, mk, smallConfig(t.TempDir(), steps))

	out := t.TempDir()
	first := smallConfig(out, steps)
	first.Steps = steps // the schedule is that of the whole run ...
	var firstLosses []float64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// ... stopped half-way (as a crash or Ctrl-C would), with another LogEvery.
	first.LogEvery = 1
	b := newCPU()
	m := mk(t, b)
	res1, err := Run(ctx, b, m, loaderFor(t, first), first, WithOutput(&bytes.Buffer{}),
		WithStepHook(func(s StepMetrics) {
			// The hook of step s runs when s is read back, with step
			// s+1 already queued (Run keeps one step ahead): a cancel
			// here stops the run after step s+1.
			if s.Step == steps/2-1 {
				cancel()
			}
		}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted run: %v", err)
	}
	firstLosses = res1.Losses
	if res1.Step != steps/2 || filepath.Base(res1.LastCheckpoint) != CheckpointName(steps/2) {
		t.Fatalf("interrupted run stopped at %d with checkpoint %s", res1.Step, res1.LastCheckpoint)
	}

	second := smallConfig(out, steps)
	second.Resume = out
	second.LogEvery = 7
	res2, params2 := runSteps(t, mk, second)
	if res2.StartStep != steps/2 || res2.Step != steps {
		t.Fatalf("resumed run: start %d, end %d", res2.StartStep, res2.Step)
	}
	got := append(append([]float64{}, firstLosses...), res2.Losses...)
	for i := range full.Losses {
		if math.Float64bits(got[i]) != math.Float64bits(full.Losses[i]) {
			t.Fatalf("step %d: loss %v after resume, %v in one run (bits %x vs %x)", i+1, got[i], full.Losses[i], math.Float64bits(got[i]), math.Float64bits(full.Losses[i]))
		}
	}
	if !reflect.DeepEqual(params2, fullParams) {
		t.Errorf("final parameters differ between the resumed and the single run")
	}
	// The metrics file of the resumed run holds every step once.
	recs, _ := ReadMetrics(filepath.Join(out, MetricsFile))
	if len(recs) != steps {
		t.Errorf("metrics.jsonl has %d records after resume, want %d", len(recs), steps)
	}
	for i, r := range recs {
		if r.Step != i+1 || math.Float64bits(r.Loss) != math.Float64bits(full.Losses[i]) {
			t.Errorf("metrics record %d: step %d loss %v", i, r.Step, r.Loss)
			break
		}
	}
}

func TestRunResumeIdenticalBigram(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		t.Run(dt.String(), func(t *testing.T) {
			checkResumeIdentical(t, func(t testing.TB, b tensor.Backend) Model {
				return newBigram(t, b, 256, dt, 1)
			}, 20)
		})
	}
}

func TestRunResumeIdenticalGPT(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		t.Run(dt.String(), func(t *testing.T) {
			checkResumeIdentical(t, func(t testing.TB, b tensor.Backend) Model {
				m, err := layers.NewGPT(b, layers.GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 256, Seq: 16, FFN: 32, Seed: 4}, dt)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}, 8)
		})
	}
}

func TestRunStopsOnNaN(t *testing.T) {
	for _, tc := range []struct {
		name         string
		nanAt, infAt int
		want         string
	}{
		{"loss", 7, 0, "loss is NaN at step 7; last good checkpoint: "},
		{"grad", 0, 5, "gradient norm is +Inf at step 5; last good checkpoint: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			cfg := smallConfig(out, 20)
			cfg.CheckpointEvery = 2
			b := newCPU()
			m := newBigram(t, b, 256, tensor.Float32, 1)
			m.nanAt, m.infGradAt = tc.nanAt, tc.infAt
			res, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
			good := filepath.Join(out, "step-000004")
			if tc.nanAt == 7 {
				good = filepath.Join(out, "step-000006")
			}
			testutil.ErrorContains(t, err, tc.want+good)
			if res.LastCheckpoint != good {
				t.Errorf("result's last checkpoint %s, want %s", res.LastCheckpoint, good)
			}
			cks, _ := ListCheckpoints(out)
			if filepath.Base(cks[len(cks)-1]) != filepath.Base(good) {
				t.Errorf("checkpoints after divergence: %v", cks)
			}
			if l, _ := LatestCheckpoint(out); l != good {
				t.Errorf("latest = %s, want %s", l, good)
			}
			// The good checkpoint still loads.
			m2 := newBigram(t, b, 256, tensor.Float32, 2)
			opt2, _ := optim.NewAdamW(b, m2.Params())
			if _, err := LoadCheckpoint(good, b, opt2); err != nil {
				t.Errorf("last good checkpoint does not load: %v", err)
			}
		})
	}
	// No checkpoint yet.
	cfg := smallConfig(t.TempDir(), 5)
	b := newCPU()
	m := newBigram(t, b, 256, tensor.Float32, 1)
	m.nanAt = 1
	_, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
	testutil.ErrorContains(t, err, "loss is NaN at step 1; last good checkpoint: none")
}

func TestRunOptionsAndErrors(t *testing.T) {
	b := newCPU()
	m := newBigram(t, b, 256, tensor.Float32, 1)

	// Rank other than 0: nothing written.
	out := filepath.Join(t.TempDir(), "out")
	cfg := smallConfig(out, 3)
	var log bytes.Buffer
	res, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithRank0(false), WithOutput(&log))
	if err != nil || res.Step != 3 || res.LastCheckpoint != "" {
		t.Fatalf("rank 1 run: %+v, %v", res, err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) || log.Len() != 0 {
		t.Errorf("a non-zero rank wrote %s or logged %q", out, log.String())
	}

	// Validation and the progress bar.
	out = t.TempDir()
	cfg = smallConfig(out, 6)
	val := mustLoader(t, corpus(500), LoaderConfig{Batch: 2, Seq: 16, Vocab: 256, Sequential: true})
	log.Reset()
	if _, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&log), WithProgressBar(true),
		WithValidation(val, 3, 2), WithModelConfig(map[string]int{"vocab": 256}), WithLayout(map[string]int{"tp": 1})); err != nil {
		t.Fatal(err)
	}
	recs, _ := ReadMetrics(filepath.Join(out, MetricsFile))
	for _, r := range recs {
		_, has := r.Extra["val_loss"].(float64)
		if has != (r.Step%3 == 0) {
			t.Errorf("step %d: val_loss present = %v", r.Step, has)
		}
	}
	if !strings.Contains(log.String(), "6/6") {
		t.Errorf("progress bar output %q", log.String())
	}
	st, err := ReadState(filepath.Join(out, "step-000006", StateFile))
	if err != nil || compact(st.Layout) != `{"tp":1}` || compact(st.ModelConfig) != `{"vocab":256}` || st.TrainConfig.Steps != 6 {
		t.Errorf("state.json: %+v, %v", st, err)
	}

	// Errors.
	bad := cfg
	bad.Batch = 5
	_, err = Run(context.Background(), b, m, loaderFor(t, cfg), bad)
	testutil.ErrorContains(t, err, "batch 4", "config says batch 5")
	bad = cfg
	bad.Warmup = -1
	_, err = Run(context.Background(), b, m, loaderFor(t, cfg), bad)
	testutil.ErrorContains(t, err, "warmup = -1")
	bad = cfg
	bad.Steps, bad.Resume = 4, out
	_, err = Run(context.Background(), b, m, loaderFor(t, cfg), bad, WithOutput(&log))
	testutil.ErrorContains(t, err, "at step 6, past the run's 4 steps")
	bad.Resume = filepath.Join(out, "missing")
	_, err = Run(context.Background(), b, m, loaderFor(t, cfg), bad, WithOutput(&log))
	testutil.ErrorContains(t, err, "no such directory")
	// A finished run resumed with the same step count does nothing.
	done := cfg
	done.Resume = out
	res, err = Run(context.Background(), b, m, loaderFor(t, cfg), done, WithOutput(&log))
	if err != nil || res.StepsRun != 0 || res.Step != 6 {
		t.Errorf("resume of a finished run: %+v, %v", res, err)
	}
	// Cancelled before starting.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Run(ctx, b, m, loaderFor(t, cfg), smallConfig(t.TempDir(), 3), WithOutput(&log))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled run: %v", err)
	}
}

func compact(raw []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return err.Error()
	}
	return b.String()
}

func TestStepMetricsJSON(t *testing.T) {
	m := StepMetrics{Step: 3, Loss: math.NaN(), LR: 0.1, Extra: map[string]any{"z": 1, "loss": 99, "a": "x"}}
	b, err := m.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"step":3,"loss":null,"lr":0.1,"grad_norm":0,"tokens_per_s":0,"elapsed_s":0,"a":"x","z":1}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var back StepMetrics
	if err := back.UnmarshalJSON(b); err != nil || back.Step != 3 || !math.IsNaN(back.Loss) || back.Extra["a"] != "x" {
		t.Errorf("round trip: %+v, %v", back, err)
	}
}

// WithMetricsDir moves metrics.jsonl and the plot away from the
// checkpoints, or ("") turns them off, leaving the checkpoints in OutDir.
func TestRunMetricsDir(t *testing.T) {
	for _, elsewhere := range []bool{true, false} {
		out, metrics := t.TempDir(), ""
		if elsewhere {
			metrics = t.TempDir()
		}
		cfg := smallConfig(out, 4)
		var log bytes.Buffer
		if _, err := Run(context.Background(), newCPU(), newBigram(t, newCPU(), 256, tensor.Float32, 1), loaderFor(t, cfg), cfg,
			WithOutput(&log), WithMetricsDir(metrics)); err != nil {
			t.Fatal(err)
		}
		if _, err := ResolveCheckpoint(out); err != nil {
			t.Fatalf("metrics dir %q: no checkpoint in the out dir: %v", metrics, err)
		}
		for _, f := range []string{MetricsFile, PlotFile} {
			if _, err := os.Stat(filepath.Join(out, f)); err == nil {
				t.Errorf("metrics dir %q: %s written to the out dir", metrics, f)
			}
			if _, err := os.Stat(filepath.Join(metrics, f)); elsewhere && err != nil {
				t.Errorf("metrics dir %q: %v", metrics, err)
			}
		}
		if !strings.Contains(log.String(), "| loss ") {
			t.Errorf("metrics dir %q: no log lines:\n%s", metrics, log.String())
		}
	}
}

// asyncBigram is the bigram behind AsyncLoss: ForwardAsync keeps the loss
// back until ReadLoss, and the calls are logged.
type asyncBigram struct {
	*bigram
	loss  float64
	calls []string
}

func (m *asyncBigram) Forward(ids, targets *tensor.Tensor) (float64, error) {
	m.calls = append(m.calls, "Forward")
	return m.bigram.Forward(ids, targets)
}

func (m *asyncBigram) ForwardAsync(ids, targets *tensor.Tensor) error {
	m.calls = append(m.calls, "ForwardAsync")
	var err error
	m.loss, err = m.bigram.Forward(ids, targets)
	return err
}

func (m *asyncBigram) ReadLoss() (float64, error) {
	m.calls = append(m.calls, "ReadLoss")
	return m.loss, nil
}

func (m *asyncBigram) Backward() error {
	m.calls = append(m.calls, "Backward")
	return m.bigram.Backward()
}

// TestRunAsyncLoss: with AsyncLoss, Run reads the loss after Backward, and
// the run's losses are those of the plain model; a NaN read then still
// stops the run before the update, naming the step.
func TestRunAsyncLoss(t *testing.T) {
	cfg := smallConfig(t.TempDir(), 6)
	b := newCPU()
	plain, err := Run(context.Background(), b, newBigram(t, b, 256, tensor.Float32, 1), loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	cfg = smallConfig(t.TempDir(), 6)
	m := &asyncBigram{bigram: newBigram(t, b, 256, tensor.Float32, 1)}
	res, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Losses) != fmt.Sprint(plain.Losses) {
		t.Errorf("losses through AsyncLoss %v, want %v", res.Losses, plain.Losses)
	}
	if got := strings.Join(m.calls[:6], " "); got != "ForwardAsync Backward ReadLoss ForwardAsync Backward ReadLoss" {
		t.Errorf("calls %q, want ForwardAsync, Backward, ReadLoss per step", got)
	}
	cfg = smallConfig(t.TempDir(), 6)
	m = &asyncBigram{bigram: newBigram(t, b, 256, tensor.Float32, 1)}
	m.nanAt = 3
	_, err = Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
	testutil.ErrorContains(t, err, "loss is NaN at step 3")
}

// sleepyModel makes every Forward take at least nap.
type sleepyModel struct {
	Model
	nap time.Duration
}

func (m sleepyModel) Forward(ids, targets *tensor.Tensor) (float64, error) {
	time.Sleep(m.nap)
	return m.Model.Forward(ids, targets)
}

// TestRunStepTimeOnHost: on a backend that works on the host (the CPU), a
// step's recorded time covers its own work, at validation and checkpoint
// steps too (read back at once, right after the step before): with every
// forward sleeping 20 ms, no step may claim more than tokens / 20 ms. (It
// bounds the accounting from below, so a slow machine cannot fail it.)
func TestRunStepTimeOnHost(t *testing.T) {
	cfg := smallConfig(t.TempDir(), 9)
	cfg.CheckpointEvery = 4
	b := newCPU()
	const nap = 20 * time.Millisecond
	val := mustLoader(t, corpus(500), LoaderConfig{Batch: 2, Seq: 16, Vocab: 256, Sequential: true})
	var steps []StepMetrics
	_, err := Run(context.Background(), b, sleepyModel{newBigram(t, b, 256, tensor.Float32, 1), nap}, loaderFor(t, cfg), cfg,
		WithOutput(&bytes.Buffer{}), WithValidation(val, 3, 1), WithStepHook(func(s StepMetrics) { steps = append(steps, s) }))
	if err != nil {
		t.Fatal(err)
	}
	most := float64(cfg.Batch*cfg.Seq) / nap.Seconds()
	if len(steps) != cfg.Steps {
		t.Fatalf("%d steps recorded, want %d", len(steps), cfg.Steps)
	}
	for _, s := range steps {
		if s.TokensPerSec > most {
			t.Errorf("step %d: %.0f tokens/s, more than the %.0f its 20 ms forward allows", s.Step, s.TokensPerSec, most)
		}
	}
}
