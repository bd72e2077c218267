package nvshmem

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/rendezvous"
)

// The multi-process tests re-execute the test binary as N children, one PE
// each, that meet through comm/rendezvous on 127.0.0.1. The children run
// TestHelperProcess, which does nothing unless helperEnv names what to run.
const (
	helperEnv  = "ASYNCTP_NVSHMEM_TEST_HELPER"  // the child's job: conformance, smoke, symmetric, bench
	deviceEnv  = "ASYNCTP_NVSHMEM_TEST_DEVICE"  // the child's GPU
	algoEnv    = "ASYNCTP_NVSHMEM_TEST_ALGO"    // auto, kernels or collectives
	stagingEnv = "ASYNCTP_NVSHMEM_TEST_STAGING" // WithStaging, bytes (optional)
)

// childLib is the library the children load and how many GPUs they share.
type childLib struct {
	path string
	gpus int
}

// needGPU skips unless the library loads and a GPU is present.
func needGPU(t testing.TB) childLib {
	t.Helper()
	lib, err := Load()
	if err != nil {
		t.Skipf("no NVSHMEM transport library, skipping the GPU tests: %v", err)
	}
	n, err := cDeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA device (%v), skipping the GPU tests (library %s)", err, lib.Path)
	}
	return childLib{path: lib.Path, gpus: n}
}

// runChildren runs n children doing job with lib and returns their outputs;
// a child that fails fails t with its output.
func runChildren(t testing.TB, lib childLib, job string, n int, algo string, timeout time.Duration, env ...string) []string {
	t.Helper()
	gpus := lib.gpus
	procs := commtest.RunProcesses(t, commtest.Processes{N: n, Test: "TestHelperProcess", Job: "nvshmem-" + job, Timeout: timeout,
		Env: func(rank int) []string {
			dev := 0
			if gpus > 1 {
				dev = rank % gpus
			}
			e := []string{helperEnv + "=" + job, deviceEnv + "=" + strconv.Itoa(dev), algoEnv + "=" + algo,
				EnvLibrary + "=" + lib.path}
			if os.Getenv("NVSHMEM_DISABLE_NVLS") == "" { // the rule of the multi-GPU machines
				e = append(e, "NVSHMEM_DISABLE_NVLS=1")
			}
			return append(e, env...)
		}})
	res := make([]string, n)
	for rank, p := range procs {
		res[rank] = p.Out
		if p.Err != nil {
			t.Errorf("%s, %d PEs (%s), rank %d on %s: %v; output:\n%s", job, n, algo, rank, placement(gpus, n), p.Err, tail(res[rank], 12000))
		}
	}
	return res
}

