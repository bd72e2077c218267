package grads_test

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// The test model's parameters over a grid of DP 2 × TP 2 with EP 2 (world
// 4; comm.NewGrid: TP groups {0,1} {2,3}, DP {0,2} {1,3}, EP {0,1} {2,3},
// EDP {0,2} {1,3}), registered in an order that interleaves the kinds.
type param struct {
	name    string
	full    []int
	over    shard.Group
	dim     int
	partial bool
}

var params = []param{
	{"w_col", []int{8, 4}, shard.TP, 0, false},
	{"norm", []int{4}, shard.None, -1, true},
	{"w_row", []int{4, 6}, shard.TP, 1, false},
	{"experts", []int{4, 2, 3}, shard.EP, 0, false},
	{"bias", []int{3}, shard.None, -1, false},
	{"router", []int{4, 4}, shard.None, -1, true},
}

// build registers this rank's slices and returns the set and its shards.
func build(t testing.TB, b tensor.Backend, tpRank, epRank int, dt tensor.DType) (*layers.ParamSet, []shard.Shard) {
	ps := layers.NewParamSet(1)
	var shards []shard.Shard
	for _, p := range params {
		local := slices.Clone(p.full)
		lo, hi := 0, p.full[0]
		switch p.over {
		case shard.TP:
			local[p.dim] /= 2
			lo, hi = tpRank*local[p.dim], (tpRank+1)*local[p.dim]
		case shard.EP:
			local[p.dim] /= 2
			lo, hi = epRank*local[p.dim], (epRank+1)*local[p.dim]
		}
		pp, err := ps.Add(p.name, local, p.name != "bias" && p.name != "norm", nil)
		if err != nil {
			t.Fatal(err)
		}
		shards = append(shards, shard.Shard{Param: pp, Full: p.full, Over: p.over, Dim: p.dim, Lo: lo, Hi: hi, PartialGrad: p.partial})
	}
	if err := ps.Materialize(b, dt); err != nil {
		t.Fatal(err)
	}
	return ps, shards
}

// gradOf is the gradient of parameter i of rank r before the reduction.
func gradOf(r, i, n int) []float64 {
	return testutil.RandFloats(testutil.Rng(uint64(100*r+i)), n, -1, 1)
}

