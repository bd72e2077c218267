package train

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// cancelAt is a model that cancels the run's context when the forward of
// its call-th Forward starts, so the backend's ops see the stop in the
// middle of the step.
type cancelAt struct {
	*layers.GPT
	cancel      func()
	call, calls int
}

func (m *cancelAt) Forward(ids, targets *tensor.Tensor) (float64, error) {
	m.calls++
	if m.calls == m.call {
		m.cancel()
	}
	return m.GPT.Forward(ids, targets)
}

// ForwardAsync is the loop's forward when the model has one (AsyncLoss).
func (m *cancelAt) ForwardAsync(ids, targets *tensor.Tensor) error {
	m.calls++
	if m.calls == m.call {
		m.cancel()
	}
	return m.GPT.ForwardAsync(ids, targets)
}

// ForwardBackward is the loop's step when the model has one (MicroBatcher).
func (m *cancelAt) ForwardBackward(ids, targets *tensor.Tensor) error {
	m.calls++
	if m.calls == m.call {
		m.cancel()
	}
	return m.GPT.ForwardBackward(ids, targets)
}

func newTinyGPT(t testing.TB, b tensor.Backend) *layers.GPT {
	m, err := layers.NewGPT(b, layers.GPTConfig{Layers: 1, Dim: 16, Heads: 2, Vocab: 256, Seq: 16, Seed: 5}, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A step stopped in the middle (WithInterruptibleSteps) is dropped: the
// state after the step before is checkpointed, and resuming from it gives
// the uninterrupted run's losses and parameters exactly.
func TestInterruptedStepIsDroppedAndResumable(t *testing.T) {
	const steps = 6
	full, fullParams := runSteps(t, func(t testing.TB, b tensor.Backend) Model { return newTinyGPT(t, b) }, smallConfig(t.TempDir(), steps))

	out := t.TempDir()
	cfg := smallConfig(out, steps)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := newCPU()
	m := &cancelAt{GPT: newTinyGPT(t, b), cancel: cancel, call: 4}
	res, err := Run(ctx, b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}), WithInterruptibleSteps())
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "stopped in step 4") {
		t.Fatalf("interrupted run: %v, want a stop in step 4 wrapping context.Canceled", err)
	}
	if res.Step != 3 || filepath.Base(res.LastCheckpoint) != CheckpointName(3) {
		t.Fatalf("interrupted run: step %d, checkpoint %s; want step 3 and its checkpoint", res.Step, res.LastCheckpoint)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("the backend still holds %v", err)
	}
	resumed := smallConfig(out, steps)
	resumed.Resume = out
	res2, params2 := runSteps(t, func(t testing.TB, b tensor.Backend) Model { return newTinyGPT(t, b) }, resumed)
	if res2.StartStep != 3 || !reflect.DeepEqual(append(res.Losses, res2.Losses...), full.Losses) {
		t.Fatalf("losses %v then %v (resumed from %d), want %v", res.Losses, res2.Losses, res2.StartStep, full.Losses)
	}
	if !reflect.DeepEqual(params2, fullParams) {
		t.Fatal("parameters after the resume differ from the uninterrupted run's")
	}
	// Without the option the same stop waits for the end of the step.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	b2 := newCPU()
	m2 := &cancelAt{GPT: newTinyGPT(t, b2), cancel: cancel2, call: 4}
	res3, err := Run(ctx2, b2, m2, loaderFor(t, cfg), smallConfig(t.TempDir(), steps), WithOutput(&bytes.Buffer{}))
	if !errors.Is(err, context.Canceled) || res3.Step != 4 {
		t.Fatalf("without WithInterruptibleSteps: step %d, %v; want the end of step 4", res3.Step, err)
	}
}

// A killed run's leftovers are tidied; a checkpoint moved aside for a
// replacement that never came is put back; files are 0644 and dirs 0755
// under umask 022.
func TestCleanStaleAndModes(t *testing.T) {
	out := t.TempDir()
	for _, d := range []string{".tmp-step-000004-ab12", ".old-step-000002-.tmp-step-000002-cd34", ".old-step-000003-x"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(out, "step-000003"), 0o755)
	os.WriteFile(filepath.Join(out, ".tmp-latest-99"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(out, "notes.txt"), []byte("mine"), 0o644)
	if err := CleanStale(out); err != nil {
		t.Fatal(err)
	}
	var names []string
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"notes.txt", "step-000002", "step-000003"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("after CleanStale: %v, want %v", names, want)
	}

	cfg := smallConfig(t.TempDir(), 4)
	// What os.WriteFile and os.Mkdir give under this process's umask.
	ref := t.TempDir()
	os.WriteFile(filepath.Join(ref, "f"), nil, 0o644)
	os.Mkdir(filepath.Join(ref, "d"), 0o755)
	fileRef, _ := os.Stat(filepath.Join(ref, "f"))
	dirRef, _ := os.Stat(filepath.Join(ref, "d"))
	runSteps(t, func(t testing.TB, b tensor.Backend) Model { return newTinyGPT(t, b) }, cfg)
	for _, f := range []string{LatestFile, MetricsFile, PlotFile, "step-000004", "step-000004/" + StateFile} {
		fi, err := os.Stat(filepath.Join(cfg.OutDir, f))
		if err != nil {
			t.Fatal(err)
		}
		want := fileRef.Mode().Perm()
		if fi.IsDir() {
			want = dirRef.Mode().Perm()
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v (0644 or 0755 less the umask)", f, got, want)
		}
	}
}
