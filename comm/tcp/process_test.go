package tcp

// Tests with one process per rank: the test binary re-executes itself as
// children (TestChild) that meet through comm/rendezvous on 127.0.0.1.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/rendezvous"
)

// childEnv marks a child process and says what it runs: "suite" or "kill".
const childEnv = "ASYNCTP_TCP_TEST_CHILD"

// killTimeout is the op deadline of the kill test: the survivors must fail
// long before it.
const killTimeout = time.Minute

// runChildren runs n children in mode and waits for all of them (at most
// timeout).
func runChildren(tb testing.TB, mode string, n int, timeout time.Duration) []commtest.Process {
	tb.Helper()
	return commtest.RunProcesses(tb, commtest.Processes{N: n, Test: "TestChild", Job: "tcp-" + mode, Timeout: timeout,
		Env: func(int) []string { return []string{childEnv + "=" + mode} }})
}

// TestMultiProcess runs the conformance suite with one process per rank,
// in worlds of 2 and 4.
func TestMultiProcess(t *testing.T) {
	for _, n := range []int{2, 4} {
		for _, c := range runChildren(t, "suite", n, 2*time.Minute) {
			if c.Err != nil {
				t.Errorf("rank %d of %d failed (%v); its output:\n%s", c.Rank, n, c.Err, c.Out)
			}
		}
	}
}

// TestKillRank: the last of 3 ranks kills itself (SIGKILL) while the others
// wait for it in an all-reduce; they must fail at once, long before the
// deadline, with an error naming it.
func TestKillRank(t *testing.T) {
	const n = 3
	for _, c := range runChildren(t, "kill", n, 2*time.Minute) {
		switch {
		case c.Rank == n-1 && !strings.Contains(fmt.Sprint(c.Err), "signal: killed"):
			t.Errorf("victim rank %d: %v, want killed; its output:\n%s", c.Rank, c.Err, c.Out)
		case c.Rank != n-1 && c.Err != nil:
			t.Errorf("survivor rank %d: %v; its output:\n%s", c.Rank, c.Err, c.Out)
		case c.Rank != n-1:
			t.Logf("rank %d: %s", c.Rank, grepLine(c.Out, "KILLTEST"))
		}
	}
}

func grepLine(out, prefix string) string {
	for l := range strings.Lines(out) {
		if i := strings.Index(l, prefix); i >= 0 {
			return strings.TrimSpace(l[i:])
		}
	}
	return "(no " + prefix + " line)"
}

// TestChild is the body of a child process; it skips unless run as one.
func TestChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("run by the multi-process tests")
	}
	info, err := rendezvous.FromEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, closeStore, err := rendezvous.Join(ctx, info, rendezvous.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	timeout := 30 * time.Second
	if mode == "kill" {
		timeout = killTimeout
	}
	c, err := New(ctx, store, info.Rank, info.WorldSize, WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	switch mode {
	case "suite":
		commtest.RunRank(t, c, commtest.Mismatch())
		if err := c.Barrier(); err != nil {
			t.Fatal(err)
		}
	case "kill":
		for i := range 5 {
			if err := allReduce(c); err != nil {
				t.Fatalf("all-reduce %d before the kill: %v", i, err)
			}
		}
		if info.Rank == info.WorldSize-1 {
			time.Sleep(200 * time.Millisecond) // the others wait in the next all-reduce
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		start := time.Now()
		err := allReduce(c)
		took := time.Since(start)
		fmt.Printf("KILLTEST after %v: %v\n", took.Round(time.Millisecond), err)
		victim := fmt.Sprintf("world rank %d", info.WorldSize-1)
		if !errors.Is(err, ErrPeerGone) || !errors.Is(err, comm.ErrAborted) || !strings.Contains(fmt.Sprint(err), victim) {
			t.Errorf("got %v, want an error naming %s that wraps ErrPeerGone and comm.ErrAborted", err, victim)
		}
		if took > killTimeout/4 {
			t.Errorf("failed after %v, want well before the deadline %v", took, killTimeout)
		}
		if err := allReduce(c); err == nil {
			t.Errorf("an op after the failure succeeded")
		}
	}
}