// TestReduceAndNorm sets random gradients on the four ranks, reduces them,
// and compares each rank's result with the sums over its groups computed
// on the host from all ranks' gradients; the global Σ g² (host and device)
// with each distinct slice of every full parameter counted once, computed
// from the reduced gradients of all ranks; and ClipGrads' scaling.
func TestReduceAndNorm(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float64, tensor.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			const world = 4
			tol := 1e-12
			if dt == tensor.Float32 {
				tol = 1e-5
			}
			before := make([]map[string][]float64, world)
			after := make([]map[string][]float64, world)
			slicesOf := make([]map[string]shard.Slice, world)
			norms := make([][3]float64, world) // host, device, after clipping
			var mu sync.Mutex
			err := local.Run(world, func(c comm.Comm) error {
				grid, err := comm.NewGrid(c, 2, 2, 2)
				if err != nil {
					return err
				}
				b := cpu.New(cpu.WithThreads(1))
				ps, shards := build(t, b, grid.TPGroup.Rank(), grid.EPGroup.Rank(), dt)
				red, err := grads.NewReducer(b, ps, shards, grads.GridGroups(grid, nil))
				if err != nil {
					return err
				}
				r := c.Rank()
				mine, sl := map[string][]float64{}, map[string]shard.Slice{}
				for i, s := range shards {
					src := r
					if s.Replicated() && !s.PartialGrad {
						// A replicated parameter without PartialGrad has the
						// same gradient on every rank of its TP group.
						src = grid.DPGroup.Rank() * 2
					}
					g := gradOf(src, i, s.Param.Numel())
					h, _ := tensor.FromFloat64(g, s.Param.Shape()...)
					b.Upload(s.Param.G, h)
					mine[s.Param.Name] = testutil.Download(b, s.Param.G) // rounded to dt
					sl[s.Param.Name] = s.Slice()
				}
				if err := red.Reduce(); err != nil {
					return err
				}
				got := map[string][]float64{}
				for _, s := range shards {
					got[s.Param.Name] = testutil.Download(b, s.Param.G)
				}
				ss, err := red.GradSumSquares()
				if err != nil {
					return err
				}
				dst := b.Zeros(layerkit.StatDType(dt), 1)
				b.Fill(dst, 0.5) // GradSumSquaresTo adds
				if err := red.GradSumSquaresTo(dst); err != nil {
					return err
				}
				dev := testutil.Download(b, dst)[0] - 0.5
				norm, err := red.ClipGrads(0.5)
				if err != nil {
					return err
				}
				if math.Abs(norm-math.Sqrt(ss)) > 1e-12*norm {
					return fmt.Errorf("ClipGrads' norm %v, GradSumSquares' sqrt %v", norm, math.Sqrt(ss))
				}
				clipped, err := red.GradNorm()
				if err != nil {
					return err
				}
				mu.Lock()
				before[r], after[r], slicesOf[r], norms[r] = mine, got, sl, [3]float64{ss, dev, clipped}
				mu.Unlock()
				return b.Err()
			}, local.WithTimeout(20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			// The groups of rank r, as comm.NewGrid(world, dp 2, tp 2, ep 2) makes them.
			dpOf := func(r int) []int { return []int{r % 2, r%2 + 2} }
			edpOf := dpOf
			sum := func(name string, ranks []int) []float64 {
				out := make([]float64, len(before[ranks[0]][name]))
				for _, q := range ranks {
					for i, v := range before[q][name] {
						out[i] += v
					}
				}
				return out
			}
			for r := range world {
				for _, p := range params {
					var want []float64
					switch {
					case p.over == shard.EP:
						want = sum(p.name, edpOf(r))
					case p.partial: // over DP, then over TP: every rank of the world
						want = sum(p.name, []int{0, 1, 2, 3})
					default:
						want = sum(p.name, dpOf(r))
					}
					if err := testutil.Within(fmt.Sprintf("rank %d %s", r, p.name), after[r][p.name], want, tol); err != nil {
						t.Error(err)
					}
				}
			}
			// Σ g² with each distinct slice of each parameter counted once.
			var want float64
			for _, p := range params {
				var seen []shard.Slice
				for r := range world {
					s := slicesOf[r][p.name]
					if slices.ContainsFunc(seen, s.Equal) {
						continue
					}
					seen = append(seen, s)
					for _, v := range after[r][p.name] {
						want += v * v
					}
				}
			}
			for r := range world {
				if math.Abs(norms[r][0]-want) > tol*want || math.Abs(norms[r][1]-want) > 10*tol*want {
					t.Errorf("rank %d: Σ g² %v on the host, %v on the device; want %v", r, norms[r][0], norms[r][1], want)
				}
				n := math.Sqrt(want)
				if clipped := n * 0.5 / (n + 1e-6); math.Abs(norms[r][2]-clipped) > max(10*tol, 1e-7) { // the scale is a float32
					t.Errorf("rank %d: the norm after clipping to 0.5 is %v, want %v", r, norms[r][2], clipped)
				}
			}
		})
	}
}

// TestReducerRefuses: a parameter without a description, one described
// twice, a split that does not fit its group, and an expert split without
// an EP group are errors that say so.
func TestReducerRefuses(t *testing.T) {
	err := local.Run(2, func(c comm.Comm) error {
		b := cpu.New()
		ps, shards := build(t, b, c.Rank(), c.Rank(), tensor.Float32)
		for _, tc := range []struct {
			shards []shard.Shard
			groups grads.Groups
			want   string
		}{
			{shards[1:], grads.Groups{TP: c, EP: c}, `"w_col" has no shard description`},
			{append(shards, shards[0]), grads.Groups{TP: c, EP: c}, `"w_col" is described twice`},
			{shards, grads.Groups{EP: c}, "the tp group has 1 ranks"},
			{shards, grads.Groups{TP: c}, "the ep group has 1 ranks"},
		} {
			_, err := grads.NewReducer(b, ps, tc.shards, tc.groups)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("NewReducer: %v, want an error containing %q", err, tc.want)
			}
		}
		red, err := grads.NewReducer(b, ps, shards, grads.Groups{TP: c, EP: c})
		if err != nil {
			return err
		}
		if _, err := red.ClipGrads(math.NaN()); err == nil {
			return fmt.Errorf("ClipGrads(NaN) gave no error")
		}
		// Without DP or EDP groups only the partial gradients are summed
		// (over TP).
		rs, err := red.Reductions()
		if err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Group != c || !strings.Contains(rs[0].What, "TP") {
			return fmt.Errorf("reductions %+v, want one over the TP group", rs)
		}
		return nil
	}, local.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
}
