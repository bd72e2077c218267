package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCPUProfile: --cpu-profile writes a gzip-compressed pprof profile of
// the run; a second run naming the same file is refused before it trains,
// and the profile already written is left as it was.
func TestCPUProfile(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.pprof")
	if err := run(context.Background(), small(filepath.Join(dir, "run1"), "--cpu-profile", prof)); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(first))
	if err != nil {
		t.Fatalf("the profile is not gzip (pprof's format): %v", err)
	}
	if body, err := io.ReadAll(zr); err != nil || len(body) == 0 {
		t.Fatalf("the profile's body: %d bytes, %v; want a non-empty protobuf", len(body), err)
	}
	out2 := filepath.Join(dir, "run2")
	err = run(context.Background(), small(out2, "--cpu-profile", prof))
	if err == nil || !strings.Contains(err.Error(), prof+" exists") {
		t.Fatalf("second run on the same profile: %v, want a refusal naming %s", err, prof)
	}
	if again, _ := os.ReadFile(prof); !bytes.Equal(again, first) {
		t.Errorf("the refused run changed the profile (%d bytes, was %d)", len(again), len(first))
	}
	if _, err := os.Stat(filepath.Join(out2, "metrics.jsonl")); !os.IsNotExist(err) {
		t.Errorf("the refused run trained: %s/metrics.jsonl exists (%v)", out2, err)
	}
}

// TestCPUProfileRanks: with several processes each rank writes its own file.
func TestCPUProfileRanks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := os.Stat(path + ".rank3"); err != nil {
		t.Errorf("rank 3 of 4: %v, want %s.rank3", err, path)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("rank 3 of 4 wrote %s itself (%v)", path, err)
	}
}
