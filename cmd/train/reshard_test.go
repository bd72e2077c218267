package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/train"
)

// TestReshardResume: a run of 8 steps at one layout, its checkpoint of
// step 4 resumed at another, gives the losses (and an MoE model's aux
// losses and tokens per expert: the router's state) of the run continued
// at its own layout, within 1e-6 relative at every step: TP 4 at TP 2 ×
// DP 2 and at one rank, one rank at TP 2 with sequence parallelism, an MoE
// model at EP 4 at EP 2 and at TP 2 × DP 2 × EP 2, TP 2 over tcp
// processes at DP 2 over processes; and with the distributed optimizer
// (its checkpoints hold each rank's runs of the state) on either side, over
// goroutines and tcp processes. The start names both layouts.
func TestReshardResume(t *testing.T) {
	for _, c := range []struct {
		name     string
		from, to []string
	}{
		{"tp4 at tp2 dp2", []string{"--tp", "4"}, []string{"--tp", "2", "--dp", "2"}},
		{"tp4 at one rank", []string{"--tp", "4"}, []string{"--tp", "1"}},
		{"one rank at tp2 sp", nil, []string{"--tp", "2", "--sequence-parallel"}},
		{"ep4 at ep2", append([]string{"--dp", "4", "--ep", "4"}, moe...), []string{"--ep", "2"}},
		{"ep4 at tp2 dp2 ep2", append([]string{"--dp", "4", "--ep", "4"}, moe...), []string{"--tp", "2", "--dp", "2", "--ep", "2"}},
		{"tp2 processes at dp2 processes", []string{"--nproc", "2", "--tp", "2"}, []string{"--nproc", "2", "--tp", "1", "--dp", "2"}},
		// The distributed optimizer's checkpoints (each rank its runs of
		// the state) and into it, on and off.
		{"tp4 at tp2 dp2 distopt", []string{"--tp", "4"}, []string{"--tp", "2", "--dp", "2", "--distributed-optimizer"}},
		{"tp2 dp2 distopt at tp4", []string{"--tp", "2", "--dp", "2", "--distributed-optimizer"}, []string{"--tp", "4", "--dp", "1", "--distributed-optimizer=false"}},
		{"ep4 distopt at ep2 distopt", append([]string{"--dp", "4", "--ep", "4", "--distributed-optimizer"}, moe...), []string{"--ep", "2"}},
		{"ep4 distopt at one rank", append([]string{"--dp", "4", "--ep", "4", "--distributed-optimizer"}, moe...), []string{"--dp", "1", "--ep", "1"}},
		{"dp4 distopt processes at dp2 processes", []string{"--nproc", "4", "--dp", "4", "--distributed-optimizer"}, []string{"--nproc", "2", "--dp", "2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := t.TempDir()
			if err := run(context.Background(), par(ref, append([]string{"--steps", "8", "--checkpoint-every", "4"}, c.from...)...)); err != nil {
				t.Fatal(err)
			}
			want := metrics(t, ref)
			ranks := 1
			if fi, err := os.Stat(train.RankDir(ref, 0)); err == nil && fi.IsDir() {
				ents, _ := filepath.Glob(filepath.Join(ref, "rank-*"))
				ranks = len(ents)
			}
			rewind(t, ref, ranks, 4)
			out := filepath.Join(t.TempDir(), "out")
			log := mustRun(t, par(out, append([]string{"--steps", "8", "--resume", ref}, c.to...)...)...)
			if !strings.Contains(log, "resharded") || !strings.Contains(log, "the checkpoint's layout") {
				t.Fatalf("the start of the resume does not name the layouts:\n%s", log)
			}
			sameRun(t, c.name, metrics(t, out), want[4:], 1e-6)
		})
	}
}

