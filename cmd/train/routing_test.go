package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/train/routing"
)

// routingRun trains tiny-moe for 3 steps on the CPU with --dump-routing
// and returns the dump's directory.
func routingRun(t *testing.T, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	dump := filepath.Join(dir, "routing")
	args := append([]string{"--model", "tiny-moe", "--steps", "3", "--warmup", "0", "--val-fraction", "0", "--log-every", "100",
		"--device", "cpu", "--out", filepath.Join(dir, "out"), "--dump-routing", dump}, extra...)
	if err := run(context.Background(), args); err != nil {
		t.Fatalf("%v: %v", extra, err)
	}
	return dump
}

func diffDirs(t *testing.T, a, b string) []routing.StepDiff {
	t.Helper()
	ra, err := routing.Read(a)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := routing.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	steps, only, err := routing.Diff(ra, rb)
	if err != nil {
		t.Fatal(err)
	}
	if len(only) != 0 || len(steps) != 3 {
		t.Fatalf("%d common steps (%v), want steps 1-3 in both", len(steps), only)
	}
	return steps
}

// The routing dump in the global token order: one process and DP 2 × EP 2
// (goroutine ranks, each routing its own half of the batch) route every
// token of every step and MoE layer to the same top-k set (the CPU's f32
// losses agree within rounding, far from any tie here); a run with another
// learning rate routes step 1 (the initial weights) the same and the later
// steps differently, and routing-diff names step 2 as the first
// difference.
func TestRoutingDumpAcrossLayouts(t *testing.T) {
	single := routingRun(t)
	epdp := routingRun(t, "--dp", "2", "--ep", "2")
	for _, name := range []string{"rank-00000.routing", "rank-00001.routing"} {
		if _, err := os.Stat(filepath.Join(epdp, name)); err != nil {
			t.Fatalf("DP 2 × EP 2: %v", err)
		}
	}
	for _, d := range diffDirs(t, single, epdp) {
		if d.Diffs != 0 || d.Tokens != 2*512 {
			t.Errorf("step %d: %d of %d token-layers differ, want 0 of 1024 (%s)", d.Step, d.Diffs, d.Tokens, d.First)
		}
	}
	if err := runRoutingDiff([]string{"--quiet", single, epdp}); err != nil {
		t.Errorf("routing-diff of equal dumps: %v", err)
	}

	other := routingRun(t, "--lr", "3e-2")
	steps := diffDirs(t, single, other)
	if steps[0].Diffs != 0 {
		t.Errorf("step 1 with another learning rate: %d token-layers differ, want 0 (the same initial weights)", steps[0].Diffs)
	}
	for _, d := range steps[1:] {
		if d.Diffs == 0 {
			t.Errorf("step %d with another learning rate: no token routed differently", d.Step)
		}
	}
	err := runRoutingDiff([]string{"--quiet", single, other})
	if err == nil || !strings.Contains(err.Error(), "first difference at step 2") {
		t.Errorf("routing-diff of different dumps: %v, want an error naming step 2", err)
	}

	// A truncated file is refused, naming it.
	f := filepath.Join(epdp, "rank-00001.routing")
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, data[:len(data)-3], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := routing.Read(epdp); err == nil || !strings.Contains(err.Error(), "rank-00001.routing") {
		t.Errorf("a truncated dump: %v, want an error naming the file", err)
	}
	// A dense model has no routing to dump.
	if _, err := loadConfig(append(par(t.TempDir()), "--dump-routing", t.TempDir())); err == nil || !strings.Contains(err.Error(), "no MoE blocks") {
		t.Errorf("--dump-routing of a dense model: %v, want a refusal", err)
	}
}
