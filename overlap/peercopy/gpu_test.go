package peercopy_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/pes"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/overlaptest"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The GPU tests run N processes, one NVSHMEM PE each, all on GPU 0 when
// the machine has one (start MPS first with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// = 100/N per process for NVSHMEM's full MPG mode: scripts/gpu-overlap.sh).
const jobEnv = "ASYNCTP_OVERLAP_TEST_JOB" // the child's job: suite, bench

func runPEs(t *testing.T, job string, n int) []string {
	return pes.Run(t, pes.Job{Env: jobEnv, Name: job, Prefix: "overlap"}, n)
}

func sizes(t *testing.T) []int { return pes.Sizes(t, "2,4") }

// TestSuiteGPU: the conformance suite of every strategy on NVSHMEM PEs,
// in bf16 and f32, on worlds of 2 and 4 PEs.
func TestSuiteGPU(t *testing.T) {
	pes.Each(t, sizes(t), "suite:", func(t *testing.T, n int) []string { return runPEs(t, "suite", n) })
}

// TestFusedDeadlineGPU: the last PE never calls the fused all-gather∘matmul
// (its shard is never published); every other PE's call must fail at its
// Sync within the deadline, naming the group and that rank, instead of
// hanging.
func TestFusedDeadlineGPU(t *testing.T) {
	pes.Each(t, sizes(t), "deadline:", func(t *testing.T, n int) []string { return runPEs(t, "deadline", n) })
}

// TestFusedPutDeadlineGPU: TestFusedDeadlineGPU with the put transfer: the
// last PE never puts its shard (it skips the call); every other PE's call
// must fail at its Sync within the deadline (its wait for the peers' puts,
// then the engine's), naming the group and that rank.
func TestFusedPutDeadlineGPU(t *testing.T) {
	pes.Each(t, sizes(t), "deadline:", func(t *testing.T, n int) []string { return runPEs(t, "deadline-put", n) })
}

// TestFusedScatterDeadlineGPU: the last PE never calls the fused
// matmul∘reduce-scatter (its partials are never published): every other
// PE's call must fail at its Sync within the deadline, naming the group and
// that rank, instead of hanging in the pulls' stream waits.
func TestFusedScatterDeadlineGPU(t *testing.T) {
	pes.Each(t, sizes(t), "deadline:", func(t *testing.T, n int) []string { return runPEs(t, "deadline-scatter", n) })
}

// TestFusedDeterminismGPU: the fused matmul∘reduce-scatter (forward, and
// the all-gather∘matmul's backward, whose dx is one) gives the same bits in
// 10 runs on random inputs (the reduce-scatter's fixed-order sum is what
// makes a run reproducible),
// with each transfer (pull, put); so do the gathers' sides (the
// all-gather∘matmul forward's output and gathered rows, the
// matmul∘reduce-scatter backward's dx).
func TestFusedDeterminismGPU(t *testing.T) {
	pes.Each(t, sizes(t), "determinism:", func(t *testing.T, n int) []string { return runPEs(t, "determinism", n) })
}

// TestBenchGPU times the sites of each strategy at TP-shaped sizes (it is a
// benchmark run as a test so that its PEs can be several processes; it
// asserts nothing about speed). Only with ASYNCTP_OVERLAP_BENCH=1.
func TestBenchGPU(t *testing.T) {
	if os.Getenv("ASYNCTP_OVERLAP_BENCH") != "1" {
		t.Skip("set ASYNCTP_OVERLAP_BENCH=1 to time the sites on the GPU")
	}
	for _, n := range sizes(t) {
		for _, l := range pes.Lines(runPEs(t, "bench", n)[0], "bench:") {
			fmt.Println(l)
		}
	}
}

