package train

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// lagging wraps a backend as a device that runs behind the host: ReadAsync
// snapshots src with a copy queued in order (as the GPU's copy into pinned
// memory does) and reads the snapshot only at Wait, so a value read late is
// still the one of its step; blocking reads (Download, Sync, SumSquares)
// are counted by the embedded HostReads, the snapshots' reads are not.
type lagging struct {
	*testutil.HostReads
	waits int
}

func (l *lagging) ReadAsync(src *tensor.Tensor) tensor.HostRead {
	inner := l.HostReads.Backend
	snap := inner.Zeros(src.DType(), src.Shape()...)
	inner.Copy(snap, src)
	return lagRead{l, snap}
}

type lagRead struct {
	l    *lagging
	snap *tensor.Tensor
}

func (r lagRead) Wait() ([]float64, error) {
	r.l.waits++
	h := tensor.MustHost(tensor.Float64, r.snap.Shape()...)
	r.l.HostReads.Backend.Download(h, r.snap)
	return h.F64(), r.l.HostReads.Backend.Err()
}

// plainModel hides a model's AsyncLoss and LossReader: Run then takes the
// loss from Forward at once, the synchronous path of before.
type plainModel struct{ Model }

// TestRunNoHostReadsPerStep: a layers.GPT trained through Run reads nothing
// back to the host with a blocking read between its first and its last
// step (the loss and the gradient norm go through ReadAsync, two per step,
// read one step late), and the loss and gradient norm recorded for every
// step, in the result and in metrics.jsonl, are bit for bit those of the
// synchronous path.
func TestRunNoHostReadsPerStep(t *testing.T) {
	const steps = 8
	cfg := smallConfig("", steps)
	gcfg := layers.GPTConfig{Layers: 2, Dim: 16, Heads: 2, Vocab: 256, Seq: 16, FFN: 32, Seed: 4}
	run := func(b tensor.Backend, wrap func(Model) Model, hook func(StepMetrics)) (Result, []StepMetrics) {
		c := cfg
		c.OutDir = t.TempDir()
		m, err := layers.NewGPT(b, gcfg, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(context.Background(), b, wrap(m), loaderFor(t, c), c, WithOutput(&bytes.Buffer{}), WithStepHook(hook))
		if err != nil {
			t.Fatal(err)
		}
		recs, err := ReadMetrics(filepath.Join(c.OutDir, MetricsFile))
		if err != nil {
			t.Fatal(err)
		}
		return res, recs
	}
	lag := &lagging{HostReads: &testutil.HostReads{Backend: newCPU()}}
	counts := map[int]int{}
	async, asyncRecs := run(lag, func(m Model) Model { return m }, func(s StepMetrics) { counts[s.Step] = lag.Count() })
	sync, syncRecs := run(newCPU(), func(m Model) Model { return plainModel{m} }, func(StepMetrics) {})
	if n := counts[steps] - counts[1]; n != 0 {
		t.Errorf("%d blocking host reads between the hooks of steps 1 and %d, want 0 (counts %v)", n, steps, counts)
	}
	if lag.waits != 2*steps {
		t.Errorf("%d ReadAsync waits in %d steps, want 2 per step", lag.waits, steps)
	}
	if fmt.Sprint(async.Losses) != fmt.Sprint(sync.Losses) || len(async.Losses) != steps {
		t.Errorf("losses with the reads one step late %v, synchronous %v", async.Losses, sync.Losses)
	}
	if async.FinalLoss != sync.Losses[steps-1] {
		t.Errorf("final loss %v, want the last step's %v", async.FinalLoss, sync.Losses[steps-1])
	}
	if len(asyncRecs) != steps || len(syncRecs) != steps {
		t.Fatalf("metrics records: %d and %d, want %d", len(asyncRecs), len(syncRecs), steps)
	}
	for i, r := range asyncRecs {
		s := syncRecs[i]
		if r.Step != i+1 || math.Float64bits(r.Loss) != math.Float64bits(sync.Losses[i]) ||
			math.Float64bits(r.GradNorm) != math.Float64bits(s.GradNorm) || r.GradNorm <= 0 {
			t.Errorf("metrics record %d: step %d loss %v grad_norm %v, want step %d loss %v grad_norm %v", i, r.Step, r.Loss, r.GradNorm, i+1, sync.Losses[i], s.GradNorm)
		}
		// queue_ms: the host's time to queue the step, recorded only where
		// the steps run behind the host.
		if q, ok := r.Extra["queue_ms"].(float64); !ok || !(q > 0) {
			t.Errorf("metrics record %d: queue_ms %v (%T), want a time > 0 on a backend that runs behind the host", i, r.Extra["queue_ms"], r.Extra["queue_ms"])
		}
		if q, ok := s.Extra["queue_ms"]; ok {
			t.Errorf("metrics record %d of the synchronous run: queue_ms %v, want none (its step time is the queue time)", i, q)
		}
	}
}

// lateBigram is the bigram behind AsyncLoss and LossReader: its loss is
// read one step late.
type lateBigram struct{ *asyncBigram }

func (m *lateBigram) LossAsync() (func() (float64, error), error) {
	m.calls = append(m.calls, "LossAsync")
	l := m.loss
	return func() (float64, error) { return l, nil }, nil
}

// TestRunLateLossNaN: a NaN loss read one step late still stops the run
// naming its step, with the checkpoint before it as the last good one,
// and no checkpoint of the step queued behind it; the calls show step s+1
// queued before step s's loss is taken.
func TestRunLateLossNaN(t *testing.T) {
	out := t.TempDir()
	cfg := smallConfig(out, 10)
	cfg.CheckpointEvery = 2
	b := newCPU()
	m := &lateBigram{&asyncBigram{bigram: newBigram(t, b, 256, tensor.Float32, 1)}}
	m.nanAt = 3
	res, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}))
	good := filepath.Join(out, "step-000002")
	testutil.ErrorContains(t, err, "loss is NaN at step 3; last good checkpoint: "+good)
	if res.Step != 2 || res.LastCheckpoint != good || len(res.Losses) != 2 {
		t.Errorf("result: step %d, checkpoint %s, losses %v", res.Step, res.LastCheckpoint, res.Losses)
	}
	if _, err := os.Stat(filepath.Join(out, "step-000004")); !os.IsNotExist(err) {
		t.Errorf("step-000004 exists after the NaN of step 3 (%v)", err)
	}
	if l, _ := LatestCheckpoint(out); l != good {
		t.Errorf("latest = %s, want %s", l, good)
	}
	want := "ForwardAsync Backward LossAsync ForwardAsync Backward LossAsync"
	if got := fmt.Sprint(m.calls[:6]); got != "["+want+"]" {
		t.Errorf("calls %s, want %s", got, want)
	}
}
