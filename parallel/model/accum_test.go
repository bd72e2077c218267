package model_test

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
)

// microReference is layers.GPT's step of k micro-batches on the global
// batch: the reference of every layout's.
func microReference(t *testing.T, cfg layers.GPTConfig, dt tensor.DType, ids, targets *tensor.Tensor, k int, tweak tweakFunc) reference {
	t.Helper()
	b, m := referenceGPT(t, cfg, dt, tweak)
	if err := m.SetMicroBatches(k); err != nil {
		t.Fatal(err)
	}
	if err := m.ForwardBackward(ids, targets); err != nil {
		t.Fatal(err)
	}
	loss, err := m.ReadLoss()
	if err != nil {
		t.Fatal(err)
	}
	ref := reference{loss: loss, w: map[string][]float64{}, g: map[string][]float64{}, aux: m.AuxLoss(), stats: m.RouterStats()}
	for _, p := range m.Params().Params() {
		ref.g[p.Name] = testutil.Download(b, p.G)
	}
	return ref
}

// microModel builds a rank's model with buckets of bucketBytes, the sums
// overlapped with the backward or after it.
func microModel(b tensor.Backend, g *comm.Grid, cfg layers.GPTConfig, l layout, dt tensor.DType, bucketBytes int, after bool) (*model.Model, error) {
	ch, err := overlap.NewChooser(overlap.Config{Default: l.overlap}, []overlap.Strategy{strategies.Pipelined{}}, nil)
	if err != nil {
		return nil, err
	}
	return model.New(b, g, cfg, model.Options{SequenceParallel: l.sp, Stream: l.stream, Overlap: ch,
		GradReduce: grads.Config{BucketBytes: bucketBytes, AfterBackward: after}}, dt)
}

// microStep runs one step of k micro-batches on m and returns its loss
// and its main gradients (flat).
func microStepOn(b tensor.Backend, m *model.Model, k int, ids, targets *tensor.Tensor) (float64, []float64, error) {
	if err := m.SetMicroBatches(k); err != nil {
		return 0, nil, err
	}
	m.ZeroGrad()
	if err := m.ForwardBackward(ids, targets); err != nil {
		return 0, nil, err
	}
	loss, err := m.ReadLoss()
	if err != nil {
		return 0, nil, err
	}
	return loss, testutil.Download(b, m.Params().MainGrads()), b.Err()
}

// TestMicroBatchesMatchGPT: at TP, DP, SP and EP layouts (an MoE model
// with capacity drops and auxiliary losses among them), a step of k
// micro-batches of the sharded model equals layers.GPT's step of the same
// k micro-batches of the global batch (f64, within 1e-11: the loss, every
// gradient slice, the aux loss and the router statistics), with buckets
// small enough that each rank sums several; and the sums overlapped with
// the backward give the same bits as the sums after it.
func TestMicroBatchesMatchGPT(t *testing.T) {
	const B, T, tol = 8, 8, 1e-11
	dense := smallConfig()
	capped := moeConfig()
	capped.CapacityFactor = 1
	type tc struct {
		cfg layers.GPTConfig
		l   layout
		k   int
	}
	cases := []tc{
		{dense, layout{tp: 2, dp: 1}, 2},
		{dense, layout{tp: 1, dp: 2}, 4},
		{dense, layout{tp: 2, dp: 2, sp: true}, 2},
		{capped, layout{tp: 1, dp: 2, ep: 2}, 2},
		{capped, layout{tp: 2, dp: 2, ep: 4, sp: true}, 2},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s/k=%d", c.l, c.k)
		if c.cfg.Experts > 0 {
			name = "moe-capacity/" + name
		}
		t.Run(name, func(t *testing.T) {
			ids, targets := batch(5, B, T, c.cfg.Vocab)
			ref := microReference(t, c.cfg, tensor.Float64, ids, targets, c.k, nil)
			if c.cfg.Experts > 0 {
				dropped := 0
				for _, s := range ref.stats {
					dropped += s.Dropped
				}
				if dropped == 0 || ref.aux == 0 {
					t.Fatalf("reference: %d dropped slots, aux %v: the test needs both", dropped, ref.aux)
				}
			}
			var mu sync.Mutex
			buckets := map[int]int{}
			err := onGrid(c.l, func(b tensor.Backend, g *comm.Grid) error {
				var flat [2][]float64
				for i, after := range []bool{false, true} {
					m, err := microModel(b, g, c.cfg, c.l, tensor.Float64, 2048, after)
					if err != nil {
						return err
					}
					loss, mg, err := microStepOn(b, m, c.k, ids, targets)
					if err != nil {
						return err
					}
					flat[i] = mg
					mu.Lock()
					buckets[g.World.Rank()] = len(m.Buckets())
					mu.Unlock()
					if i == 1 {
						break
					}
					if e := relErr(loss, ref.loss); !(e <= tol) {
						return fmt.Errorf("loss %v, want %v (relative error %.3g)", loss, ref.loss, e)
					}
					for _, s := range m.Shards() {
						want := testutil.Slice(ref.g[s.Param.Name], s.Full, s.Dim, s.Lo, s.Hi)
						if err := testutil.Within(s.Param.Name+" gradient", testutil.Download(b, s.Param.G), want, tol); err != nil {
							return err
						}
					}
					if c.cfg.Experts > 0 {
						if e := relErr(m.AuxLoss(), ref.aux); !(e <= tol) {
							return fmt.Errorf("aux loss %v, want %v", m.AuxLoss(), ref.aux)
						}
						for i, s := range m.RouterStats() {
							r := ref.stats[i]
							if s.Tokens != r.Tokens || s.Dropped != r.Dropped || !slices.Equal(s.TokensPerExpert, r.TokensPerExpert) || relErr(s.LoadBalance, r.LoadBalance) > tol {
								return fmt.Errorf("router stats %+v, want %+v", s, r)
							}
						}
					}
				}
				for i := range flat[0] {
					if math.Float64bits(flat[0][i]) != math.Float64bits(flat[1][i]) {
						return fmt.Errorf("gradient %d: %v overlapped with the backward, %v after it: not the same bits", i, flat[0][i], flat[1][i])
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for r, n := range buckets {
				if n < 3 {
					t.Errorf("rank %d summed %d buckets, want several", r, n)
				}
			}
		})
	}
}
