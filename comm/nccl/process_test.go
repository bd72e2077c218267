package nccl

// Tests with one process per GPU: the test binary re-executes itself as
// children (TestChild) that meet through comm/rendezvous on 127.0.0.1.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/tensor"
)

// childEnv marks a child process and says what it runs: "suite", "kill",
// "straggler" or "bench".
const childEnv = "ASYNCTP_NCCL_TEST_CHILD"

// Deadlines of the fault tests.
const (
	killTimeout      = 20 * time.Second
	killHeartbeat    = 200 * time.Millisecond
	killLost         = 2 * time.Second
	stragglerTimeout = 4 * time.Second
)

// multiGPU returns the number of ranks to run, one per GPU (at most 8), or
// skips.
func multiGPU(tb testing.TB) int {
	n := gpus(tb)
	if n < 2 {
		tb.Skipf("NCCL needs one GPU per rank; this machine has %d", n)
	}
	return min(n, 8)
}

// runChildren runs n children in mode, rank r on GPU r, and waits for all
// of them (at most timeout).
func runChildren(tb testing.TB, mode string, n int, timeout time.Duration) []commtest.Process {
	tb.Helper()
	return commtest.RunProcesses(tb, commtest.Processes{N: n, Test: "TestChild", Job: "nccl-" + mode, Timeout: timeout,
		Env: func(int) []string { return []string{childEnv + "=" + mode, "NCCL_NVLS_ENABLE=0"} }})
}

// TestMultiProcess runs the conformance suite with one process per GPU.
func TestMultiProcess(t *testing.T) {
	n := multiGPU(t)
	for _, c := range runChildren(t, "suite", n, 9*time.Minute) {
		if c.Err != nil {
			t.Errorf("rank %d of %d failed (%v); its output:\n%s", c.Rank, n, c.Err, c.Out)
		} else if testing.Verbose() {
			t.Logf("rank %d of %d passed; its output:\n%s", c.Rank, n, c.Out)
		}
	}
}

// TestKillRank: the last rank exits in the middle of an all-reduce; the
// others must fail within the deadline with an error naming it.
func TestKillRank(t *testing.T) {
	n := multiGPU(t)
	for _, c := range runChildren(t, "kill", n, 3*time.Minute) {
		switch {
		case c.Rank == n-1 && c.Code() != 3:
			t.Errorf("victim rank %d: exit code %d (%v), want 3; its output:\n%s", c.Rank, c.Code(), c.Err, c.Out)
		case c.Rank != n-1 && c.Err != nil:
			t.Errorf("survivor rank %d: %v; its output:\n%s", c.Rank, c.Err, c.Out)
		default:
			t.Logf("rank %d: %s", c.Rank, grepLine(c.Out, "KILLTEST"))
		}
	}
}

// TestStraggler: the last rank does not call an all-reduce; the others time
// out with an error naming the op, and the straggler, told through the
// store, fails its next op at once.
func TestStraggler(t *testing.T) {
	n := multiGPU(t)
	for _, c := range runChildren(t, "straggler", n, 3*time.Minute) {
		if c.Err != nil {
			t.Errorf("rank %d: %v; its output:\n%s", c.Rank, c.Err, c.Out)
		} else {
			t.Logf("rank %d: %s", c.Rank, grepLine(c.Out, "STRAGGLER"))
		}
	}
}

func grepLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return "(no " + prefix + " line)"
}

// TestChild is not a test: it is the body of the child processes that
// TestMultiProcess, TestKillRank, TestStraggler and BenchmarkBusBandwidth
// start, one rank each.
func TestChild(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("not a child process: this is the body of the processes the multi-process tests start")
	}
	info, err := rendezvous.FromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	store, closeStore, err := rendezvous.Join(ctx, info, rendezvous.Options{})
	if err != nil {
		t.Fatal(err)
	}
	survivors := info.WorldSize
	if mode == "kill" {
		survivors--
	}
	defer func() {
		bctx, bcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer bcancel()
		if err := store.Barrier(bctx, "exit", survivors); err != nil {
			t.Logf("exit barrier: %v", err)
		}
		closeStore()
	}()
	opts := map[string][]Option{
		"suite":     {WithTimeout(2 * time.Minute)},
		"bench":     {WithTimeout(2 * time.Minute)},
		"kill":      {WithTimeout(killTimeout), WithHeartbeat(killHeartbeat, killLost)},
		"straggler": {WithTimeout(stragglerTimeout), WithHeartbeat(killHeartbeat, time.Minute)},
	}[mode]
	dev := info.LocalRank
	c, err := New(ctx, store, info.Rank, info.WorldSize, dev, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	t.Logf("%v; %s rank %d on cuda:%d", c.Library(), c.Name(), c.Rank(), dev)
	switch mode {
	case "suite":
		commtest.RunRank(t, c, commtest.WithMemory(suiteMemory(t, dev, nil)))
		if c.Size() <= 3 {
			// With 4 ranks or more, the suite's two groups driven at once
			// from two goroutines would deadlock on one shared stream.
			s := newStream(t, dev)
			commtest.RunRank(t, c, commtest.WithMemory(suiteMemory(t, dev, s)), commtest.WithStream(s))
		}
		streamCases(t, c)
	case "kill":
		killChild(ctx, t, c, store)
	case "straggler":
		stragglerChild(ctx, t, c, store)
	case "bench":
		benchChild(t, c)
	default:
		t.Fatalf("unknown mode %q", mode)
	}
}

