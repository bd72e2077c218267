package optim

import (
	"slices"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// shardSet is a parameter set of decayed and undecayed parameters, the
// same on every call.
func shardSet(t *testing.T, b tensor.Backend, dt tensor.DType) *layers.ParamSet {
	t.Helper()
	ps := layers.NewParamSet(5)
	for _, a := range []struct {
		name  string
		shape []int
		decay bool
	}{{"norm", []int{6}, false}, {"w1", []int{4, 6}, true}, {"bias", []int{5}, false}, {"w2", []int{6, 4}, true}} {
		if _, err := ps.Add(a.name, a.shape, a.decay, layers.Normal(0.5)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.Materialize(b, dt); err != nil {
		t.Fatal(err)
	}
	if err := ps.UseMainGrads(); err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestShardedAdamW: three ranks of a distributed optimizer, each holding
// uneven runs of the flat buffers (across the decay boundary, one of them
// empty), updating their runs from packed gradients and gathering each
// other's (Gather: a host copy standing in for the all-gather), give the
// whole optimizer's parameters, master weights and moments bit for bit
// over 3 clipped steps, for f32 and bf16 (with fp32 master weights)
// parameters; StatePieces covers every element once; the whole-parameter
// views are refused.
func TestShardedAdamW(t *testing.T) {
	cfg := AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			b := newCPU()
			whole := shardSet(t, b, dt)
			ref, err := NewAdamWWithConfig(b, whole, cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := whole.Numel()
			ranges := [][]Range{{{0, 7}, {30, 31}}, {{7, 30}}, {{31, 31}, {31, n}}}
			sets := make([]*layers.ParamSet, 3)
			opts := make([]*AdamW, 3)
			for r := range 3 {
				sets[r] = shardSet(t, b, dt)
				k := 0
				for _, rg := range ranges[r] {
					k += rg.Hi - rg.Lo
				}
				// Gather is left out: gatherAll below copies every rank's runs
				// into every rank's parameters once all have updated.
				if opts[r], err = NewShardedAdamW(b, sets[r], cfg, Sharding{Ranges: ranges[r], Grads: b.Zeros(sets[r].MainGrads().DType(), k)}); err != nil {
					t.Fatal(err)
				}
			}
			gatherAll := func() {
				for r := range 3 {
					w, _ := sets[r].Flat()
					for q := range 3 {
						wq, _ := sets[q].Flat()
						for _, rg := range ranges[q] {
							if rg.Hi > rg.Lo {
								dst, _ := w.View(rg.Lo, rg.Hi-rg.Lo)
								src, _ := wq.View(rg.Lo, rg.Hi-rg.Lo)
								b.Copy(dst, src)
							}
						}
					}
				}
			}
			rng := testutil.Rng(3)
			for step := 1; step <= 3; step++ {
				g := testutil.RandFloats(rng, n, -2, 2)
				gt := testutil.Upload(b, whole.MainGrads().DType(), g, 1, n)
				b.Copy(whole.MainGrads(), gt)
				normSq := b.Zeros(ref.MomentDType(), 1)
				b.SumSquaresTo(normSq, whole.MainGrads())
				if err := ref.StepClipped(step, 1e-2, normSq, 0.5); err != nil {
					t.Fatal(err)
				}
				for r := range 3 {
					sh, _ := opts[r].Sharded()
					k := 0
					for _, rg := range ranges[r] {
						if rg.Hi > rg.Lo {
							dst, _ := sh.Grads.View(k, rg.Hi-rg.Lo)
							src, _ := whole.MainGrads().View(rg.Lo, rg.Hi-rg.Lo)
							b.Copy(dst, src)
						}
						k += rg.Hi - rg.Lo
					}
					if err := opts[r].StepClipped(step, 1e-2, normSq, 0.5); err != nil {
						t.Fatal(err)
					}
				}
				gatherAll()
				want := paramValues(t, whole)
				for r := range 3 {
					if got := paramValues(t, sets[r]); !slices.Equal(got, want) {
						t.Fatalf("step %d: rank %d's parameters differ from the whole optimizer's", step, r)
					}
				}
			}
			// The state pieces of the ranks, put together, are the whole
			// optimizer's state, every element once.
			wantPieces, err := ref.StatePieces()
			if err != nil {
				t.Fatal(err)
			}
			for _, wp := range wantPieces {
				for k, want := range [][]float64{testutil.Download(b, wp.W), testutil.Download(b, wp.M), testutil.Download(b, wp.V)} {
					got := make([]float64, len(want))
					seen := make([]int, len(want))
					for r := range 3 {
						pieces, err := opts[r].StatePieces()
						if err != nil {
							t.Fatal(err)
						}
						for _, p := range pieces {
							if p.Param.Name != wp.Param.Name {
								continue
							}
							v := testutil.Download(b, []*tensor.Tensor{p.W, p.M, p.V}[k])
							copy(got[p.Lo:p.Hi], v)
							for i := p.Lo; i < p.Hi; i++ {
								seen[i]++
							}
						}
					}
					if !slices.Equal(got, want) || slices.ContainsFunc(seen, func(c int) bool { return c != 1 }) {
						t.Fatalf("%s: the ranks' pieces (%d of %q) differ from the whole optimizer's, or cover its elements other than once (%v)", dt, k, wp.Param.Name, seen)
					}
				}
			}
			if _, err := opts[0].Moments(); err == nil {
				t.Error("Moments of a sharded optimizer: no error")
			}
			if want := int64(3) * int64(n) * 4; dt == tensor.BFloat16 && ref.StateBytes() != want {
				t.Errorf("the whole optimizer's state: %d bytes, want %d", ref.StateBytes(), want)
			}
		})
	}
}