// TestHelperProcess is not a test: it is the body of one PE.
func TestHelperProcess(t *testing.T) {
	job := os.Getenv(jobEnv)
	if job == "" {
		return
	}
	pe := newPE(t)
	defer pe.close(t)
	switch job {
	case "suite":
		pe.suite(t)
	case "bench":
		pe.bench(t)
	case "deadline":
		pe.deadline(t, peercopy.TransferPull)
	case "deadline-put":
		pe.deadline(t, peercopy.TransferPut)
	case "deadline-scatter":
		pe.deadlineScatter(t)
	case "determinism":
		pe.determinism(t)
	default:
		t.Fatalf("unknown job %q", job)
	}
}

// pe is one child's PE, with the jobs of this package's tests as methods.
type pe struct{ *pes.PE }

func newPE(t *testing.T) *pe { return &pe{pes.Join(t)} }

func (p *pe) close(t *testing.T) { p.PE.Close(t) }

// strategiesRun are the strategies the jobs run: every one, or those named in
// $ASYNCTP_OVERLAP_STRATEGIES (a comma-separated list of stratName's
// names, e.g. "fused-pull,fused-put").
func strategiesRun(t *testing.T) []overlap.Strategy {
	// $ASYNCTP_OVERLAP_FUSED_TIMEOUT: the fused strategies' deadline (unset:
	// their default), to tell a stall from a slow peer.
	var timeout time.Duration
	if v := os.Getenv("ASYNCTP_OVERLAP_FUSED_TIMEOUT"); v != "" {
		var err error
		if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
			t.Fatalf("ASYNCTP_OVERLAP_FUSED_TIMEOUT=%q: expected a positive duration", v)
		}
	}
	// The registry's pipelined and fused (the forms they pick on NVSHMEM
	// PEs of one GPU: peercopy's Chunked and Engine; suite checks that they
	// do), and the exchange form of pipelined, which the registry picks
	// only where there is no symmetric memory, under its strategy's name.
	fused := func(transfer string) overlap.Strategy {
		return strategies.Fused{Options: strategies.Options{Transfer: transfer, Timeout: timeout}}
	}
	all := []overlap.Strategy{overlap.Collective{}, exchangeForm{}, strategies.Pipelined{},
		fused(peercopy.TransferPull), fused(peercopy.TransferPut)}
	only := os.Getenv("ASYNCTP_OVERLAP_STRATEGIES")
	if only == "" {
		return all
	}
	var out []overlap.Strategy
	for _, name := range strings.Split(only, ",") {
		found := false
		for _, s := range all {
			if stratName(s) == strings.TrimSpace(name) {
				out, found = append(out, s), true
			}
		}
		if !found {
			var names []string
			for _, s := range all {
				names = append(names, stratName(s))
			}
			t.Fatalf("ASYNCTP_OVERLAP_STRATEGIES=%q: %q is none of %s", only, name, strings.Join(names, ", "))
		}
	}
	return out
}

// exchangeForm is overlap.Exchange under the name of the strategy whose
// form it is, so that the suite runs it on NVSHMEM PEs too.
type exchangeForm struct{ overlap.Exchange }

func (exchangeForm) Name() string { return "pipelined" }

// stratName names a strategy of strategiesRun in the jobs' lines.
func stratName(s overlap.Strategy) string {
	switch v := s.(type) {
	case overlap.Collective:
		return "collective"
	case exchangeForm:
		return "pipelined"
	case strategies.Pipelined:
		return "peercopy-pipelined"
	case strategies.Fused:
		return "fused-" + v.Options.Transfer
	}
	return fmt.Sprintf("%T", s)
}

