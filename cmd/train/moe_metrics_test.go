package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/asynctp/asynctp/hf"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/train"
)

// syncGPT hides layers.GPT's ForwardAsync and LossAsync: train.Run then
// reads each step's loss (and with it the aux losses) at once, the
// synchronous path.
type syncGPT struct{ m *layers.GPT }

func (s syncGPT) Params() *layers.ParamSet { return s.m.Params() }
func (s syncGPT) Forward(ids, targets *tensor.Tensor) (float64, error) {
	return s.m.Forward(ids, targets)
}
func (s syncGPT) Backward() error          { return s.m.Backward() }
func (s syncGPT) ZeroGrad()                { s.m.ZeroGrad() }
func (s syncGPT) FLOPsPerToken() float64   { return s.m.FLOPsPerToken() }
func (s syncGPT) AuxLoss() float64         { return s.m.AuxLoss() }
func (s syncGPT) Config() layers.GPTConfig { return s.m.Config() }

// TestMoEMetricsLateMatchSync: a tiny-moe run's metrics.jsonl, whose aux
// loss and router statistics are read one step late with the loss
// (routerMetrics through train.WithLateExtraMetrics), holds for every step
// bit for bit the loss, aux loss, gradient norm, tokens per expert and
// drops of the synchronous path — the loss read right after each step's
// backward, the aux loss and statistics taken from the model at once —
// on the same model, data and weights.
func TestMoEMetricsLateMatchSync(t *testing.T) {
	dir := t.TempDir()
	args := func(out string) []string {
		return []string{"--model", "tiny-moe", "--steps", "4", "--warmup", "0", "--val-fraction", "0", "--log-every", "100",
			"--capacity-factor", "1", "--device", "cpu", "--out", out}
	}
	lateOut, syncOut := filepath.Join(dir, "late"), filepath.Join(dir, "sync")
	if err := run(context.Background(), args(lateOut)); err != nil {
		t.Fatal(err)
	}
	late := metrics(t, lateOut)

	// The reference: the single-process run of run(), with the model's
	// loss and statistics read synchronously.
	_, org, err := startedBy()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfigIn(args(syncOut), org)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepare(&cfg, org); err != nil {
		t.Fatal(err)
	}
	b, dt, _, err := openBackend(cfg.Device, cfg.GroupedGEMM)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := openDataset(cfg)
	if err != nil {
		t.Fatal(err)
	}
	data, more, err := dataAndOptions(cfg, ds, false)
	if err != nil {
		t.Fatal(err)
	}
	model, err := layers.NewGPT(b, cfg.Model, dt)
	if err != nil {
		t.Fatal(err)
	}
	if err := initWeights(cfg, b, model.Params(), hf.Single); err != nil {
		t.Fatal(err)
	}
	syncMetrics := func(int) map[string]any {
		var perExpert [][]int
		dropped := 0
		for _, s := range model.RouterStats() {
			perExpert = append(perExpert, s.TokensPerExpert)
			dropped += s.Dropped
		}
		return map[string]any{"aux_loss": model.AuxLoss(), "tokens_per_expert": perExpert, "dropped": dropped}
	}
	opts := append(more, train.WithModelConfig(model.Config()), train.WithOutput(io.Discard), train.WithExtraMetrics(syncMetrics))
	if _, err := train.Run(context.Background(), b, syncGPT{model}, data, cfg.Train, opts...); err != nil {
		t.Fatal(err)
	}
	want := metrics(t, syncOut)

	if len(late) != 4 || len(want) != 4 {
		t.Fatalf("%d and %d records, want 4", len(late), len(want))
	}
	same := func(a, b any) bool {
		x, ok1 := a.(float64)
		y, ok2 := b.(float64)
		return ok1 && ok2 && math.Float64bits(x) == math.Float64bits(y)
	}
	dropped := 0.0
	for i, w := range want {
		g := late[i]
		if g.Step != w.Step || !same(g.Loss, w.Loss) || !same(g.GradNorm, w.GradNorm) || !same(g.Extra["aux_loss"], w.Extra["aux_loss"]) ||
			!reflect.DeepEqual(g.Extra["tokens_per_expert"], w.Extra["tokens_per_expert"]) || !same(g.Extra["dropped"], w.Extra["dropped"]) {
			t.Errorf("record %d: step %d loss %v grad_norm %v aux %v per expert %v dropped %v; synchronous: step %d loss %v grad_norm %v aux %v per expert %v dropped %v",
				i, g.Step, g.Loss, g.GradNorm, g.Extra["aux_loss"], g.Extra["tokens_per_expert"], g.Extra["dropped"],
				w.Step, w.Loss, w.GradNorm, w.Extra["aux_loss"], w.Extra["tokens_per_expert"], w.Extra["dropped"])
		}
		if d, ok := w.Extra["dropped"].(float64); ok {
			dropped += d
		}
		if i > 0 && fmt.Sprint(w.Extra["tokens_per_expert"]) == fmt.Sprint(want[i-1].Extra["tokens_per_expert"]) {
			t.Errorf("steps %d and %d route alike (%v): the check cannot tell a step's statistics from the one before's", i, i+1, w.Extra["tokens_per_expert"])
		}
	}
	if dropped == 0 {
		t.Errorf("no token dropped in %d steps at capacity factor 1: the drops are not checked", len(want))
	}
}
