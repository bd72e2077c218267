package peerep

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/pes"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The body of the MoE layer benchmark (the GPU job moebench in
// gpu_test.go): one ep.MoE layer's forward and backward — router, dispatch,
// expert GEMMs, SwiGLU, combine and their backwards — timed per strategy.
// It takes any backend and timer, so the CPU test below runs it at tiny
// sizes (and the emulator test the pipelined path).

// moeShape is one benchmarked layer: E experts, top-K, width C, expert
// hidden width F, N tokens per rank.
type moeShape struct{ E, K, C, F, N int }

func (s moeShape) String() string {
	return fmt.Sprintf("%d tok/rank, hidden %d, ffn %d, top-%d of %d", s.N, s.C, s.F, s.K, s.E)
}

// moeBenchShapes are the GPU job's shapes: Mixtral-like (8 experts, top-2)
// and fine-grained (64 experts, top-8) at widths 2048 and 4096, with the
// expert widths chosen so each layer holds at most ~200M expert
// parameters (its host initialisation stays a few seconds).
// $ASYNCTP_MOEBENCH_SHAPES ("E,K,C,F;...") and $ASYNCTP_MOEBENCH_TOKENS
// (default 4096) replace them.
func moeBenchShapes() ([]moeShape, error) {
	n := 4096
	if v := os.Getenv("ASYNCTP_MOEBENCH_TOKENS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return nil, fmt.Errorf("ASYNCTP_MOEBENCH_TOKENS=%q: expected a positive number of tokens per rank", v)
		}
	}
	spec := cmpOr(os.Getenv("ASYNCTP_MOEBENCH_SHAPES"), "8,2,2048,2048;8,2,4096,2048;64,8,2048,512;64,8,4096,256")
	var out []moeShape
	for _, f := range strings.Split(spec, ";") {
		var s moeShape
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d,%d,%d,%d", &s.E, &s.K, &s.C, &s.F); err != nil || s.E < 1 || s.K < 1 || s.K > s.E || s.C < 1 || s.F < 1 {
			return nil, fmt.Errorf("ASYNCTP_MOEBENCH_SHAPES=%q: %q: expected E,K,C,F with 1 ≤ K ≤ E and positive widths", spec, f)
		}
		s.N = n
		out = append(out, s)
	}
	return out, nil
}

// benchLayer is one MoE layer of a rank with its inputs and outputs.
type benchLayer struct {
	b                tensor.Backend
	m                *ep.MoE
	ps               *layers.ParamSet
	x, dout, out, dx *tensor.Tensor
}

// benchConfig is the layer configuration of shape s (the tiny-moe
// preset's loss coefficients, dropless).
func benchConfig(s moeShape) layers.MoEConfig {
	return layers.MoEConfig{Dim: s.C, Hidden: s.F, Experts: s.E, TopK: s.K, AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.02, OutStd: 0.02}
}