// TestResumeOlderFormat: the checkpoints of a run of several ranks written
// before they recorded their slices and ranks (format 1) resume at their
// own layout, continuing exactly, and are refused at another, naming both
// layouts.
func TestResumeOlderFormat(t *testing.T) {
	ref := trainRun(t, "--steps", "8", "--checkpoint-every", "4", "--tp", "2")
	want := metrics(t, ref)
	rewind(t, ref, 2, 4)
	for r := range 2 {
		p := filepath.Join(train.RankDir(ref, r), train.CheckpointName(4), train.StateFile)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Replace(string(b), `"format_version": 2`, `"format_version": 1`, 1)
		s = strings.Replace(s, `,
  "ranks": 2`, "", 1)
		if s == string(b) || strings.Contains(s, `"ranks"`) {
			t.Fatalf("state.json not turned into format 1:\n%s", s)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "out")
	msg, code := runMain(t, par(out, "--steps", "8", "--resume", ref, "--tp", "1", "--dp", "2")...)
	if code == 0 || !strings.Contains(msg, "record no slices: they resume at that layout only") || !strings.Contains(msg, "tp=2 dp=1") {
		t.Fatalf("a resume of format-1 checkpoints at another layout: exit %d:\n%s", code, msg)
	}
	got := trainRun(t, "--steps", "8", "--resume", ref)
	for i, m := range metrics(t, got) {
		if w := want[4+i]; m.Step != w.Step || m.Loss != w.Loss {
			t.Fatalf("format-1 checkpoints at their own layout: step %d loss %v, want step %d loss %v bit for bit", m.Step, m.Loss, w.Step, w.Loss)
		}
	}
}

// TestReshardInPlace: a run resumed in its own out dir at fewer ranks,
// then at its first layout again, takes each time the checkpoints of the
// last run (the ranks they record), not the older ones the rank dirs of
// the first layout still hold, and records every step once.
func TestReshardInPlace(t *testing.T) {
	out := trainRun(t, "--steps", "4", "--tp", "4")
	for _, c := range []struct {
		steps string
		args  []string
	}{{"8", []string{"--tp", "2"}}, {"12", []string{"--tp", "4"}}} {
		if err := run(context.Background(), par(out, append([]string{"--steps", c.steps, "--resume", out}, c.args...)...)); err != nil {
			t.Fatalf("resume in place at %v: %v", c.args, err)
		}
	}
	if got := steps(t, out); len(got) != 12 || got[11] != 12 {
		t.Fatalf("metrics steps %v, want 1 to 12", got)
	}
	st, err := train.ReadState(filepath.Join(train.RankDir(out, 3), train.CheckpointName(12), train.StateFile))
	if err != nil || st.Ranks != 4 {
		t.Fatalf("rank 3's checkpoint of step 12: %+v, %v", st, err)
	}
}

// TestDistributedOptimizerRuns: --distributed-optimizer gives the losses
// of the replicated optimizer within 1e-6 relative at every step, at TP 2
// × DP 2 over goroutines and at DP 2 over tcp processes; its checkpoints
// resume at their own layout exactly; it is refused where nothing is
// replicated.
func TestDistributedOptimizerRuns(t *testing.T) {
	for _, l := range [][]string{{"--tp", "2", "--dp", "2"}, {"--nproc", "2", "--dp", "2"}} {
		want := metrics(t, trainRun(t, append([]string{"--steps", "8"}, l...)...))
		got := metrics(t, trainRun(t, append([]string{"--steps", "8", "--distributed-optimizer"}, l...)...))
		sameRun(t, strings.Join(l, " ")+" --distributed-optimizer", got, want, 1e-6)
	}
	// A resume at the same layout reads each rank's own runs: exactly the run.
	ref := trainRun(t, "--steps", "8", "--checkpoint-every", "4", "--dp", "4", "--distributed-optimizer")
	want := metrics(t, ref)
	rewind(t, ref, 4, 4)
	for i, m := range metrics(t, trainRun(t, "--steps", "8", "--resume", ref)) {
		if w := want[4+i]; m.Step != w.Step || m.Loss != w.Loss {
			t.Fatalf("resumed at the same layout: step %d loss %v, want step %d loss %v bit for bit", m.Step, m.Loss, w.Step, w.Loss)
		}
	}
	msg, code := runMain(t, par(filepath.Join(t.TempDir(), "o"), "--tp", "2", "--distributed-optimizer")...)
	if code == 0 || !strings.Contains(msg, "--distributed-optimizer true cannot take effect") {
		t.Fatalf("--distributed-optimizer with one replica: exit %d:\n%s", code, msg)
	}
}

// TestReshardInPlaceOneRank: a run of 2 ranks resumed in its own out dir
// at one rank writes its checkpoints beside the rank dirs; a resume of
// that out dir then continues from the one rank's newest step (not the
// older one the rank dirs hold), at its layout, and export reads that same
// step. Every step is recorded once.
func TestReshardInPlaceOneRank(t *testing.T) {
	out := trainRun(t, "--steps", "2", "--tp", "2")
	if err := run(context.Background(), par(out, "--steps", "4", "--tp", "1", "--resume", out)); err != nil {
		t.Fatalf("resume in place at one rank: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, train.CheckpointName(4), train.StateFile)); err != nil {
		t.Fatalf("the one-rank resume's checkpoint: %v", err)
	}
	o := mustRun(t, "export", "--from", out, "--out", filepath.Join(t.TempDir(), "hf"))
	if !strings.Contains(o, "at step 4 (1 checkpoint files)") {
		t.Fatalf("export after the one-rank resume:\n%s", o)
	}
	msg := mustRun(t, par(out, "--steps", "6", "--resume", out)...)
	if !strings.Contains(msg, "at step 4") || strings.Contains(msg, "at step 2") {
		t.Fatalf("the second resume in place, expected from step 4:\n%s", msg)
	}
	if _, err := os.Stat(filepath.Join(out, train.CheckpointName(6), train.StateFile)); err != nil {
		t.Fatalf("the second resume, at the one-rank layout, wrote no %s beside the rank dirs: %v", train.CheckpointName(6), err)
	}
	if got := steps(t, out); !slices.Equal(got, []int{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("metrics steps %v, want 1 to 6 once each", got)
	}
}
