package model_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// smallConfig is the model of the tests: 2 layers, width 32, 4 heads,
// vocabulary 64, FFN 64 (all divisible by 4).
func smallConfig() layers.GPTConfig {
	return layers.GPTConfig{Layers: 2, Dim: 32, Heads: 4, Vocab: 64, Seq: 8, FFN: 64, InitStd: 0.1, Seed: 11}
}

// layout is one parallel configuration (ep 0 means 1). stream, when set,
// is the model's Options.Stream.
type layout struct {
	tp, dp int
	sp     bool
	ep     int
	stream comm.Stream
	// overlap is the strategy of every site ("" is collective).
	overlap string
	// distOpt is Options.DistributedOptimizer; bucketBytes the
	// reduction's buckets (0: the default).
	distOpt     bool
	bucketBytes int
}

func (l layout) String() string {
	s := fmt.Sprintf("tp=%d/dp=%d/sp=%v", l.tp, l.dp, l.sp)
	if l.ep > 1 {
		s = fmt.Sprintf("tp=%d/dp=%d/ep=%d/sp=%v", l.tp, l.dp, l.ep, l.sp)
	}
	if l.overlap != "" {
		s += "/" + l.overlap
	}
	if l.distOpt {
		s += "/distopt"
	}
	return s
}

// strategyNames are the overlap strategies every sharded-equals-single-rank
// test runs with.
var strategyNames = []string{"collective", "pipelined"}

// onGrid runs fn on each rank of a local world of dp·tp ranks, each with
// its own CPU backend and grid, and returns the ranks' errors.
func onGrid(l layout, fn func(b tensor.Backend, g *comm.Grid) error, opts ...local.Option) error {
	return local.Run(l.tp*l.dp, func(c comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		g, err := comm.NewGrid(c, l.dp, l.tp, max(l.ep, 1))
		if err != nil {
			return err
		}
		defer g.Close()
		if err := fn(b, g); err != nil {
			return err
		}
		return b.Err()
	}, append([]local.Option{local.WithTimeout(30 * time.Second)}, opts...)...)
}

// newModel builds the sharded model of cfg on a rank.
func newModel(b tensor.Backend, g *comm.Grid, cfg layers.GPTConfig, l layout, dt tensor.DType) (*model.Model, error) {
	ch, err := overlap.NewChooser(overlap.Config{Default: l.overlap}, []overlap.Strategy{strategies.Pipelined{}}, nil)
	if err != nil {
		return nil, err
	}
	return model.New(b, g, cfg, model.Options{SequenceParallel: l.sp, Stream: l.stream, Overlap: ch,
		DistributedOptimizer: l.distOpt, GradReduce: grads.Config{BucketBytes: l.bucketBytes}}, dt)
}

// batch returns a global batch (B, T) of ids and targets drawn from seed;
// a few targets are negative (ignored).
func batch(seed uint64, B, T, V int) (ids, targets *tensor.Tensor) {
	ids = testutil.RandInts(testutil.Rng(seed), V, B, T)
	targets = testutil.RandInts(testutil.Rng(seed+1), V, B, T)
	targets.I32()[3] = -1
	targets.I32()[len(targets.I32())-2] = -1
	return ids, targets
}

// relErr is the relative error of two scalars.
func relErr(got, want float64) float64 { return testutil.RelErr([]float64{got}, []float64{want}) }

// reference is what the unsharded model computes on a global batch.
type reference struct {
	loss      float64
	logits    []float64 // (B*T, V)
	w, g      map[string][]float64
	sumSquare float64
	aux       float64
	stats     []layers.MoEStats
}

// tweakFunc changes a model's parameters after its initialisation (the
// same change on the reference and on every rank).
type tweakFunc func(b tensor.Backend, ps *layers.ParamSet) error

// referenceGPT is the single-rank GPT of cfg on the CPU, tweaked (tweak may
// be nil): the reference model of every layout.
func referenceGPT(t *testing.T, cfg layers.GPTConfig, dt tensor.DType, tweak tweakFunc) (tensor.Backend, *layers.GPT) {
	t.Helper()
	b := cpu.New()
	m, err := layers.NewGPT(b, cfg, dt)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		if err := tweak(b, m.Params()); err != nil {
			t.Fatal(err)
		}
	}
	return b, m
}

func runReference(t *testing.T, cfg layers.GPTConfig, dt tensor.DType, ids, targets *tensor.Tensor) reference {
	t.Helper()
	return runReferenceWith(t, cfg, dt, ids, targets, nil)
}

func runReferenceWith(t *testing.T, cfg layers.GPTConfig, dt tensor.DType, ids, targets *tensor.Tensor, tweak tweakFunc) reference {
	t.Helper()
	b, m := referenceGPT(t, cfg, dt, tweak)
	loss, err := m.Forward(ids, targets)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(); err != nil {
		t.Fatal(err)
	}
	ref := reference{loss: loss, logits: testutil.Download(b, m.Logits()), w: map[string][]float64{}, g: map[string][]float64{},
		aux: m.AuxLoss(), stats: m.RouterStats()}
	for _, p := range m.Params().Params() {
		ref.w[p.Name], ref.g[p.Name] = testutil.Download(b, p.W), testutil.Download(b, p.G)
	}
	_, g := m.Params().Flat()
	ref.sumSquare = b.SumSquares(g)
	return ref
}