func (p *pe) suite(t *testing.T) {
	for i, s := range strategiesRun(t) {
		for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
			sp := overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "form", Group: p.World, Backend: p.B, Stream: p.B.Stream(), K: 64, Outs: []int{64}, DType: dt}
			if d, ok := s.(overlap.Describer); ok && s.Name() != "collective" {
				// The registry's strategies pick the peer-copy forms here;
				// exchangeForm is the exchange.
				_, exchange := s.(exchangeForm)
				if how, sym := d.Via(sp); sym == exchange && s.Supports(sp) == nil {
					t.Fatalf("rank %d: %s %v moves by %q (symmetric memory: %v), expected the %s form", p.Rank, stratName(s), dt, how, sym,
						map[bool]string{true: "exchange", false: "peer-copy"}[exchange])
				}
			}
			if _, fused := s.(strategies.Fused); fused && dt != tensor.BFloat16 {
				// The engine takes bf16 operands: the strategy must say so
				// (and the chooser then keeps collective, or refuses an
				// explicit request).
				err := s.Supports(overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "f32", Group: p.World, Backend: p.B,
					Stream: p.B.Stream(), K: 64, Outs: []int{64}, DType: dt})
				if !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "expected bf16") {
					t.Fatalf("rank %d: fused with %v tensors: %v, want ErrUnavailable saying bf16", p.Rank, dt, err)
				}
				fmt.Printf("suite: rank %d: %s %v refused as it should: %v\n", p.Rank, stratName(s), dt, err)
				continue
			}
			fmt.Fprintf(os.Stderr, "rank %d: %s %v: start\n", p.Rank, stratName(s), dt)
			start := time.Now()
			r := overlaptest.Rank{Group: p.World, Backend: p.B, Stream: p.B.Stream(), Strategy: s, DType: dt, Seed: uint64(100 + i)}
			skipped, err := r.CheckAllReport()
			if err == nil {
				err = p.B.Sync()
			}
			for _, l := range skipped {
				fmt.Printf("suite: rank %d: unavailable, as declared: %s\n", p.Rank, l)
			}
			name := stratName(s)
			if err != nil {
				t.Fatalf("rank %d: %s %v: %v", p.Rank, name, dt, err)
			}
			fmt.Printf("suite: rank %d: %s %v passed (%v)\n", p.Rank, name, dt, time.Since(start).Round(time.Millisecond))
		}
	}
}

