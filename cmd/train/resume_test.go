package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/train"
)

// readConfig reads a run's config.json.
func readConfig(t *testing.T, out string) Config {
	t.Helper()
	var c Config
	b, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rewind points every rank dir of out (or out itself) at its checkpoint of
// step, as if the run had stopped after it.
func rewind(t *testing.T, out string, ranks, step int) {
	t.Helper()
	for r := range ranks {
		dir := out
		if ranks > 1 {
			dir = train.RankDir(out, r)
		}
		if err := os.WriteFile(filepath.Join(dir, train.LatestFile), []byte(train.CheckpointName(step)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResumeKeepsSettings: a run with settings other than the preset's
// (data file, seed, learning rate, batch, warm-up, clipping, β2, no
// held-out split), stopped after step 5 and resumed with nothing but
// --resume, continues with them: the losses of steps 6 to 10 are the
// uninterrupted run's bit for bit, the start says so, and config.json
// keeps the settings and records the resume. A second resume, in the
// decay, that gives --lr and --steps uses them, names both (with the
// min_lr that follows a lower lr), re-plans the schedule from the resumed
// step, and adds itself to the history. A third, after the decay ended,
// that gives --lr is refused (no step would use it) and changes nothing;
// --min-lr sets the rate of the steps after the decay.
func TestResumeKeepsSettings(t *testing.T) {
	data := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(data, []byte(strings.Repeat("the settings of a run are the run's own; ", 200)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	first := small(out, "--steps", "10", "--checkpoint-every", "5", "--data", data, "--seed", "4", "--lr", "0.01",
		"--min-lr", "0.004", "--batch", "2", "--micro-batch", "1", "--warmup", "3", "--grad-clip", "0.5", "--beta2", "0.99", "--val-fraction", "0")
	if err := run(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	want := metrics(t, out)
	rewind(t, out, 1, 5)
	log := mustRun(t, "--resume", out)
	if !strings.Contains(log, "resume: from "+filepath.Join(out, "step-000005")+" at step 5 (of 10 planned), with the checkpoint's settings") {
		t.Fatalf("the start of the resume does not say it keeps the settings:\n%s", log)
	}
	got := metrics(t, out)
	if len(got) != 10 {
		t.Fatalf("%d records after the resume, want 10", len(got))
	}
	for i := 5; i < 10; i++ {
		if got[i].Loss != want[i].Loss || got[i].LR != want[i].LR {
			t.Fatalf("step %d after the resume: loss %v lr %v, the uninterrupted run's %v, %v", i+1, got[i].Loss, got[i].LR, want[i].Loss, want[i].LR)
		}
	}
	c := readConfig(t, out)
	tc := c.Train
	if c.Data != data || tc.Seed != 4 || tc.LR != 0.01 || tc.Batch != 2 || tc.MicroBatch != 1 || tc.Warmup != 3 || tc.GradClip != 0.5 || tc.Beta2 != 0.99 || tc.ValFraction != 0 || tc.Steps != 10 {
		t.Fatalf("config.json after the resume: data %q, train %+v", c.Data, tc)
	}
	if len(c.Resumed) != 1 || c.Resumed[0].Step != 5 || len(c.Resumed[0].Changes) != 0 {
		t.Fatalf("config.json's resumed: %+v, want the resume at step 5 with no changes", c.Resumed)
	}

	// Resumed in the decay with --lr and --steps: both used and named, with
	// the min_lr that follows a lower lr, and the rest of the decay spread
	// over the new length; the history is the step-5 checkpoint's and this
	// resume.
	rewind(t, out, 1, 5)
	log = mustRun(t, "--resume", out, "--lr", "0.002", "--steps", "14")
	for _, w := range []string{"lr 0.01 → 0.002 (given)", "min-lr 0.004 → 0.0002 (a tenth of the lr given", "steps 10 → 14 (given)",
		"schedule: the run's length changes from 10 to 14 steps at step 5: the rest of the decay"} {
		if !strings.Contains(log, w) {
			t.Fatalf("the start of the second resume does not say %q:\n%s", w, log)
		}
	}
	c = readConfig(t, out)
	if c.Train.LR != 0.002 || c.Train.MinLR != 0.0002 || c.Train.Steps != 14 || c.Train.Batch != 2 || len(c.Resumed) != 1 || c.Resumed[0].Step != 5 || len(c.Resumed[0].Changes) != 3 {
		t.Fatalf("config.json after the second resume: train %+v, resumed %+v", c.Train, c.Resumed)
	}
	got = metrics(t, out)
	if len(got) != 14 || math.Abs(got[13].LR-0.0002) > 1e-12 || !(got[5].LR > got[12].LR) {
		t.Fatalf("after the second resume: %d records, lr %v at step 6 and %v at 13, last %v: want 14, decaying to min_lr 0.0002", len(got), got[5].LR, got[12].LR, got[len(got)-1].LR)
	}

	// Resumed after the decay ended: every further step runs at min_lr, so
	// a --lr given would change none; it is refused, naming what to give
	// instead, and the run's files stay as they were.
	cfgBefore, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	msg, code := runMain(t, "--resume", out, "--lr", "0.003", "--steps", "16")
	if code != 1 {
		t.Fatalf("--lr on a resume after the decay ended: exit %d, want 1:\n%s", code, msg)
	}
	for _, w := range []string{"--lr 0.003", "step 14", "min_lr 0.0002", "steps 15 to 16", "the run's is 0.002", "--min-lr", "larger --steps"} {
		if !strings.Contains(msg, w) {
			t.Fatalf("the refusal of --lr after the decay does not say %q:\n%s", w, msg)
		}
	}
	if after, err := os.ReadFile(filepath.Join(out, "config.json")); err != nil || string(after) != string(cfgBefore) {
		t.Fatalf("config.json changed by the refused resume (%v)", err)
	}
	if got := metrics(t, out); len(got) != 14 {
		t.Fatalf("%d records after the refused resume, want the 14 of before", len(got))
	}
	// A --warmup that changes no step's learning rate (the run's warm-up of
	// 3 steps ended long before step 14) is refused the same way.
	msg, code = runMain(t, "--resume", out, "--warmup", "2", "--steps", "16")
	if code != 1 {
		t.Fatalf("--warmup 2 on a resume at step 14: exit %d, want 1:\n%s", code, msg)
	}
	for _, w := range []string{"--warmup 2", "step 14", "steps 15 to 16", "warm-up of 3 steps (the run's)", "would change none of them"} {
		if !strings.Contains(msg, w) {
			t.Fatalf("the refusal of --warmup does not say %q:\n%s", w, msg)
		}
	}
	if after, err := os.ReadFile(filepath.Join(out, "config.json")); err != nil || string(after) != string(cfgBefore) {
		t.Fatalf("config.json changed by the refused resume (%v)", err)
	}
	// --min-lr is what sets those steps' learning rate.
	log = mustRun(t, "--resume", out, "--min-lr", "0.001", "--steps", "16")
	for _, w := range []string{"min-lr 0.0002 → 0.001 (given)", "steps 14 → 16 (given)",
		"schedule: the run's length changes from 14 to 16 steps at step 14, after its decay ended: the learning rate stays at min_lr 0.001"} {
		if !strings.Contains(log, w) {
			t.Fatalf("the start of the resume after the decay does not say %q:\n%s", w, log)
		}
	}
	if got := metrics(t, out); len(got) != 16 || got[14].LR != 0.001 || got[15].LR != 0.001 {
		t.Fatalf("after the resume with --min-lr: %d records, last lr %v, want 16 at min_lr 0.001", len(got), got[len(got)-1].LR)
	}
	if c = readConfig(t, out); len(c.Resumed) != 2 || c.Resumed[1].Step != 14 || len(c.Resumed[1].Changes) != 2 {
		t.Fatalf("config.json's resumed after the resume with --min-lr: %+v, want the resumes at steps 5 and 14", c.Resumed)
	}
}
