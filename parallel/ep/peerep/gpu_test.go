package peerep

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/pes"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The GPU tests run N processes, one NVSHMEM PE each, all on GPU 0 when
// the machine has one (start MPS first with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// = 100/N per process for NVSHMEM's full MPG mode: scripts/gpu-overlap.sh).
const jobEnv = "ASYNCTP_PEEREP_TEST_JOB" // the child's job: suite, bench, moebench

// groupedEnv is the moebench child's grouped GEMM: on or off
// (cudabackend.WithGroupedGEMM), or auto (the backend's default).
const groupedEnv = "ASYNCTP_PEEREP_TEST_GROUPED"

// runPEs runs job on n PEs, with extra environment; the 4096-token
// benchmark needs ~1.2 GB of symmetric memory per PE.
func runPEs(t *testing.T, job string, n int, extra ...string) []string {
	return pes.Run(t, pes.Job{Env: jobEnv, Name: job, Prefix: "peerep",
		Extra: append([]string{"NVSHMEM_SYMMETRIC_SIZE=" + cmpOr(os.Getenv("NVSHMEM_SYMMETRIC_SIZE"), "6G")}, extra...)}, n)
}

func sizes(t *testing.T) []int { return pes.Sizes(t, "1,2,4") }

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestSuiteGPU: the ExpertPath conformance suite on NVSHMEM PEs (one GPU
// under MPS: scripts/gpu-overlap.sh's setup): the pipelined path and, as
// the reference run in the same processes, the collective dispatcher, in
// bf16 and f32, for EP 1, 2 and 4 ($ASYNCTP_OVERLAP_PES), with every
// scenario repeated ten times (identical bits each time).
func TestSuiteGPU(t *testing.T) {
	pes.Each(t, sizes(t), "suite:", func(t *testing.T, n int) []string { return runPEs(t, "suite", n) })
}

// TestDeadlineGPU: the last PE never dispatches; every other PE's dispatch
// must fail within the deadline with an error naming it.
func TestDeadlineGPU(t *testing.T) {
	var multi []int // a world of one has no peer to wait for
	for _, n := range sizes(t) {
		if n >= 2 {
			multi = append(multi, n)
		}
	}
	pes.Each(t, multi, "deadline:", func(t *testing.T, n int) []string { return runPEs(t, "deadline", n) })
}

// TestBenchGPU times dispatch and combine at DeepEP's shapes (hidden 7168,
// top-8 of 256 experts; 128 tokens per rank, low-latency, and 4096, normal)
// and the collective dispatcher at the same shapes. Only with
// ASYNCTP_OVERLAP_BENCH=1; PEs sharing one GPU show mechanics, not NVLink.
func TestBenchGPU(t *testing.T) {
	if os.Getenv("ASYNCTP_OVERLAP_BENCH") != "1" {
		t.Skip("set ASYNCTP_OVERLAP_BENCH=1 to time the expert path on the GPU")
	}
	for _, n := range sizes(t) {
		for _, l := range pes.Lines(runPEs(t, "bench", n)[0], "bench:") {
			fmt.Println(l)
		}
	}
}

// TestMoEBenchGPU times one MoE layer's forward and backward — router,
// dispatch, expert GEMMs, SwiGLU, combine and their backwards, bf16, CUDA
// events, the median of 10 after 3 warm-ups — per strategy (collective:
// the host count exchange and NVSHMEM all-to-alls; pipelined: this
// package's path) at moeBenchShapes (E 8 top-2 and E 64 top-8, widths
// 2048 and 4096, 4096 tokens per rank), once with the grouped GEMM on
// (the pipelined path's device step, no host read of counts) and once off
// (one cuBLASLt GEMM per expert, host counts), $ASYNCTP_MOEBENCH_GROUPED
// (default "on,off"); with the grouped GEMM on, also the fused path (its
// first grouped GEMM waiting per 128-row block on the dispatch's counters,
// the combine sent from the down projection's per-block flags). Only with ASYNCTP_OVERLAP_BENCH=1; PEs sharing one
// GPU show mechanics, not NVLink. ASYNCTP_MOEBENCH_PHASES=1 adds rank 0's
// time per phase of a step (cudabackend.PhaseTimes: route, dispatch,
// stats, the expert GEMMs, combine, and their backwards).
func TestMoEBenchGPU(t *testing.T) {
	if os.Getenv("ASYNCTP_OVERLAP_BENCH") != "1" {
		t.Skip("set ASYNCTP_OVERLAP_BENCH=1 to time the MoE layer on the GPU")
	}
	if _, err := moeBenchShapes(); err != nil {
		t.Fatal(err)
	}
	for _, n := range sizes(t) {
		for _, g := range strings.Split(cmpOr(os.Getenv("ASYNCTP_MOEBENCH_GROUPED"), "on,off"), ",") {
			if g != "on" && g != "off" && g != "auto" {
				t.Fatalf("ASYNCTP_MOEBENCH_GROUPED: %q, expected on, off or auto", g)
			}
			out := runPEs(t, "moebench", n, groupedEnv+"="+g)[0]
			for _, prefix := range []string{"bench:", "bench-phase:"} {
				for _, l := range pes.Lines(out, prefix) {
					fmt.Println(l)
				}
			}
		}
	}
}

// TestHelperProcess is not a test: it is the body of one PE.
func TestHelperProcess(t *testing.T) {
	job := os.Getenv(jobEnv)
	if job == "" {
		return
	}
	var opts []cudabackend.Option
	switch g := os.Getenv(groupedEnv); g {
	case "on", "off":
		opts = append(opts, cudabackend.WithGroupedGEMM(g == "on"))
	case "", "auto":
	default:
		t.Fatalf("%s=%q: expected on, off or auto", groupedEnv, g)
	}
	pe := newPE(t, opts...)
	defer pe.close(t)
	switch job {
	case "suite":
		pe.suite(t)
	case "deadline":
		pe.deadline(t)
	case "bench":
		pe.bench(t)
	case "moebench":
		pe.moebench(t)
	case "fused":
		pe.fused(t)
	case "fuseddeadline":
		pe.fuseddeadline(t)
	default:
		t.Fatalf("unknown job %q", job)
	}
}

// pe is one child's PE, with the jobs of this package's tests as methods.
type pe struct{ *pes.PE }

func newPE(t *testing.T, opts ...cudabackend.Option) *pe { return &pe{pes.JoinWith(t, opts...)} }

func (p *pe) close(t *testing.T) { p.PE.Close(t) }

func newPipelined(c eptest.Config) (ep.ExpertPath, error) {
	return New(ep.ExpertConfig{Name: "moe", Backend: c.Backend, Stream: c.Stream, Group: c.Group, Tokens: c.Tokens,
		Experts: c.Experts, Cols: c.Cols, MaxTokens: c.MaxTokens})
}

func newCollective(c eptest.Config) (ep.ExpertPath, error) {
	d, err := ep.NewDispatcher(c.Backend, c.Group, c.Experts, c.Stream)
	if err != nil {
		return nil, err
	}
	d.SetMaxTokens(c.MaxTokens)
	return d, d.SetTokenGroup(c.Tokens)
}

func (p *pe) suite(t *testing.T) {
	eptest.Steps = []int{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0} // step 0 eleven times: ten repeats, identical bits
	for _, c := range []struct {
		name string
		np   eptest.NewPath
	}{{"collective", newCollective}, {"pipelined", newPipelined}} {
		for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
			start := time.Now()
			r := eptest.Rank{Group: p.World, Backend: p.B, Stream: p.B.Stream(), NewPath: c.np, DType: dt, Seed: 11,
				Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }}
			err := r.CheckAll()
			if err == nil {
				err = p.B.Sync()
			}
			if err != nil {
				t.Fatalf("rank %d: %s %v: %v", p.Rank, c.name, dt, err)
			}
			fmt.Printf("suite: rank %d: %s %v passed (%v)\n", p.Rank, c.name, dt, time.Since(start).Round(time.Millisecond))
		}
	}
}