func (p *pe) deadline(t *testing.T, transfer string) {
	const dl = 2 * time.Second
	const n, k, m = 64, 256, 256
	b := p.B
	ag, err := peercopy.Engine{Timeout: dl, Transfer: transfer}.NewAllGatherMatmul(overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "deadline",
		Group: p.World, Backend: b, Stream: b.Stream(), K: k, Outs: []int{m}, DType: tensor.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	silent := p.Size - 1
	x, xFull, w := b.Zeros(tensor.BFloat16, n, k), b.Zeros(tensor.BFloat16, p.Size*n, k), b.Zeros(tensor.BFloat16, m, k)
	out := b.Zeros(tensor.BFloat16, p.Size*n, m)
	// A first call on every rank: the stage's allocation is a world
	// collective, which the silent rank must not miss.
	if err := ag.Forward([]*tensor.Tensor{out}, xFull, x, []*tensor.Tensor{w}); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	if p.Rank == silent {
		fmt.Printf("deadline: %s: rank %d stays silent\n", transfer, p.Rank)
	} else {
		start := time.Now()
		err := ag.Forward([]*tensor.Tensor{out}, xFull, x, []*tensor.Tensor{w})
		if err == nil {
			err = b.Sync()
		}
		took := time.Since(start)
		want := fmt.Sprintf("rank %d never published", silent)
		if transfer == peercopy.TransferPut {
			want = fmt.Sprintf("rank %d never put its rows", silent)
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p.World.Name()) {
			fmt.Printf("deadline: %s: rank %d: FAIL: %v, expected an error naming %s and containing %q\n", transfer, p.Rank, err, p.World.Name(), want)
			os.Exit(1)
		}
		// The wait for the peers' shards, then the engine's chunk wait, each
		// give up after the deadline: at most about twice it.
		if took > 3*dl {
			fmt.Printf("deadline: %s: rank %d: FAIL: failed after %v, expected within about 2 × %v\n", transfer, p.Rank, took, dl)
			os.Exit(1)
		}
		fmt.Printf("deadline: %s: rank %d failed after %v: %v\n", transfer, p.Rank, took.Round(time.Millisecond), err)
	}
	// NVSHMEM cannot abort, and this rank's side stream may still wait for
	// the silent peer: leave everything to the process exit, after a host
	// barrier; rank 0 serves the store, so it leaves last.
	p.ExitAfterFailure("deadline-" + transfer)
}

func (p *pe) deadlineScatter(t *testing.T) {
	const dl = 2 * time.Second
	const n, k, m = 64, 256, 256
	b := p.B
	rs, err := peercopy.Engine{Timeout: dl}.NewMatmulReduceScatter(overlap.Spec{Kind: overlap.KindMatmulReduceScatter, Name: "deadline-rs",
		Group: p.World, Backend: b, Stream: b.Stream(), K: k, Outs: []int{m}, DType: tensor.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	x, w, out := b.Zeros(tensor.BFloat16, p.Size*n, k), b.Zeros(tensor.BFloat16, m, k), b.Zeros(tensor.BFloat16, n, m)
	// A first call on every rank (the stage's allocation is a world collective).
	if err := rs.Forward(out, x, w); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	silent := p.Size - 1
	if p.Rank == silent {
		fmt.Printf("deadline: rank %d stays silent\n", p.Rank)
	} else {
		start := time.Now()
		err := rs.Forward(out, x, w)
		if err == nil {
			err = b.Sync()
		}
		want := fmt.Sprintf("rank %d never published its partial rows", silent)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p.World.Name()) {
			fmt.Printf("deadline: rank %d: FAIL: %v, expected an error naming %s and containing %q\n", p.Rank, err, p.World.Name(), want)
			os.Exit(1)
		}
		fmt.Printf("deadline: rank %d failed after %v: %v\n", p.Rank, time.Since(start).Round(time.Millisecond), err)
	}
	p.ExitAfterFailure("deadline-scatter")
}

func (p *pe) determinism(t *testing.T) {
	for _, transfer := range peercopy.Transfers {
		p.determinismWith(t, transfer)
	}
}

func (p *pe) determinismWith(t *testing.T, transfer string) {
	const runs = 10
	const n, kl, cols = 200, 136, 264 // ragged: 128-row blocks straddle the destinations' rows
	b, P := p.B, p.Size
	rng := rand.New(rand.NewPCG(uint64(p.Rank)+1, 7))
	mk := func(r, c int) *tensor.Tensor {
		v := make([]float64, r*c)
		for i := range v {
			v[i] = rng.Float64()*2 - 1
		}
		h := tensor.MustHost(tensor.BFloat16, r, c)
		if err := h.SetFloat64s(v); err != nil {
			t.Fatal(err)
		}
		d := b.Zeros(tensor.BFloat16, r, c)
		b.Upload(d, h)
		return d
	}
	f := peercopy.Engine{Transfer: transfer}
	rs, err := f.NewMatmulReduceScatter(overlap.Spec{Kind: overlap.KindMatmulReduceScatter, Name: "det-rs", Group: p.World,
		Backend: b, Stream: b.Stream(), K: kl, Outs: []int{cols}, DType: tensor.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := f.NewAllGatherMatmul(overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "det-ag", Group: p.World,
		Backend: b, Stream: b.Stream(), K: cols, Outs: []int{kl}, DType: tensor.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	x, w, out := mk(P*n, kl), mk(cols, kl), b.Zeros(tensor.BFloat16, n, cols)
	xFull, w2, dout, dx, dw := mk(P*n, cols), mk(kl, cols), mk(P*n, kl), b.Zeros(tensor.BFloat16, n, cols), b.Zeros(tensor.BFloat16, kl, cols)
	// The gathers: the all-gather∘matmul forward of this rank's rows, and
	// the matmul∘reduce-scatter backward of this rank's dout rows.
	xs, agOut, gathered := mk(n, cols), b.Zeros(tensor.BFloat16, P*n, kl), b.Zeros(tensor.BFloat16, P*n, cols)
	douts, rsDx, rsDw := mk(n, cols), b.Zeros(tensor.BFloat16, P*n, kl), b.Zeros(tensor.BFloat16, cols, kl)
	bits := func(d *tensor.Tensor) []byte {
		h := tensor.MustHost(d.DType(), d.Shape()...)
		b.Download(h, d)
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		v, err := h.Float64s()
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, 0, 8*len(v))
		for _, f := range v {
			out = binary.LittleEndian.AppendUint64(out, math.Float64bits(f))
		}
		return out
	}
	names := []string{"matmul∘reduce-scatter forward", "all-gather∘matmul backward dx", "all-gather∘matmul forward out",
		"all-gather∘matmul forward gathered rows", "matmul∘reduce-scatter backward dx", "matmul∘reduce-scatter backward dw"}
	var first [][]byte
	for i := range runs {
		if err := rs.Forward(out, x, w); err != nil {
			t.Fatal(err)
		}
		b.Fill(dw, 0)
		wk, err := ag.Backward(dx, []*tensor.Tensor{dw}, []*tensor.Tensor{dout}, xFull, []*tensor.Tensor{w2})
		if err == nil {
			err = wk.Wait(b.Stream())
		}
		if err == nil {
			err = ag.Forward([]*tensor.Tensor{agOut}, gathered, xs, []*tensor.Tensor{w2})
		}
		if err == nil {
			b.Fill(rsDw, 0)
			wk, err = rs.Backward(rsDx, rsDw, douts, x, w)
		}
		if err == nil {
			err = wk.Wait(b.Stream())
		}
		if err == nil {
			err = b.Sync()
		}
		if err != nil {
			t.Fatalf("rank %d: %s: run %d: %v", p.Rank, transfer, i, err)
		}
		got := [][]byte{bits(out), bits(dx), bits(agOut), bits(gathered), bits(rsDx), bits(rsDw)}
		if i == 0 {
			first = got
			continue
		}
		for j, name := range names {
			if !bytes.Equal(got[j], first[j]) {
				t.Fatalf("rank %d: fused (%s) %s: run %d differs from run 0 (expected identical bits: fixed-order fp32 sums, every shard landed)", p.Rank, transfer, name, i)
			}
		}
	}
	fmt.Printf("determinism: rank %d: fused (%s transfer): %s identical over %d runs (rows %d/rank, K %d, N %d)\n",
		p.Rank, transfer, strings.Join(names, ", "), runs, n, kl, cols)
	ag.Close()
	rs.Close()
}

// bench times each strategy's forward and backward of the two TP sites at
// TP-shaped sizes, with CUDA events on the backend's stream, and the GEMM
// and the collective alone (for the ceiling (T_gemm+T_comm)/max).
func (p *pe) bench(t *testing.T) {
	const rows, k = 8192, 4096 // tokens of the whole sequence; the model width
	P := p.Size
	n := rows / P
	b := p.B
	mk := func(r, c int) *tensor.Tensor {
		h := tensor.MustHost(tensor.BFloat16, r, c)
		v := make([]float64, r*c)
		for i := range v {
			v[i] = float64((i*7919+p.Rank*31)%2001)/1000 - 1
		}
		_ = h.SetFloat64s(v)
		d := b.Zeros(tensor.BFloat16, r, c)
		b.Upload(d, h)
		return d
	}
	// all-gather∘matmul: q, k, v of width k·3/P each rank.
	m := 3 * k / P
	x, xFull, w, out := mk(n, k), mk(rows, k), mk(m, k), mk(rows, m)
	dout, dx, dw := mk(rows, m), mk(n, k), mk(m, k)
	// matmul∘reduce-scatter: the output projection, K = k/P on each rank.
	kl := k / P
	x2, w2, out2, dout2, dx2, dw2 := mk(rows, kl), mk(k, kl), mk(n, k), mk(n, k), mk(rows, kl), mk(k, kl)
	partial := mk(rows, k)

	row := func(name string, d time.Duration, err error) {
		if err != nil {
			t.Fatalf("rank %d: %s: %v", p.Rank, name, err)
		}
		fmt.Printf("bench: P=%d %-46s %8.1f µs\n", P, name, float64(d.Nanoseconds())/1e3)
	}
	const reps = 20
	sp := func(kind overlap.Kind, kk int, outs ...int) overlap.Spec {
		return overlap.Spec{Kind: kind, Name: "bench", Group: p.World, Backend: b, Stream: b.Stream(), K: kk, Outs: outs, DType: tensor.BFloat16}
	}
	shape := fmt.Sprintf("rows %d, K %d, N %d/rank", rows, k, m)
	d, err := p.Time(reps, func() error { b.MatMul(out, xFull, w, false, true, 1, 0); return nil })
	row("gemm alone, AG shape ("+shape+")", d, err)
	d, err = p.Time(reps, func() error { return b.EngineMatMul(out, xFull, w, false, true, 1, 0, cudabackend.GEMMOptions{}) })
	row("engine gemm alone, AG shape", d, err)
	d, err = p.Time(reps, func() error {
		wk, err := p.World.AllGather(xFull, x, b.Stream())
		if err == nil {
			err = wk.Wait(b.Stream())
		}
		return err
	})
	row("all-gather alone (NVSHMEM transport)", d, err)
	d, err = p.Time(reps, func() error { b.MatMul(partial, x2, w2, false, true, 1, 0); return nil })
	row(fmt.Sprintf("gemm alone, RS shape (rows %d, K %d/rank, N %d)", rows, kl, k), d, err)
	d, err = p.Time(reps, func() error { return b.EngineMatMul(partial, x2, w2, false, true, 1, 0, cudabackend.GEMMOptions{}) })
	row("engine gemm alone, RS shape", d, err)
	d, err = p.Time(reps, func() error {
		wk, err := p.World.ReduceScatter(out2, partial, comm.Sum, b.Stream())
		if err == nil {
			err = wk.Wait(b.Stream())
		}
		return err
	})
	row("reduce-scatter alone (NVSHMEM transport)", d, err)
	for _, s := range strategiesRun(t) {
		name := stratName(s)
		ag, err := s.NewAllGatherMatmul(sp(overlap.KindAllGatherMatmul, k, m))
		if err != nil {
			t.Fatal(err)
		}
		d, err := p.Time(reps, func() error {
			return ag.Forward([]*tensor.Tensor{out}, xFull, x, []*tensor.Tensor{w})
		})
		row(name+" all-gather∘matmul forward", d, err)
		d, err = p.Time(reps, func() error {
			wk, err := ag.Backward(dx, []*tensor.Tensor{dw}, []*tensor.Tensor{dout}, xFull, []*tensor.Tensor{w})
			if err == nil {
				err = wk.Wait(b.Stream())
			}
			return err
		})
		row(name+" all-gather∘matmul backward", d, err)
		rs, err := s.NewMatmulReduceScatter(sp(overlap.KindMatmulReduceScatter, kl, k))
		if err != nil {
			t.Fatal(err)
		}
		d, err = p.Time(reps, func() error { return rs.Forward(out2, x2, w2) })
		row(name+" matmul∘reduce-scatter forward", d, err)
		d, err = p.Time(reps, func() error {
			wk, err := rs.Backward(dx2, dw2, dout2, x2, w2)
			if err == nil {
				err = wk.Wait(b.Stream())
			}
			return err
		})
		row(name+" matmul∘reduce-scatter backward", d, err)
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		ag.Close()
		rs.Close()
	}
}
