package peerep

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/pes"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/tensor"
)

// The fused strategy on the GPU (PEs under MPS, as the other GPU tests of
// this package; the grouped GEMM engine needs an sm_90a GPU). The jobs run
// with the grouped GEMM on (the device step).

// TestFusedGPU: for EP 1, 2 and 4 ($ASYNCTP_OVERLAP_PES):
//   - the ExpertPath conformance suite on the fused Path (its host-count
//     methods: the counts sent on their own signal), bf16, ten repeats with
//     identical bits (not with ASYNCTP_FUSED_SUITE=0);
//   - the MoE layer's device step on the fused path (the grouped engine
//     waiting per 128-row block on the dispatch's counters, the combine sent
//     from the down projection's per-block flags) against the pipelined
//     device step (identical bits: the same GEMM tiles, the same fp32 sum at
//     home) and the collective path (within 1e-2), on uneven token counts
//     per rank, experts with no tokens, capacity drops, top-k 1, 2 and 8;
//     and ten fused runs of a fresh layer with identical bits.
func TestFusedGPU(t *testing.T) {
	pes.Each(t, sizes(t), "fused:", func(t *testing.T, n int) []string {
		return runPEs(t, "fused", n, groupedEnv+"=on")
	})
}

// TestFusedDeadlineGPU: the last PE never dispatches; every other PE's
// fused step must fail within the deadline with an error naming it.
func TestFusedDeadlineGPU(t *testing.T) {
	var multi []int
	for _, n := range sizes(t) {
		if n >= 2 {
			multi = append(multi, n)
		}
	}
	if len(multi) == 0 {
		t.Skip("the deadline test needs at least 2 PEs ($ASYNCTP_OVERLAP_PES)")
	}
	pes.Each(t, multi, "fused deadline:", func(t *testing.T, n int) []string {
		return runPEs(t, "fuseddeadline", n, groupedEnv+"=on")
	})
}

func newFusedPath(c eptest.Config) (ep.ExpertPath, error) {
	return fusedStrategy().NewExpertPath(ep.ExpertConfig{Name: "moe", Backend: c.Backend, Stream: c.Stream, Group: c.Group,
		Tokens: c.Tokens, Experts: c.Experts, Cols: c.Cols, MaxTokens: c.MaxTokens})
}

// fusedCase is one layer comparison: shape s (s.N the most tokens of a
// rank), rank r routing tokens(r) tokens, capacity factor cf.
type fusedCase struct {
	s      moeShape
	cf     float64
	tokens func(rank, size int) int
}

func (c fusedCase) String() string {
	return fmt.Sprintf("E%d top-%d C%d F%d ≤%d tok/rank cf %v", c.s.E, c.s.K, c.s.C, c.s.F, c.s.N, c.cf)
}

// layerRun is one fresh layer's forward and backward on this rank.
type layerRun struct {
	what             string
	out, dx          []float64
	grads            [][]float64
	dropped, tokens  int
	routed           []int
	deviceStep, path bool
}

// runLayer builds the layer of case c with strategy st (nil: collective),
// runs one forward and backward on this rank's n tokens and reads back the
// output, the input gradient and the parameters' gradients.
func runLayer(b tensor.Backend, g comm.Comm, stream comm.Stream, c fusedCase, st overlap.Strategy) (*layerRun, error) {
	n := c.tokens(g.Rank(), g.Size())
	cfg := benchConfig(c.s)
	cfg.CapacityFactor = c.cf
	cfg.Std = 0.5 // a router far from uniform: uneven routing, empty experts
	ps := layers.NewParamSet(13)
	par := ep.Parallel{Group: g, MaxTokens: c.s.N, Stream: stream}
	if st != nil {
		par.Overlap = overlap.Single(st)
	}
	m, err := ep.New(b, ps, par, "fused.moe", cfg)
	if err != nil {
		return nil, err
	}
	if err := ps.Materialize(b, tensor.BFloat16); err != nil {
		return nil, err
	}
	sh := c.s
	sh.N = n
	x, dout := b.Zeros(tensor.BFloat16, n, sh.C), b.Zeros(tensor.BFloat16, n, sh.C)
	for i, dst := range []*tensor.Tensor{x, dout} {
		h := tensor.MustHost(tensor.BFloat16, n, sh.C)
		if err := h.SetFloat64s(benchInput(sh, g.Rank(), i)); err != nil {
			return nil, err
		}
		b.Upload(dst, h)
	}
	out, dx := b.Zeros(tensor.BFloat16, n, sh.C), b.Zeros(tensor.BFloat16, n, sh.C)
	if err := m.Forward(out, x); err != nil {
		return nil, err
	}
	if err := m.Backward(dx, dout); err != nil {
		return nil, err
	}
	r := &layerRun{out: gpuVals(b, out), dx: gpuVals(b, dx), deviceStep: m.DeviceStep()}
	_, r.path = m.Dispatch.(*Path)
	for _, p := range m.Params() {
		r.grads = append(r.grads, gpuVals(b, p.G))
	}
	st2 := m.Stats()
	r.dropped, r.tokens, r.routed = st2.Dropped, st2.Tokens, st2.TokensPerExpert
	w, gr := ps.Flat()
	for _, t := range []*tensor.Tensor{x, dout, out, dx, w, gr} {
		b.Free(t)
	}
	if cl, ok := m.Dispatch.(interface{ Close() error }); ok {
		if err := cl.Close(); err != nil {
			return nil, err
		}
	}
	return r, b.Err()
}

