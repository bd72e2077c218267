package train

import (
	"bytes"
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
)

// BenchmarkCheckpointCost is what a checkpoint costs the training loop, on
// a GPT of 3.4M parameters (a 41 MB checkpoint with its moments; batch
// 2 × 64):
//
//	step             one training step, the reference
//	save-sync        SaveCheckpoint: the host copy, the files written,
//	                 fsynced and renamed (a save that blocks the loop)
//	snapshot         TakeSnapshot into the last snapshot's tensors: what
//	                 blocks the loop when the writer runs in the background
//	step-while-write one training step while a background writer writes
//	                 checkpoints without pause: the writer's share of the
//	                 cores (on a 2-core machine, the rest of the cost)
func BenchmarkCheckpointCost(b *testing.B) {
	cfg := layers.GPTConfig{Layers: 4, Dim: 256, Heads: 4, Vocab: 256, Seq: 64, TiedEmbeddings: true, Seed: 1}
	be := newCPU()
	m, err := layers.NewGPT(be, cfg, tensor.Float32)
	if err != nil {
		b.Fatal(err)
	}
	opt, err := optim.NewAdamWWithConfig(be, m.Params(), optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8})
	if err != nil {
		b.Fatal(err)
	}
	tc := Config{Batch: 2, Seq: 64, Seed: 1}
	ld := loaderFor(b, tc)
	step := func(i int) {
		x, y, err := ld.Next()
		if err != nil {
			b.Fatal(err)
		}
		m.ZeroGrad()
		if _, err := m.Forward(x, y); err != nil {
			b.Fatal(err)
		}
		if err := m.Backward(); err != nil {
			b.Fatal(err)
		}
		if err := opt.Step(i+1, 1e-4, 1); err != nil {
			b.Fatal(err)
		}
	}
	st := State{Step: 1, TrainConfig: DefaultConfig()}
	b.Run("step", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			step(i)
		}
	})
	b.Run("save-sync", func(b *testing.B) {
		out := b.TempDir()
		for i := 0; i < b.N; i++ {
			if _, err := SaveCheckpoint(out, be, opt, st); err != nil {
				b.Fatal(err)
			}
		}
	})
	snap, err := TakeSnapshot(be, opt, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("snapshot", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if snap, err = TakeSnapshot(be, opt, snap); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("step-while-write", func(b *testing.B) {
		out := b.TempDir()
		var stop atomic.Bool
		done := make(chan error)
		go func() {
			for !stop.Load() {
				if _, err := snap.Write(out, st); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		for i := 0; i < b.N; i++ {
			step(i)
		}
		stop.Store(true)
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(out)
	})
}

// BenchmarkCheckpointLoop is the cost of checkpoints to a whole run, the
// model of BenchmarkCheckpointCost trained 42 steps three ways: no
// checkpoints, one every 4 steps written before the next step
// (synchronous, the reference), and one every 4 steps written in the
// background (Run's saves). ms/save-sync and ms/save-async are the time
// of steps 2 to 41 (10 saves) less the run's without checkpoints, per
// save.
func BenchmarkCheckpointLoop(b *testing.B) {
	cfg := layers.GPTConfig{Layers: 4, Dim: 256, Heads: 4, Vocab: 256, Seq: 64, TiedEmbeddings: true, Seed: 1}
	span := func(mode string) time.Duration {
		tc := Config{Steps: 42, Batch: 2, Seq: 64, LR: 1e-3, MinLR: 1e-4, Warmup: 2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClip: 1,
			Seed: 1, LogEvery: 100, OutDir: b.TempDir()}
		opts := []Option{WithOutput(&bytes.Buffer{})}
		if mode != "none" {
			tc.CheckpointEvery = 4
		}
		if mode == "sync" {
			opts = append(opts, func(o *runOptions) { o.syncSaves = true })
		}
		var from, to time.Time
		opts = append(opts, WithStepHook(func(m StepMetrics) {
			switch m.Step {
			case 2:
				from = time.Now()
			case 41:
				to = time.Now()
			}
		}))
		be := newCPU()
		m, err := layers.NewGPT(be, cfg, tensor.Float32)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Run(context.Background(), be, m, loaderFor(b, tc), tc, opts...); err != nil {
			b.Fatal(err)
		}
		return to.Sub(from)
	}
	var none, sync, async time.Duration
	for i := 0; i < b.N; i++ {
		n, s, a := span("none"), span("sync"), span("async")
		b.Logf("steps 2 to 41: %v without checkpoints, %v synchronous, %v asynchronous", n, s, a)
		none, sync, async = none+n, sync+s, async+a
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / 10 / float64(b.N) }
	b.ReportMetric(per(sync-none), "ms/save-sync")
	b.ReportMetric(per(async-none), "ms/save-async")
}
