// Command expertparallel runs a mixture-of-experts layer split over two
// expert-parallel ranks (goroutines of this process; each holds half of
// the experts and brings its own tokens) and the same layer on one rank
// over all the tokens, from the same seed, and checks that the outputs,
// the input gradients and the parameters' gradients agree. It exits with
// status 1 when they differ.
package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const (
	P    = 2 // expert-parallel ranks
	n    = 5 // tokens per rank
	seed = 3
	dt   = tensor.Float64
)

var cfg = layers.MoEConfig{Dim: 8, Hidden: 12, Experts: 4, TopK: 2, AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "expertparallel:", err)
		os.Exit(1)
	}
}

// tokens returns rank r's input rows and output gradients (P·n rows for
// the one-rank layer, r = -1).
func tokens(r int) (x, dout *tensor.Tensor) {
	lo, hi := 0, P*n
	if r >= 0 {
		lo, hi = r*n, (r+1)*n
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	xv, dv := make([]float64, P*n*cfg.Dim), make([]float64, P*n*cfg.Dim)
	for i := range xv {
		xv[i], dv[i] = rng.NormFloat64(), rng.NormFloat64()
	}
	C := cfg.Dim
	x, _ = tensor.FromFloat64(xv[lo*C:hi*C], hi-lo, C)
	dout, _ = tensor.FromFloat64(dv[lo*C:hi*C], hi-lo, C)
	return x, dout
}

// result is what a layer gives: its output and input gradient rows, and
// its parameters' gradients as pieces of the full layer's.
type result struct {
	out, dx []float64
	grads   []shard.Piece
}

// step runs a forward and a backward of layer over rank r's tokens.
func step(b tensor.Backend, layer layers.Layer, shards []shard.Shard, r int) (result, error) {
	x, dout := tokens(r)
	out, dx := b.Zeros(dt, x.Shape()...), b.Zeros(dt, x.Shape()...)
	if err := layer.Forward(out, x); err != nil {
		return result{}, err
	}
	if err := layer.Backward(dx, dout); err != nil {
		return result{}, err
	}
	res := result{out: out.F64(), dx: dx.F64()}
	for _, s := range shards {
		g, _ := tensor.FromFloat64(append([]float64(nil), s.Param.G.F64()...), s.Param.Shape()...)
		res.grads = append(res.grads, shard.Piece{Name: s.Param.Name, Slice: s.Slice(), Tensor: g})
	}
	return res, b.Err()
}

func run() error {
	b, ps := cpu.New(), layers.NewParamSet(seed)
	one, err := layers.NewMoE(b, ps, "moe", cfg)
	if err != nil {
		return err
	}
	if err := ps.Materialize(b, dt); err != nil {
		return err
	}
	want, err := step(b, one, shard.Whole(one.Params()), -1)
	if err != nil {
		return err
	}
	got := make([]result, P)
	err = local.Run(P, func(c comm.Comm) error {
		b, ps := cpu.New(), layers.NewParamSet(seed)
		m, err := ep.New(b, ps, ep.Parallel{Group: c}, "moe", cfg)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, dt); err != nil {
			return err
		}
		got[c.Rank()], err = step(b, m, m.Shards(), c.Rank())
		return err
	})
	if err != nil {
		return err
	}
	worst := 0.0
	diff := func(a, b []float64) {
		for i := range a {
			worst = max(worst, math.Abs(a[i]-b[i])/(math.Abs(b[i])+1e-9))
		}
	}
	for r := range P {
		C := cfg.Dim
		diff(got[r].out, want.out[r*n*C:(r+1)*n*C])
		diff(got[r].dx, want.dx[r*n*C:(r+1)*n*C])
	}
	// The experts' gradients are slices of the full layer's; the router's
	// gradient on each rank covers that rank's tokens: their sum is the
	// full layer's.
	for _, w := range want.grads {
		full := w.Tensor.F64()
		sum := make([]float64, len(full))
		var experts []shard.Piece
		for r := range P {
			for _, g := range got[r].grads {
				switch {
				case g.Name != w.Name:
				case g.Slice.Whole():
					for i, v := range g.Tensor.F64() {
						sum[i] += v
					}
				default:
					experts = append(experts, g)
				}
			}
		}
		if len(experts) > 0 {
			merged, err := shard.Merge(experts)
			if err != nil {
				return err
			}
			sum = merged[w.Name].F64()
		}
		diff(sum, full)
	}
	fmt.Printf("EP %d against one rank over %d tokens: largest relative difference %.1e\n", P, P*n, worst)
	if !(worst <= 1e-9) {
		return fmt.Errorf("EP %d differs from one rank by %.3g, expected ≤ 1e-9", P, worst)
	}
	return nil
}