func placement(gpus, n int) string {
	if gpus == 1 {
		return fmt.Sprintf("all %d PEs on GPU 0", n)
	}
	return fmt.Sprintf("%d PEs over %d GPUs", n, gpus)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// TestHelperProcess is not a test: it is the body of the children of the
// multi-process tests.
func TestHelperProcess(t *testing.T) {
	job := os.Getenv(helperEnv)
	if job == "" {
		return
	}
	switch job {
	case "conformance":
		childConformance(t)
	case "smoke":
		childSmoke(t)
	case "symmetric":
		childSymmetric(t)
	case "bench":
		childBench(t)
	case "missing":
		childMissing(t)
	default:
		t.Fatalf("unknown helper job %q", job)
	}
}

// child is one PE of a test world.
type child struct {
	rank, size, dev int
	store           *rendezvous.Client
	closeStore      func() error
	world           *Comm
	mem             *DeviceMemory
}

// newChild joins the store and makes the world.
func newChild(t *testing.T, opts ...Option) *child {
	info, err := rendezvous.FromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := strconv.Atoi(os.Getenv(deviceEnv))
	if err != nil {
		t.Fatalf("%s: %v", deviceEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, closeStore, err := rendezvous.Join(ctx, info, rendezvous.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The log goes to stderr, which the parent shows when a child fails (the
	// watchdog may log after t is done with).
	stderr := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	opts = append([]Option{WithTimeout(90 * time.Second), WithLogf(stderr)}, opts...)
	switch a := os.Getenv(algoEnv); a {
	case "", "auto":
	case "kernels":
		opts = append(opts, WithAlgorithm(Kernels))
	case "collectives":
		opts = append(opts, WithAlgorithm(Collectives))
	default:
		t.Fatalf("%s=%q", algoEnv, a)
	}
	if s := os.Getenv(stagingEnv); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", stagingEnv, err)
		}
		opts = append(opts, WithStaging(n))
	}
	w, err := New(ctx, store, info.Rank, info.WorldSize, dev, opts...)
	if err != nil {
		closeStore()
		t.Fatal(err)
	}
	t.Logf("rank %d: %v; world path %s", info.Rank, w.Report(), w.Path())
	mem, err := NewDeviceMemory(dev)
	if err != nil {
		t.Fatal(err)
	}
	return &child{rank: info.Rank, size: info.WorldSize, dev: dev, store: store, closeStore: closeStore, world: w, mem: mem}
}

// close closes the world (NVSHMEM's finalize is collective), meets the
// others at the store and leaves it.
func (ch *child) close(t *testing.T) {
	if err := ch.world.Close(); err != nil {
		t.Errorf("rank %d: close: %v", ch.rank, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ch.store.Barrier(ctx, "done", ch.size); err != nil {
		t.Errorf("rank %d: %v", ch.rank, err)
	}
	if err := ch.closeStore(); err != nil {
		t.Logf("rank %d: closing the store: %v", ch.rank, err)
	}
}

// TestConformance runs commtest's suite on worlds of 2 and 4 PEs, all on
// GPU 0 when the machine has one GPU (NVSHMEM's limited MPG mode: the P2P
// kernels), one per GPU otherwise, where it runs twice: with NVSHMEM's team
// collectives (Auto) and with the P2P kernels only.
func TestConformance(t *testing.T) {
	lib := needGPU(t)
	algos := []string{"auto"}
	if lib.gpus > 1 {
		algos = append(algos, "kernels")
	}
	for _, n := range []int{2, 4} {
		for _, algo := range algos {
			t.Run(fmt.Sprintf("pes=%d/%s", n, algo), func(t *testing.T) {
				outs := runChildren(t, lib, "conformance", n, algo, 8*time.Minute)
				if testing.Verbose() && len(outs) > 0 {
					t.Logf("rank 0:\n%s", tail(outs[0], 4000))
				}
			})
		}
	}
}

// TestPutSignal: each PE puts into its neighbour's symmetric buffer with
// nvshmemx_putmem_signal_block and signals; the neighbour waits for the
// signal (nvshmem_signal_wait_until) and checks the data, twice.
func TestPutSignal(t *testing.T) {
	runChildren(t, needGPU(t), "smoke", 2, "auto", 3*time.Minute)
}

// TestSymmetric runs the collectives on tensors of the symmetric heap, on
// the world and on the groups of a grid.
func TestSymmetric(t *testing.T) {
	runChildren(t, needGPU(t), "symmetric", 2, "auto", 4*time.Minute)
}

// TestMissingRank: rank 1 never joins an all-reduce; rank 0's fails within
// the op timeout with an error that names rank 1 and wraps comm.ErrTimeout
// (the exchange kernel gives up its wait), and later ops fail at once.
func TestMissingRank(t *testing.T) {
	runChildren(t, needGPU(t), "missing", 2, "auto", 3*time.Minute)
}

// outputLines returns the lines of out that start with prefix, without it.
func outputLines(out, prefix string) []string {
	var lines []string
	for l := range strings.SplitSeq(out, "\n") {
		l = strings.TrimSpace(l)
		if i := strings.Index(l, prefix); i >= 0 {
			lines = append(lines, strings.TrimSpace(l[i+len(prefix):]))
		}
	}
	return lines
}
