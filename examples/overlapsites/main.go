// Command overlapsites chooses a strategy per communication site of a
// tensor-parallel MLP under sequence parallelism, on two ranks (goroutines
// of this process): the all-gather that enters the MLP overlapped with its
// GEMMs (pipelined), the reduce-scatter that leaves it as the plain
// collective. It checks that the output and the gradients equal those of
// the MLP with every site collective, prints which strategy each site got,
// and exits with status 1 when they differ.
package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const (
	P            = 2
	dim, hidden  = 8, 16
	tokens       = 6 // per rank: sequence parallelism splits the rows
	dt           = tensor.Float64
	seed, inSeed = 5, 9
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "overlapsites:", err)
		os.Exit(1)
	}
}

// mlpStep builds the MLP over c with the chooser ch and returns its output,
// its input gradient and its weight gradients on this rank.
func mlpStep(c comm.Comm, ch *overlap.Chooser) ([]float64, error) {
	b, ps := cpu.New(), layers.NewParamSet(seed)
	par := tp.Parallel{Group: c, SequenceParallel: true, Overlap: ch}
	m, err := tp.NewMLP(b, ps, par, "mlp", layers.MLPConfig{Dim: dim, Hidden: hidden, Std: 0.4, OutStd: 0.4})
	if err != nil {
		return nil, err
	}
	if err := ps.Materialize(b, dt); err != nil {
		return nil, err
	}
	x := tensor.MustHost(dt, tokens, dim) // this rank's rows
	for i := range x.F64() {
		x.F64()[i] = math.Sin(float64(inSeed*(i+1) + c.Rank()*100))
	}
	out, dx := b.Zeros(dt, tokens, dim), b.Zeros(dt, tokens, dim)
	if err := m.Forward(out, x); err != nil {
		return nil, err
	}
	if err := m.Backward(dx, out); err != nil { // the gradient of ½‖out‖²
		return nil, err
	}
	vals := append(append([]float64(nil), out.F64()...), dx.F64()...)
	for _, p := range m.Params() {
		vals = append(vals, p.G.F64()...)
	}
	// the sites' lanes (and, on GPUs, streams and symmetric buffers):
	// every rank closes them
	return vals, errors.Join(b.Err(), m.Close())
}

func run() error {
	// The strategies, one per name (the registry): each says per site
	// whether it can run there. Pipelined runs on the CPU too (its chunks
	// on goroutines); fused needs GPUs with symmetric memory.
	all := strategies.All(strategies.Options{})
	cfg := overlap.Config{Sites: map[string]string{
		string(overlap.KindAllGatherMatmul):     "pipelined",
		string(overlap.KindMatmulReduceScatter): "collective",
	}}
	want, got := make([][]float64, P), make([][]float64, P)
	var summary []string
	err := local.Run(P, func(c comm.Comm) error {
		ch, err := overlap.NewChooser(cfg, all, nil)
		if err != nil {
			return err
		}
		if got[c.Rank()], err = mlpStep(c, ch); err != nil {
			return err
		}
		if err := ch.CheckUsed(); err != nil { // every key of cfg.Sites chose a site
			return err
		}
		if c.Rank() == 0 {
			summary = ch.Summary()
		}
		want[c.Rank()], err = mlpStep(c, overlap.Single(overlap.Collective{}))
		return err
	})
	if err != nil {
		return err
	}
	worst := 0.0
	for r := range P {
		for i, w := range want[r] {
			worst = max(worst, math.Abs(got[r][i]-w)/(math.Abs(w)+1e-9))
		}
	}
	fmt.Printf("sites: %s\nper-site choice against all collective: largest relative difference %.1e\n", strings.Join(summary, "; "), worst)
	if !(worst <= 1e-9) {
		return fmt.Errorf("the per-site strategies differ from collective by %.3g, expected ≤ 1e-9", worst)
	}
	return nil
}
