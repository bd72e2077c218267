package grads_test

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestShardedReduction: a distributed optimizer's reduction (Config.Shard)
// on grids of DP 2 × TP 2 with EP 2 and of DP 4 × TP 1, in small buckets
// (so that many are padded and some ranks own nothing of one), leaves each
// rank the parts it owns of the gradients the all-reduce gives (the plain
// Reducer on the same gradients, bit for bit: both sum in rank order),
// every element of a replica's flat buffer owned by one rank of the
// group it is summed over; its global Σ g² (host and device) is the plain
// one's within rounding; and GatherParams makes every rank's parameters
// the owners' parts.
func TestShardedReduction(t *testing.T) {
	for _, g := range []struct{ dp, tp, ep int }{{2, 2, 2}, {4, 1, 1}} {
		t.Run(fmt.Sprintf("dp%d_tp%d_ep%d", g.dp, g.tp, g.ep), func(t *testing.T) {
			const world = 4
			var mu sync.Mutex
			owners := map[string][]int{} // per replica position (tp, ep rank), owners of each flat element
			err := local.Run(world, func(c comm.Comm) error {
				grid, err := comm.NewGrid(c, g.dp, g.tp, g.ep)
				if err != nil {
					return err
				}
				defer grid.Close()
				tpr, epr := grid.TPGroup.Rank(), grid.EPGroup.Rank()
				b := cpu.New(cpu.WithThreads(1))
				ref, refShards := build(t, b, tpr%2, epr%2, tensor.Float32)
				ps, shards := build(t, b, tpr%2, epr%2, tensor.Float32)
				if g.tp == 1 { // one TP rank: every parameter whole
					ref, refShards = buildWhole(t, b)
					ps, shards = buildWhole(t, b)
				}
				cfg := grads.Config{BucketBytes: 28}
				plain, err := grads.NewReducerWith(b, ref, refShards, grads.GridGroups(grid, nil), cfg)
				if err != nil {
					return err
				}
				cfg.Shard = true
				red, err := grads.NewReducerWith(b, ps, shards, grads.GridGroups(grid, nil), cfg)
				if err != nil {
					return err
				}
				for i, s := range shards {
					src := c.Rank()
					if s.Replicated() && !s.PartialGrad {
						src = grid.DPGroup.Rank() * 2
					}
					h, _ := tensor.FromFloat64(gradOf(src, i, s.Param.Numel()), s.Param.Shape()...)
					b.Upload(s.Param.G, h)
					b.Upload(refShards[i].Param.G, h)
				}
				if err := plain.Reduce(); err != nil {
					return err
				}
				if err := red.Reduce(); err != nil {
					return err
				}
				sh, ok := red.Sharding()
				if !ok {
					return fmt.Errorf("no sharding")
				}
				want := testutil.Download(b, ref.MainGrads())
				var got []float64
				if sh.Grads != nil {
					got = testutil.Download(b, sh.Grads)
				}
				k := 0
				key := fmt.Sprintf("%d/%d", tpr, epr)
				mu.Lock()
				if owners[key] == nil {
					owners[key] = make([]int, ps.Numel())
				}
				for _, rg := range sh.Ranges {
					for i := rg.Lo; i < rg.Hi; i++ {
						owners[key][i]++
					}
					if !slices.Equal(got[k:k+rg.Hi-rg.Lo], want[rg.Lo:rg.Hi]) {
						mu.Unlock()
						return fmt.Errorf("rank %d: the sharded gradients of [%d, %d) differ from the all-reduced ones", c.Rank(), rg.Lo, rg.Hi)
					}
					k += rg.Hi - rg.Lo
				}
				mu.Unlock()
				for _, pair := range [][2]*grads.Reducer{{plain, red}} {
					a, err := pair[0].GradSumSquares()
					if err != nil {
						return err
					}
					z, err := pair[1].GradSumSquares()
					if err != nil {
						return err
					}
					dst := b.Zeros(layerkit.StatDType(tensor.Float32), 1)
					if err := pair[1].GradSumSquaresTo(dst); err != nil {
						return err
					}
					dev := testutil.Download(b, dst)[0]
					if math.Abs(a-z) > 1e-6*a || math.Abs(a-dev) > 1e-5*a {
						return fmt.Errorf("rank %d: Σ g² %v (sharded), %v (sharded, device), %v (the all-reduce's)", c.Rank(), z, dev, a)
					}
				}
				// The owners' parts, gathered: element i of the replica at
				// (tp, ep) set to i + 1000·tp + 100·ep by its owner.
				w, _ := ps.Flat()
				vals := testutil.Download(b, w)
				for i := range vals {
					vals[i] = -1
				}
				for _, rg := range sh.Ranges {
					for i := rg.Lo; i < rg.Hi; i++ {
						vals[i] = float64(i + 1000*tpr + 100*epr)
					}
				}
				h, _ := tensor.FromFloat64(vals, len(vals))
				b.Upload(w, h)
				if err := red.GatherParams(); err != nil {
					return err
				}
				if err := red.WaitParams(); err != nil {
					return err
				}
				for i, v := range testutil.Download(b, w) {
					if v != float64(i+1000*tpr+100*epr) {
						return fmt.Errorf("rank %d: parameter element %d is %v after the gather, want its owner's %d", c.Rank(), i, v, i+1000*tpr+100*epr)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for key, o := range owners {
				for i, n := range o {
					if n != 1 {
						t.Fatalf("replica %s: element %d owned by %d ranks, want 1", key, i, n)
					}
				}
			}
		})
	}
}

// buildWhole registers the test model's parameters whole (a replica of a
// grid of one TP and one EP rank).
func buildWhole(t testing.TB, b tensor.Backend) (*layers.ParamSet, []shard.Shard) {
	ps := layers.NewParamSet(1)
	var shards []shard.Shard
	for _, p := range params {
		pp, err := ps.Add(p.name, p.full, p.name != "bias" && p.name != "norm", nil)
		if err != nil {
			t.Fatal(err)
		}
		shards = append(shards, shard.Replicated(pp, false))
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	return ps, shards
}