// relDiff is ‖a − b‖ / ‖b‖ (NaN anywhere: +Inf).
func relDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d, n float64
	for i := range a {
		if math.IsNaN(a[i]) || math.IsNaN(b[i]) {
			return math.Inf(1)
		}
		d += (a[i] - b[i]) * (a[i] - b[i])
		n += b[i] * b[i]
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}

func sameBits(a, b []float64) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return i
		}
	}
	return -1
}

func fusedCases() []fusedCase {
	uneven := func(N int) func(r, P int) int { return func(r, P int) int { return max(1, N*(r+1)/P) } }
	return []fusedCase{
		{moeShape{E: 8, K: 2, C: 256, F: 512, N: 640}, 0, uneven(640)},
		{moeShape{E: 8, K: 1, C: 512, F: 256, N: 512}, 0, uneven(512)},
		{moeShape{E: 16, K: 8, C: 256, F: 256, N: 384}, 0, uneven(384)},
		{moeShape{E: 16, K: 2, C: 256, F: 512, N: 512}, 1.0, uneven(512)},  // capacity drops
		{moeShape{E: 64, K: 1, C: 256, F: 256, N: 48}, 0, uneven(48)},      // experts with no tokens
		{moeShape{E: 8, K: 2, C: 768, F: 512, N: 1024}, 0.5, uneven(1024)}, // drops, several column tiles
	}
}

func (p *pe) fused(t *testing.T) {
	if os.Getenv("ASYNCTP_FUSED_SUITE") != "0" {
		p.fusedSuite(t)
	}
	p.fusedLayers(t)
}

// fusedSuite is the ExpertPath conformance suite on the fused Path (skipped
// with ASYNCTP_FUSED_SUITE=0: scripts/gpu-moe-fused.sh's short run).
func (p *pe) fusedSuite(t *testing.T) {
	eptest.Steps = []int{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	start := time.Now()
	r := eptest.Rank{Group: p.World, Backend: p.B, Stream: p.B.Stream(), NewPath: newFusedPath, DType: tensor.BFloat16, Seed: 11,
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }}
	err := r.CheckAll()
	if err == nil {
		err = p.B.Sync()
	}
	if err != nil {
		t.Fatalf("rank %d: fused conformance suite: %v", p.Rank, err)
	}
	fmt.Printf("fused: rank %d: conformance suite bf16 passed (%v)\n", p.Rank, time.Since(start).Round(time.Millisecond))
}