func (p *pe) deadline(t *testing.T) {
	const dl = 2 * time.Second
	path, err := New(ep.ExpertConfig{Name: "moe", Backend: p.B, Stream: p.B.Stream(), Group: p.World, Experts: 2 * p.Size,
		Cols: 64, MaxTokens: 16}, WithDeadline(dl))
	if err != nil {
		t.Fatal(err)
	}
	silent := p.Size - 1
	if err := path.ensure(2, 64, tensor.BFloat16); err != nil {
		t.Fatal(err)
	}
	if p.Rank == silent {
		fmt.Printf("deadline: rank %d stays silent\n", p.Rank)
	} else {
		idx := make([]int32, 16*2)
		for i := range idx {
			idx[i] = int32((i/2)%p.Size*2 + i%2) // every token on every rank's experts in turn
		}
		l, err := path.Layout(idx, 16, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		x := p.B.Zeros(tensor.BFloat16, 16, 64)
		start := time.Now()
		_, _, _, err = path.Dispatch(x, l)
		want := fmt.Sprintf("rank %d never signalled", silent)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("rank %d: a dispatch whose peer %d never sends: %v, expected an error containing %q", p.Rank, silent, err, want)
		}
		fmt.Printf("deadline: rank %d failed after %v: %v\n", p.Rank, time.Since(start).Round(time.Millisecond), err)
	}
	// NVSHMEM cannot abort and the failed backend cannot free: leave the
	// symmetric buffers to the process exit, after a host barrier.
	p.ExitAfterFailure("deadline")
}

