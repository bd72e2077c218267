package train

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// TestAsyncSave: a checkpoint is written while training goes on (the
// writer of step 2 waits, in its hook, until the loop has recorded step
// 4: a save that blocked the loop would never let it); one save at a time
// (the save of step 4 waits for the write of step 2); while a write is in
// flight the previous checkpoint is the latest and whole; pruning
// (KeepCheckpoints 1) removes completed checkpoints only; the run's
// losses and final checkpoint are those of a run that saves each
// checkpoint before going on (syncSaves), bit for bit.
func TestAsyncSave(t *testing.T) {
	mk := func(t testing.TB, b tensor.Backend) Model { return newBigram(t, b, 256, tensor.Float32, 1) }
	cfg := smallConfig(t.TempDir(), 8)
	cfg.CheckpointEvery, cfg.KeepCheckpoints = 2, 1
	recorded := make(chan int, 16)
	var inFlight, most atomic.Int32
	var problems []string
	hook := func(step int) {
		if n := inFlight.Add(1); n > most.Load() {
			most.Store(n)
		}
		defer inFlight.Add(-1)
		latest, err := LatestCheckpoint(cfg.OutDir)
		switch {
		case step == 2 && err == nil:
			problems = append(problems, "a latest checkpoint before the first one was renamed: "+latest)
		case step > 2 && (err != nil || filepath.Base(latest) != CheckpointName(step-2)):
			problems = append(problems, "while step "+CheckpointName(step)+" is written the latest is "+latest)
		}
		if step > 2 {
			if _, err := ReadState(filepath.Join(latest, StateFile)); err != nil {
				problems = append(problems, "the latest checkpoint is not whole while the next is written: "+err.Error())
			}
		}
		if step != 2 {
			return
		}
		deadline := time.After(20 * time.Second)
		for {
			select {
			case s := <-recorded:
				if s >= 4 {
					return
				}
			case <-deadline:
				problems = append(problems, "the loop did not reach step 4 while step 2 was written")
				return
			}
		}
	}
	var log bytes.Buffer
	res, params := runSteps(t, mk, cfg, WithSaveHook(hook), WithOutput(&log), WithStepHook(func(m StepMetrics) { recorded <- m.Step }))
	for _, p := range problems {
		t.Error(p)
	}
	if most.Load() != 1 {
		t.Errorf("%d saves written at once, want one at a time", most.Load())
	}
	cks, _ := ListCheckpoints(cfg.OutDir)
	if len(cks) != 1 || filepath.Base(cks[0]) != CheckpointName(8) || res.LastCheckpoint != cks[0] {
		t.Errorf("checkpoints after the run %v (last %s), want step-000008 alone", cks, res.LastCheckpoint)
	}
	for _, s := range []int{2, 4, 6, 8} {
		if !strings.Contains(log.String(), "checkpoint "+filepath.Join(cfg.OutDir, CheckpointName(s))) {
			t.Errorf("the log does not name the checkpoint of step %d:\n%s", s, log.String())
		}
	}

	sync := smallConfig(t.TempDir(), 8)
	sync.CheckpointEvery = 2
	want, wantParams := runSteps(t, mk, sync, func(o *runOptions) { o.syncSaves = true })
	for i := range want.Losses {
		if res.Losses[i] != want.Losses[i] {
			t.Fatalf("step %d: loss %v with asynchronous saves, %v with synchronous ones", i+1, res.Losses[i], want.Losses[i])
		}
	}
	for i := range params {
		if params[i] != wantParams[i] {
			t.Fatalf("final parameter %d differs between asynchronous and synchronous saves", i)
		}
	}
	for _, f := range []string{ModelFile, OptimFile} {
		a, errA := os.ReadFile(filepath.Join(cfg.OutDir, CheckpointName(8), f))
		b, errB := os.ReadFile(filepath.Join(sync.OutDir, CheckpointName(8), f))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("%s of step 8 differs between asynchronous and synchronous saves (%v, %v)", f, errA, errB)
		}
	}
}

// TestAsyncSaveFails: a background write that fails (its directory taken
// away before the rename) stops the run with the error, naming the
// checkpoint, and the checkpoint before it stays the latest.
func TestAsyncSaveFails(t *testing.T) {
	mk := func(t testing.TB, b tensor.Backend) Model { return newBigram(t, b, 256, tensor.Float32, 1) }
	cfg := smallConfig(t.TempDir(), 8)
	cfg.CheckpointEvery = 2
	hook := func(step int) {
		if step == 4 {
			tmp, _ := filepath.Glob(filepath.Join(cfg.OutDir, ".tmp-"+CheckpointName(4)+"-*"))
			for _, d := range tmp {
				os.RemoveAll(d)
			}
		}
	}
	b := newCPU()
	res, err := Run(context.Background(), b, mk(t, b), loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}), WithSaveHook(hook))
	if err == nil || !strings.Contains(err.Error(), CheckpointName(4)) {
		t.Fatalf("run with a failed save: %v, want an error naming %s", err, CheckpointName(4))
	}
	if latest, _ := LatestCheckpoint(cfg.OutDir); filepath.Base(latest) != CheckpointName(2) || res.LastCheckpoint != latest {
		t.Errorf("latest %s, result's last checkpoint %s; want step-000002", latest, res.LastCheckpoint)
	}
	if res.Step > 6 {
		t.Errorf("the run went on to step %d after the failed save of step 4", res.Step)
	}
}
