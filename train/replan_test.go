package train

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/optim"
	"github.com/asynctp/asynctp/tensor"
)

// TestResumeReplansTheSchedule: a run planned for 10 steps, resumed from
// its step-5 checkpoint for 20, takes for steps 6 to 20 the rest of its
// cosine decay spread over them (the learning rates of metrics.jsonl
// against the decay written out here), says so in a line, records the
// replan in its checkpoints, and a second resume of it to the same length
// from step 12 gives its learning rates and losses bit for bit; resumed
// to its planned length a run keeps its schedule (the test of
// checkResumeIdentical).
func TestResumeReplansTheSchedule(t *testing.T) {
	mk := func(t testing.TB, b tensor.Backend) Model { return newBigram(t, b, 256, tensor.Float32, 1) }
	planned := t.TempDir()
	cfg := smallConfig(planned, 10)
	cfg.CheckpointEvery = 5
	runSteps(t, mk, cfg)

	longer := t.TempDir()
	cfg = smallConfig(longer, 20)
	cfg.CheckpointEvery, cfg.Resume = 4, filepath.Join(planned, CheckpointName(5))
	var log bytes.Buffer
	runSteps(t, mk, cfg, WithOutput(&log))
	if want := "schedule: the run's length changes from 10 to 20 steps at step 5: the rest of the decay"; !strings.Contains(log.String(), want) {
		t.Fatalf("the log does not say %q:\n%s", want, log.String())
	}
	recs, err := ReadMetrics(filepath.Join(longer, MetricsFile))
	if err != nil || len(recs) != 15 {
		t.Fatalf("metrics of the resumed run: %d records, %v", len(recs), err)
	}
	c := smallConfig("", 10)
	pk := float64(5-c.Warmup) / float64(10-c.Warmup) // the decay's progress at the resumed step
	for _, r := range recs {
		p := pk + (1-pk)*float64(r.Step-5)/float64(20-5)
		want := c.MinLR + (c.LR-c.MinLR)*(1+math.Cos(math.Pi*p))/2
		if math.Abs(r.LR-want) > 1e-12*want {
			t.Fatalf("step %d: lr %v, want %v (the rest of the decay over steps 6 to 20)", r.Step, r.LR, want)
		}
	}
	st, err := ReadState(filepath.Join(longer, CheckpointName(12), StateFile))
	if err != nil || len(st.Replans) != 1 || st.Replans[0] != (optim.Replan{At: 5, Steps: 10}) || st.TrainConfig.Steps != 20 {
		t.Fatalf("state of step 12: replans %+v, steps %d, %v", st.Replans, st.TrainConfig.Steps, err)
	}

	again := t.TempDir()
	cfg = smallConfig(again, 20)
	cfg.Resume = filepath.Join(longer, CheckpointName(12))
	log.Reset()
	runSteps(t, mk, cfg, WithOutput(&log))
	if strings.Contains(log.String(), "schedule:") {
		t.Errorf("a resume to the planned length reports a change of schedule:\n%s", log.String())
	}
	got, err := ReadMetrics(filepath.Join(again, MetricsFile))
	if err != nil || len(got) != 8 {
		t.Fatalf("metrics of the second resume: %d records, %v", len(got), err)
	}
	for i, r := range got {
		w := recs[7+i]
		if r.Step != w.Step || r.LR != w.LR || r.Loss != w.Loss {
			t.Fatalf("second resume, step %d: lr %v loss %v, the first resume's step %d: lr %v loss %v", r.Step, r.LR, r.Loss, w.Step, w.LR, w.Loss)
		}
	}
}
