package tp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// setup is one configuration every layer is checked in.
type setup struct {
	p  int // TP size
	sp bool
	dt tensor.DType
}

func (s setup) String() string { return fmt.Sprintf("P=%d/sp=%v/%v", s.p, s.sp, s.dt) }

// tol is the relative tolerance of a dtype: fp32 ≤ 1e-5, f64 much tighter.
func (s setup) tol() float64 {
	if s.dt == tensor.Float64 {
		return 1e-11
	}
	return 1e-5
}

func setups() []setup {
	var out []setup
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		for _, p := range []int{1, 2, 4} {
			for _, sp := range []bool{false, true} {
				out = append(out, setup{p, sp, dt})
			}
		}
	}
	return out
}

// forSetups runs fn as a subtest for every setup.
func forSetups(t *testing.T, fn func(t *testing.T, s setup)) {
	for _, s := range setups() {
		t.Run(s.String(), func(t *testing.T) { fn(t, s) })
	}
}

// onRanks runs fn on the p ranks of a local world, each with its own CPU
// backend and the Parallel of its TP group (the whole world), and fails the
// test with the ranks' errors.
func onRanks(t *testing.T, s setup, fn func(r int, par tp.Parallel, b tensor.Backend) error) {
	t.Helper()
	err := local.Run(s.p, func(c comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		if err := fn(c.Rank(), tp.Parallel{Group: c, SequenceParallel: s.sp}, b); err != nil {
			return err
		}
		return b.Err()
	}, local.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
}

// random returns a host tensor of dt with values of magnitude [0.1, 1)
// drawn from seed (the same on every rank).
func random(seed uint64, dt tensor.DType, shape ...int) *tensor.Tensor {
	return testutil.Rand(testutil.Rng(seed), dt, shape...)
}

// colsOf returns columns [lo, hi) of v viewed as rows of c.
func colsOf(v []float64, c, lo, hi int) []float64 {
	var out []float64
	for i := 0; i < len(v); i += c {
		out = append(out, v[i+lo:i+hi]...)
	}
	return out
}

// rowsOf returns rows [lo, hi) of v viewed as rows of c.
func rowsOf(v []float64, c, lo, hi int) []float64 { return v[lo*c : hi*c] }

// part returns rank r's part [r·n/p, (r+1)·n/p) of n.
func part(n, p, r int) (lo, hi int) { return r * n / p, (r + 1) * n / p }

// refParams maps the names of a materialized reference set to their
// weights and gradients (float64).
type refParams map[string][2][]float64

func refOf(b tensor.Backend, ps *layers.ParamSet) refParams {
	out := refParams{}
	for _, p := range ps.Params() {
		out[p.Name] = [2][]float64{testutil.Download(b, p.W), testutil.Download(b, p.G)}
	}
	return out
}

// checkShards compares the weights (exactly) and gradients (within tol) of
// a rank's shards with the reference. Shards with partial gradients are
// compared in sum: partial collects them by name, to be checked after all
// ranks are done (see checkPartial).
func checkShards(b tensor.Backend, ref refParams, shards []shard.Shard, tol float64, partial *partialSums, rank int) error {
	for _, s := range shards {
		rv, ok := ref[s.Param.Name]
		if !ok {
			return fmt.Errorf("shard %q: no such reference parameter", s.Param.Name)
		}
		if err := testutil.Within(s.Param.Name+" weight", testutil.Download(b, s.Param.W), testutil.Slice(rv[0], s.Full, s.Dim, s.Lo, s.Hi), 0); err != nil {
			return err
		}
		g := testutil.Download(b, s.Param.G)
		if s.PartialGrad {
			partial.add(rank, s.Param.Name, g)
			continue
		}
		if err := testutil.Within(s.Param.Name+" gradient", g, testutil.Slice(rv[1], s.Full, s.Dim, s.Lo, s.Hi), tol); err != nil {
			return err
		}
	}
	return nil
}

// partialSums collects per-rank partial gradients.
type partialSums struct{ byRank []map[string][]float64 }

func newPartial(p int) *partialSums {
	ps := &partialSums{byRank: make([]map[string][]float64, p)}
	for i := range ps.byRank {
		ps.byRank[i] = map[string][]float64{}
	}
	return ps
}

func (ps *partialSums) add(rank int, name string, g []float64) { ps.byRank[rank][name] = g }

// check sums the partial gradients over ranks and compares with ref.
func (ps *partialSums) check(t *testing.T, ref refParams, tol float64) {
	t.Helper()
	for name, g0 := range ps.byRank[0] {
		sum := make([]float64, len(g0))
		for _, m := range ps.byRank {
			for i, v := range m[name] {
				sum[i] += v
			}
		}
		if err := testutil.Within(name+" gradient (sum over TP of partials)", sum, ref[name][1], tol); err != nil {
			t.Fatal(err)
		}
	}
}
