package peerep

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/pes"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// The MoE benchmark's body on CPU ranks at a tiny shape: the layer it
// builds computes, on each of 2 ranks, the rows of layers.MoE over both
// ranks' tokens (same seed, same names) — the benchmark times the real
// layer — and the timing loop returns one line per strategy with a
// positive median; the pipelined strategy is unavailable on the CPU, and
// the benchmark refuses to time the collective path in its place.
func TestMoEBenchBodyCPU(t *testing.T) {
	s := moeShape{E: 4, K: 2, C: 8, F: 12, N: 5}
	const P = 2
	outs := make([][]float64, P)
	var mu sync.Mutex
	err := local.Run(P, func(c comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		l, err := newBenchLayer(b, c, nil, s, tensor.Float32, nil)
		if err != nil {
			return err
		}
		if got := l.strategy(); got != "collective, grouped GEMM, host counts" {
			return fmt.Errorf("strategy %q, want the collective path with the CPU's grouped GEMM", got)
		}
		if err := l.step(); err != nil {
			return err
		}
		h := tensor.MustHost(tensor.Float64, s.N, s.C)
		b.Download(h, l.out)
		mu.Lock()
		outs[c.Rank()] = h.F64()
		mu.Unlock()
		if err := l.close(); err != nil {
			return err
		}
		lines, err := benchMoE(b, c, nil, s, tensor.Float32, []overlap.Strategy{nil}, 1, 3, pes.WallTimer(b.Sync), false)
		if err != nil {
			return err
		}
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "bench: P=2 moe fwd+bwd 5 tok/rank, hidden 8, ffn 12, top-2 of 4") ||
			!strings.Contains(lines[0], "(collective, grouped GEMM, host counts)") || !strings.HasSuffix(lines[0], "µs") {
			return fmt.Errorf("bench lines %q", lines)
		}
		if _, err := benchMoE(b, c, nil, s, tensor.Float32, []overlap.Strategy{pipelinedStrategy()}, 1, 1, pes.WallTimer(b.Sync), false); err == nil ||
			!strings.Contains(err.Error(), "strategy pipelined: the layer's expert path is *ep.Dispatcher") {
			return fmt.Errorf("the pipelined layer on the CPU: %v, want a refusal (the chooser keeps collective)", err)
		}
		t.Log(lines[0])
		return nil
	}, local.WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	// The reference: the single-rank layer over both ranks' tokens.
	b, ps := cpu.New(), layers.NewParamSet(7)
	ref, err := layers.NewMoE(b, ps, "bench.moe", benchConfig(s))
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	var x []float64
	for r := range P {
		x = append(x, benchInput(s, r, 0)...)
	}
	xt := b.Zeros(tensor.Float32, P*s.N, s.C)
	h, _ := tensor.FromFloat64(x, P*s.N, s.C)
	b.Upload(xt, h)
	out := b.Zeros(tensor.Float32, P*s.N, s.C)
	if err := ref.Forward(out, xt); err != nil {
		t.Fatal(err)
	}
	want := tensor.MustHost(tensor.Float64, P*s.N, s.C)
	b.Download(want, out)
	for r := range P {
		for i, g := range outs[r] {
			w := want.F64()[r*s.N*s.C+i]
			if w == 0 || !(math.Abs(g-w) <= 1e-5*max(1, math.Abs(w))) {
				t.Fatalf("rank %d out[%d] = %v, layers.MoE %v", r, i, g, w)
			}
		}
	}
}

// moeBenchShapes: the defaults, and the environment's, refused when bad.
func TestMoEBenchShapes(t *testing.T) {
	t.Setenv("ASYNCTP_MOEBENCH_SHAPES", "")
	t.Setenv("ASYNCTP_MOEBENCH_TOKENS", "")
	s, err := moeBenchShapes()
	if err != nil || len(s) != 4 || s[0] != (moeShape{E: 8, K: 2, C: 2048, F: 2048, N: 4096}) || s[3] != (moeShape{E: 64, K: 8, C: 4096, F: 256, N: 4096}) {
		t.Errorf("defaults %v, %v", s, err)
	}
	t.Setenv("ASYNCTP_MOEBENCH_SHAPES", "16,4,1024,512")
	t.Setenv("ASYNCTP_MOEBENCH_TOKENS", "128")
	if s, err := moeBenchShapes(); err != nil || len(s) != 1 || s[0] != (moeShape{E: 16, K: 4, C: 1024, F: 512, N: 128}) {
		t.Errorf("from the environment: %v, %v", s, err)
	}
	t.Setenv("ASYNCTP_MOEBENCH_SHAPES", "4,8,1024,512")
	if _, err := moeBenchShapes(); err == nil || !strings.Contains(err.Error(), "1 ≤ K ≤ E") {
		t.Errorf("top-8 of 4: %v, want a refusal", err)
	}
}
