package commtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWrapAndLogDir runs two children through $ASYNCTP_PE_WRAP (env, which
// sets a variable with the rank substituted: the wrapper ran, per child)
// with $ASYNCTP_PE_LOG_DIR set, and checks each child's output both in the
// outcome and in its log file.
func TestWrapAndLogDir(t *testing.T) {
	if os.Getenv("COMMTEST_WRAP_CHILD") != "" {
		return // the parent's run of TestWrapChild below is all
	}
	dir := t.TempDir()
	t.Setenv(EnvWrap, "env COMMTEST_WRAPPED=rank-{rank}")
	t.Setenv(EnvLogDir, dir)
	procs := RunProcesses(t, Processes{N: 2, Test: "TestWrapChild", Job: "wrap", Timeout: time.Minute,
		Env: func(int) []string { return []string{"COMMTEST_WRAP_CHILD=1"} }})
	logs, err := filepath.Glob(filepath.Join(dir, "wrap-*-rank*.log"))
	if err != nil || len(logs) != 2 {
		t.Fatalf("log files in %s: %v (%v), want 2", dir, logs, err)
	}
	for _, p := range procs {
		want := fmt.Sprintf("child %d wrapped as rank-%d", p.Rank, p.Rank)
		if p.Err != nil || !strings.Contains(p.Out, want) {
			t.Errorf("rank %d: err %v, output %q: want %q", p.Rank, p.Err, p.Out, want)
		}
		b, err := os.ReadFile(logs[p.Rank])
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("rank %d: log %s: %v, %q: want %q", p.Rank, logs[p.Rank], err, b, want)
		}
	}
}

// TestWrapChild is the child of TestWrapAndLogDir.
func TestWrapChild(t *testing.T) {
	if os.Getenv("COMMTEST_WRAP_CHILD") == "" {
		t.Skip("a child of TestWrapAndLogDir")
	}
	fmt.Printf("child %s wrapped as %s\n", os.Getenv("ASYNCTP_RANK"), os.Getenv("COMMTEST_WRAPPED"))
}