// warmUp runs a few all-reduces (NCCL connects on the first) and meets the
// other ranks at a store barrier.
func warmUp(ctx context.Context, t *testing.T, c *Comm, store *rendezvous.Client) *tensor.Tensor {
	buf, err := newRawMemory(t, c.Device(), nil).Alloc(tensor.Float32, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		w, err := c.AllReduce(buf, comm.Sum, nil)
		if err == nil {
			err = w.Wait(nil)
		}
		if err != nil {
			t.Fatalf("warm-up all-reduce %d: %v", i, err)
		}
	}
	if err := store.Barrier(ctx, "warm", c.Size()); err != nil {
		t.Fatal(err)
	}
	return buf
}

func killChild(ctx context.Context, t *testing.T, c *Comm, store *rendezvous.Client) {
	victim := c.Size() - 1
	buf := warmUp(ctx, t, c, store)
	if c.Rank() == victim {
		c.AllReduce(buf, comm.Sum, nil) // the others are in it with us
		time.Sleep(100 * time.Millisecond)
		fmt.Println("KILLTEST victim exits mid-collective")
		os.Exit(3)
	}
	start := time.Now()
	var err error
	for err == nil && time.Since(start) < 3*killTimeout {
		var w comm.Work
		if w, err = c.AllReduce(buf, comm.Sum, nil); err == nil {
			err = w.Wait(nil)
		}
	}
	took := time.Since(start)
	fmt.Printf("KILLTEST rank %d failed after %v: %v\n", c.Rank(), took.Round(time.Millisecond), err)
	name := fmt.Sprintf("world rank %d", victim)
	var e *comm.Error
	switch {
	case err == nil:
		t.Fatalf("no error after %v", took)
	case !errors.As(err, &e) || e.Op != comm.OpAllReduce || e.Rank != c.Rank():
		t.Errorf("%v: want a *comm.Error of the all-reduce on rank %d", err, c.Rank())
	case !strings.Contains(err.Error(), name):
		t.Errorf("%v: want an error naming %s", err, name)
	case took > killTimeout+5*time.Second:
		t.Errorf("failed after %v, want within the deadline %v", took, killTimeout)
	}
	if !errors.Is(err, ErrPeerGone) && !errors.Is(err, comm.ErrTimeout) {
		t.Logf("note: the error wraps neither ErrPeerGone nor comm.ErrTimeout: %v", err)
	}
}

func stragglerChild(ctx context.Context, t *testing.T, c *Comm, store *rendezvous.Client) {
	straggler := c.Size() - 1
	buf := warmUp(ctx, t, c, store)
	if c.Rank() == straggler {
		time.Sleep(stragglerTimeout + 5*time.Second) // the others give up meanwhile
		start := time.Now()
		_, err := c.AllReduce(buf, comm.Sum, nil)
		took := time.Since(start)
		fmt.Printf("STRAGGLER rank %d (the straggler) failed after %v: %v\n", c.Rank(), took.Round(time.Millisecond), err)
		if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "did not complete within") || took > time.Second {
			t.Errorf("%v after %v: want a prompt error wrapping comm.ErrAborted that carries the others' timeout", err, took)
		}
		return
	}
	start := time.Now()
	w, err := c.AllReduce(buf, comm.Sum, nil)
	if err == nil {
		err = w.Wait(nil)
	}
	took := time.Since(start)
	fmt.Printf("STRAGGLER rank %d failed after %v: %v\n", c.Rank(), took.Round(time.Millisecond), err)
	switch {
	case err == nil:
		t.Fatal("the all-reduce without the straggler completed")
	case !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrAborted):
		t.Errorf("%v: want comm.ErrTimeout (or comm.ErrAborted from another rank's timeout)", err)
	case !strings.Contains(err.Error(), "did not complete within") || !strings.Contains(err.Error(), comm.OpAllReduce):
		t.Errorf("%v: want the op and the deadline named", err)
	case took < stragglerTimeout-time.Second || took > stragglerTimeout+10*time.Second:
		t.Errorf("failed after %v, want about the deadline %v", took, stragglerTimeout)
	}
}