// bench times dispatch (DispatchSend+DispatchRecv, no host read) and
// combine (CombineSend+CombineRecv) of the device path with CUDA events,
// and the collective dispatcher's Dispatch and Combine, at DeepEP's shapes.
func (p *pe) bench(t *testing.T) {
	const C, K, E = 7168, 8, 256
	b := p.B
	row := func(name string, d time.Duration, err error) {
		if err != nil {
			t.Fatalf("rank %d: %s: %v", p.Rank, name, err)
		}
		fmt.Printf("bench: P=%d %-58s %9.1f µs\n", p.Size, name, float64(d.Nanoseconds())/1e3)
	}
	for _, N := range []int{128, 4096} {
		rng := rand.New(rand.NewPCG(uint64(p.Rank), uint64(N)))
		idx := make([]int32, N*K)
		for n := range N {
			for j, e := range rng.Perm(E)[:K] {
				idx[n*K+j] = int32(e)
			}
		}
		x := b.Zeros(tensor.BFloat16, N, C)
		w := b.Zeros(tensor.BFloat16, N, K)
		out := b.Zeros(tensor.BFloat16, N, C)
		path, err := New(ep.ExpertConfig{Name: "bench", Backend: b, Stream: b.Stream(), Group: p.World, Experts: E, Cols: C, MaxTokens: N})
		if err != nil {
			t.Fatal(err)
		}
		if err := path.ensure(K, C, tensor.BFloat16); err != nil {
			t.Fatal(err)
		}
		eng := path.eng
		ih, _ := tensor.FromInt32(idx, N, K)
		di := b.Zeros(tensor.Int32, N, K)
		b.Upload(di, ih)
		ye := b.Zeros(tensor.BFloat16, eng.RecvBound(), C)
		shape := fmt.Sprintf("%d tok/rank, hidden %d, top-%d of %d", N, C, K, E)
		d, err := p.Time(20, func() error {
			if err := eng.DispatchSend(x, di, 0); err != nil {
				return err
			}
			return eng.DispatchRecv(ye, 0)
		})
		row("pipelined dispatch ("+shape+")", d, err)
		d, err = p.Time(20, func() error {
			if err := eng.CombineSend(ye, 0); err != nil {
				return err
			}
			err := eng.CombineRecv(out, w)
			eng.Release()
			return err
		})
		row("pipelined combine ("+shape+")", d, err)
		if err := path.Close(); err != nil {
			t.Fatal(err)
		}
		col, _ := ep.NewDispatcher(b, p.World, E, b.Stream())
		l, _ := col.Layout(idx, N, K, 0)
		var h *ep.Handle
		d, err = p.Time(10, func() error {
			col.Release(h)
			_, hh, wk, err := col.Dispatch(x, l)
			if err == nil {
				err = wk.Wait(b.Stream())
			}
			h = hh
			return err
		})
		row("collective dispatch, host count exchange ("+shape+")", d, err)
		y := b.Zeros(tensor.BFloat16, h.RecvRows(), C)
		d, err = p.Time(10, func() error { return col.Combine(out, y, w, h) })
		row("collective combine ("+shape+")", d, err)
		col.Release(h)
		for _, t := range []*tensor.Tensor{x, w, out, di, ye, y} {
			b.Free(t)
		}
	}
}

// moebench times the MoE layer's forward and backward at moeBenchShapes,
// collective and pipelined (benchMoE), with CUDA events; rank 0 prints
// the lines. A shape whose experts do not divide over the PEs is skipped,
// saying so.
func (p *pe) moebench(t *testing.T) {
	shapes, err := moeBenchShapes()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shapes {
		if s.E%p.Size != 0 {
			if p.Rank == 0 {
				fmt.Printf("bench: P=%d moe fwd+bwd %v: skipped, %d experts do not divide over %d PEs\n", p.Size, s, s.E, p.Size)
			}
			continue
		}
		start := time.Now()
		sts := []overlap.Strategy{nil, pipelinedStrategy()}
		if os.Getenv(groupedEnv) == "on" {
			// The fused path runs only as the device step (the grouped engine).
			sts = append(sts, fusedStrategy())
		}
		lines, err := benchMoE(p.B, p.World, p.B.Stream(), s, tensor.BFloat16, sts, 3, 10, pes.EventTimer(p.B),
			os.Getenv("ASYNCTP_MOEBENCH_PHASES") == "1")
		if err != nil {
			t.Fatalf("rank %d: %v", p.Rank, err)
		}
		if p.Rank == 0 {
			for _, l := range lines {
				fmt.Println(l)
			}
			fmt.Fprintf(os.Stderr, "moebench: %v took %v\n", s, time.Since(start).Round(time.Millisecond))
		}
	}
}