// benchInput is rank's random x or dout (N, C) of shape s.
func benchInput(s moeShape, rank, which int) []float64 {
	rng := rand.New(rand.NewPCG(uint64(rank)+1, uint64(which)))
	v := make([]float64, s.N*s.C)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

// newBenchLayer builds the MoE layer of shape s over the EP group g with
// the expert-path strategy st (nil: collective), its parameters
// materialized in dt from seed 7, and this rank's random inputs.
func newBenchLayer(b tensor.Backend, g comm.Comm, stream comm.Stream, s moeShape, dt tensor.DType, st overlap.Strategy) (*benchLayer, error) {
	ps := layers.NewParamSet(7)
	par := ep.Parallel{Group: g, MaxTokens: s.N, Stream: stream}
	if st != nil {
		par.Overlap = overlap.Single(st)
	}
	m, err := ep.New(b, ps, par, "bench.moe", benchConfig(s))
	if err != nil {
		return nil, err
	}
	if err := ps.Materialize(b, dt); err != nil {
		return nil, err
	}
	l := &benchLayer{b: b, m: m, ps: ps, out: b.Zeros(dt, s.N, s.C), dx: b.Zeros(dt, s.N, s.C)}
	for i, dst := range []**tensor.Tensor{&l.x, &l.dout} {
		h := tensor.MustHost(dt, s.N, s.C)
		if err := h.SetFloat64s(benchInput(s, g.Rank(), i)); err != nil {
			return nil, err
		}
		*dst = b.Zeros(dt, s.N, s.C)
		b.Upload(*dst, h)
	}
	return l, b.Err()
}

// step is the timed work: the layer's forward and backward (the
// parameters' gradients accumulate over the repetitions).
func (l *benchLayer) step() error {
	if err := l.m.Forward(l.out, l.x); err != nil {
		return err
	}
	return l.m.Backward(l.dx, l.dout)
}

// strategy says which expert path runs and whether its step reads counts
// on the host.
func (l *benchLayer) strategy() string {
	name := "collective"
	if p, ok := l.m.Dispatch.(*Path); ok {
		name = "pipelined"
		if p.Fused() {
			name = "fused"
		}
	}
	gemm := "per-expert GEMMs"
	if l.m.Experts.Grouped() {
		gemm = "grouped GEMM"
	}
	step := "host counts"
	if l.m.DeviceStep() {
		step = "device step"
	}
	return fmt.Sprintf("%s, %s, %s", name, gemm, step)
}

// close frees what the benchmark allocated: the inputs and outputs, the
// parameters' flat buffers and the path's (symmetric) buffers. The
// layer's own scratch stays until the process exits.
func (l *benchLayer) close() error {
	w, g := l.ps.Flat()
	for _, t := range []*tensor.Tensor{l.x, l.dout, l.out, l.dx, w, g} {
		l.b.Free(t)
	}
	var err error
	if c, ok := l.m.Dispatch.(io.Closer); ok {
		err = c.Close()
	}
	return errors.Join(err, l.b.Err())
}

// benchMoE times shape s on this rank for each strategy of sts (nil:
// collective) and returns one "bench:" line per strategy; with phases, on
// the CUDA backend, reps more steps run under a phase timer and a
// "bench-phase:" line per phase follows (its time per step, on the
// backend's stream: see cudabackend.PhaseTimes).
func benchMoE(b tensor.Backend, g comm.Comm, stream comm.Stream, s moeShape, dt tensor.DType, sts []overlap.Strategy, warm, reps int,
	timed pes.Timer, phases bool) ([]string, error) {
	var lines []string
	for _, st := range sts {
		l, err := newBenchLayer(b, g, stream, s, dt, st)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", s, err)
		}
		what := l.strategy()
		if _, ok := l.m.Dispatch.(*Path); st != nil && !ok {
			l.close()
			return nil, fmt.Errorf("%v: strategy %s: the layer's expert path is %T (the chooser kept collective: the strategy is unavailable here), expected *peerep.Path", s, st.Name(), l.m.Dispatch)
		}
		d, err := pes.Median(warm, reps, b.Sync, g.Barrier, timed, l.step)
		if err != nil {
			return nil, fmt.Errorf("%v, %s: %w", s, what, err)
		}
		head := fmt.Sprintf("P=%d moe fwd+bwd %-44s (%s)", g.Size(), s.String(), what)
		var phaseLines []string
		if cb, ok := b.(*cudabackend.Backend); ok && phases {
			if phaseLines, err = benchPhases(cb, g, head, reps, l.step); err != nil {
				l.close()
				return nil, fmt.Errorf("%v, %s: phases: %w", s, what, err)
			}
		}
		if err := l.close(); err != nil {
			return nil, fmt.Errorf("%v, %s: %w", s, what, err)
		}
		lines = append(lines, fmt.Sprintf("bench: %s %10.1f µs", head, float64(d.Nanoseconds())/1e3))
		lines = append(lines, phaseLines...)
	}
	return lines, nil
}

// benchPhases runs reps steps under a phase timer, after a sync and a
// barrier, and returns a "bench-phase:" line per phase: its time per step.
func benchPhases(b *cudabackend.Backend, g comm.Comm, head string, reps int, step func() error) ([]string, error) {
	if err := b.Sync(); err != nil {
		return nil, err
	}
	if err := g.Barrier(); err != nil {
		return nil, err
	}
	pt, err := b.StartPhases()
	if err != nil {
		return nil, err
	}
	for range reps {
		if err := step(); err != nil {
			pt.Stop()
			return nil, err
		}
	}
	ph, err := pt.Stop()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range ph {
		out = append(out, fmt.Sprintf("bench-phase: %s %-26s %10.1f µs/step (%d marks)", head, p.Name,
			float64(p.Total.Nanoseconds())/1e3/float64(reps), p.Count))
	}
	return out, nil
}
