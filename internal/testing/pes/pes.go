package pes

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/nvshmem"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// NeedGPU skips t unless the NVSHMEM library, a GPU and the kernels image
// are there; it returns the library's path and the GPU count.
func NeedGPU(t *testing.T) (lib string, gpus int) {
	t.Helper()
	l, err := nvshmem.Load()
	if err != nil {
		t.Skipf("no NVSHMEM transport library, skipping the GPU tests: %v", err)
	}
	if err := cuda.Init(); err != nil {
		t.Skipf("no CUDA driver, skipping the GPU tests: %v", err)
	}
	n, err := cuda.DeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no CUDA device (%v), skipping the GPU tests", err)
	}
	if _, err := cudabackend.FindKernels(); err != nil {
		t.Skipf("no kernels image, skipping the GPU tests: %v", err)
	}
	return l.Path, n
}

// Sizes are the world sizes to run: $ASYNCTP_OVERLAP_PES, else def ("2,4").
func Sizes(t *testing.T, def string) []int {
	var out []int
	for _, f := range strings.Split(or(os.Getenv("ASYNCTP_OVERLAP_PES"), def), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			t.Fatalf("ASYNCTP_OVERLAP_PES=%q: expected a comma-separated list of PE counts", os.Getenv("ASYNCTP_OVERLAP_PES"))
		}
		out = append(out, n)
	}
	return out
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Job names a child's work: the variable that carries it (jobEnv), its
// value, and a prefix for the processes' job id.
type Job struct {
	Env, Name, Prefix string
	Extra             []string // more environment for every child
}

// Run runs job on n PEs (the test function TestHelperProcess of the test
// binary, which reads j.Env) within $ASYNCTP_OVERLAP_TIMEOUT (8m), failing t
// with the output of every PE that failed; it returns every PE's output.
func Run(t *testing.T, j Job, n int) []string {
	lib, gpus := NeedGPU(t)
	timeout, err := time.ParseDuration(or(os.Getenv("ASYNCTP_OVERLAP_TIMEOUT"), "8m"))
	if err != nil {
		t.Fatalf("ASYNCTP_OVERLAP_TIMEOUT: %v", err)
	}
	procs := commtest.RunProcesses(t, commtest.Processes{N: n, Test: "TestHelperProcess", Job: j.Prefix + "-" + j.Name, Timeout: timeout,
		Env: func(rank int) []string {
			return append([]string{j.Env + "=" + j.Name, nvshmem.EnvLibrary + "=" + lib, "ASYNCTP_TEST_DEVICE=" + strconv.Itoa(rank%gpus),
				"NVSHMEM_DISABLE_NVLS=1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + strconv.Itoa(100/n)}, j.Extra...)
		}})
	outs := make([]string, n)
	for r, p := range procs {
		outs[r] = p.Out
		if p.Err != nil {
			out := p.Out
			if len(out) > 12000 {
				out = "…" + out[len(out)-12000:]
			}
			t.Errorf("%s, %d PEs, rank %d: %v; output:\n%s", j.Name, n, r, p.Err, out)
		}
	}
	return outs
}

// PE is one child's place: its rank in a world of Size, the rendezvous
// store, the NVSHMEM world and the CUDA backend (opened by launch.Open).
type PE struct {
	Rank, Size int
	Store      *rendezvous.Client
	World      comm.Comm
	B          *cudabackend.Backend
	w          *launch.World
}

// Join makes this child a PE (its rank from the environment Run sets).
func Join(t *testing.T) *PE { return JoinWith(t) }

// JoinWith is Join with the CUDA backend built with opts.
func JoinWith(t *testing.T, opts ...cudabackend.Option) *PE {
	info, err := rendezvous.FromEnv(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := launch.Open(ctx, info, launch.Options{Transport: launch.NVSHMEM, Timeout: 2 * time.Minute, CUDA: opts})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "rank %d: world of %d up: %v\n", info.Rank, info.WorldSize, w.Report)
	return &PE{Rank: info.Rank, Size: info.WorldSize, Store: w.Store, World: w.Comm, B: w.Backend.(*cudabackend.Backend), w: w}
}

// Close leaves the world, meets the others at the store and closes.
func (p *PE) Close(t *testing.T) {
	if err := p.World.Close(); err != nil {
		t.Errorf("rank %d: close: %v", p.Rank, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Store.Barrier(ctx, "done", p.Size); err != nil {
		t.Errorf("rank %d: %v", p.Rank, err)
	}
	p.w.Close()
}

// ExitAfterFailure ends a child whose world cannot close cleanly (a test
// that made a peer fail: NVSHMEM cannot abort, and a stream may still wait
// for the silent peer): a host barrier named tag, then os.Exit(0), rank 0
// last, since it serves the store (a peer that lost the store in the middle
// of the barrier's answer would wait forever in a finalize that rank 0
// never joins — seen on the H200). A failed barrier exits 1, not through
// t.Fatal, whose deferred Close would wait in NVSHMEM's finalize.
func (p *PE) ExitAfterFailure(tag string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Store.Barrier(ctx, tag, p.Size); err != nil {
		fmt.Printf("%s: rank %d: barrier: %v\n", tag, p.Rank, err)
		os.Exit(1)
	}
	if p.Rank == 0 {
		time.Sleep(time.Second)
	}
	os.Exit(0)
}