// fusedLayers compares the MoE layer's fused device step with the
// pipelined one and the collective path (see TestFusedGPU).
func (p *pe) fusedLayers(t *testing.T) {
	for _, c := range fusedCases() {
		if c.s.E%p.Size != 0 {
			continue
		}
		b, g, s := p.B, p.World, p.B.Stream()
		col, err := runLayer(b, g, s, c, nil)
		if err != nil {
			t.Fatalf("rank %d: %v collective: %v", p.Rank, c, err)
		}
		pip, err := runLayer(b, g, s, c, pipelinedStrategy())
		if err != nil {
			t.Fatalf("rank %d: %v pipelined: %v", p.Rank, c, err)
		}
		fus, err := runLayer(b, g, s, c, fusedStrategy())
		if err != nil {
			t.Fatalf("rank %d: %v fused: %v", p.Rank, c, err)
		}
		if !fus.path || !fus.deviceStep || !pip.deviceStep {
			t.Fatalf("rank %d: %v: fused path %v, device steps fused %v pipelined %v: expected the device step on peerep paths", p.Rank, c, fus.path, fus.deviceStep, pip.deviceStep)
		}
		check := func(what string, got, want []float64) {
			if i := sameBits(got, want); i >= 0 {
				t.Fatalf("rank %d: %v: fused %s[%d] = %v, pipelined %v: expected identical bits", p.Rank, c, what, i, got[min(i, len(got)-1)], want[min(i, len(want)-1)])
			}
		}
		check("out", fus.out, pip.out)
		check("dx", fus.dx, pip.dx)
		worst := max(relDiff(fus.out, col.out), relDiff(fus.dx, col.dx))
		for i := range pip.grads {
			check(fmt.Sprintf("grad %d", i), fus.grads[i], pip.grads[i])
			worst = max(worst, relDiff(fus.grads[i], col.grads[i]))
		}
		if !(worst <= 1e-2) {
			t.Fatalf("rank %d: %v: fused against collective: ‖Δ‖/‖ref‖ = %.3g, expected ≤ 1e-2", p.Rank, c, worst)
		}
		empty := 0
		for _, k := range fus.routed {
			if k == 0 {
				empty++
			}
		}
		for rep := 1; rep < 10; rep++ {
			again, err := runLayer(b, g, s, c, fusedStrategy())
			if err != nil {
				t.Fatalf("rank %d: %v fused run %d: %v", p.Rank, c, rep, err)
			}
			check("out (repeat)", again.out, fus.out)
			check("dx (repeat)", again.dx, fus.dx)
			for i := range fus.grads {
				check(fmt.Sprintf("grad %d (repeat)", i), again.grads[i], fus.grads[i])
			}
		}
		fmt.Printf("fused: rank %d: %v: = pipelined bit for bit, %.2g from collective, 10 runs identical; %d tokens, %d empty experts, %d dropped\n",
			p.Rank, c, worst, fus.tokens, empty, fus.dropped)
	}
}

// fuseddeadline: the last PE builds the path and stays silent; every other
// PE's fused step must fail at the deadline naming it.
func (p *pe) fuseddeadline(t *testing.T) {
	const dl = 2 * time.Second
	ps, err := fusedStrategy(WithDeadline(dl)).NewExpertPath(ep.ExpertConfig{Name: "moe", Backend: p.B, Stream: p.B.Stream(),
		Group: p.World, Experts: 2 * p.Size, Cols: 256, MaxTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	path := ps.(*Path)
	silent := p.Size - 1
	if err := path.ensure(2, 256, tensor.BFloat16); err != nil {
		t.Fatal(err)
	}
	if p.Rank == silent {
		fmt.Printf("fused deadline: rank %d stays silent\n", p.Rank)
	} else {
		idx := make([]int32, 256*2)
		for i := range idx {
			idx[i] = int32((i/2)%p.Size*2 + i%2)
		}
		h, _ := tensor.FromInt32(idx, 256, 2)
		di := p.B.Zeros(tensor.Int32, 256, 2)
		p.B.Upload(di, h)
		x := p.B.Zeros(tensor.BFloat16, 256, 256)
		w := p.B.Zeros(tensor.BFloat16, 2, 256, 256)
		start := time.Now()
		xe, hd, hooks, err := path.DispatchFused(x, di, 0)
		if err == nil {
			c := p.B.Zeros(tensor.BFloat16, hd.Bound, 256)
			err = hooks.First(c, xe, w, hd.Offsets)
		}
		if err == nil {
			err = p.B.Sync()
		}
		want := fmt.Sprintf("rank %d never signalled", silent)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("rank %d: a fused step whose peer %d never sends: %v, expected an error containing %q", p.Rank, silent, err, want)
		}
		fmt.Printf("fused deadline: rank %d failed after %v: %v\n", p.Rank, time.Since(start).Round(time.Millisecond), err)
	}
	p.ExitAfterFailure("fused deadline")
}

// gpuVals reads a float tensor back as float64s.
func gpuVals(b tensor.Backend, t *tensor.Tensor) []float64 {
	h := tensor.MustHost(tensor.Float64, t.Shape()...)
	b.Download(h, t)
	return h.F64()
}
