package grads_test

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestBucketsStartWhenComplete drives a Reducer as a backward does, on a
// grid of DP 2 × TP 2 with EP 2 and buckets of 28 bytes (7 fp32 elements,
// 6 once aligned to 2; some across two parameters): every bucket's sum
// starts (Config.ReduceBucket sees it) only once every parameter it
// overlaps is Ready, those completed by one Ready call from the last in
// flat order; every bucket is summed once, over DP (EDP for the experts);
// with AfterBackward none starts before EndBackward; and the buckets tile
// the flat gradient.
func TestBucketsStartWhenComplete(t *testing.T) {
	for _, after := range []bool{false, true} {
		t.Run(fmt.Sprintf("after=%v", after), func(t *testing.T) {
			err := local.Run(4, func(c comm.Comm) error {
				grid, err := comm.NewGrid(c, 2, 2, 2)
				if err != nil {
					return err
				}
				defer grid.Close()
				// Streams run the sums at once, as they are queued (the GPU
				// lane's path), so the hook sees the state they start from.
				b := inlineStreams{cpu.New(cpu.WithThreads(1))}
				ps, shards := build(t, b, grid.TPGroup.Rank(), grid.EPGroup.Rank(), tensor.Float32)
				var mu sync.Mutex
				ready := map[*layers.Param]bool{}
				var started []grads.Bucket
				var problems []string
				var red *grads.Reducer
				ended := false
				cfg := grads.Config{BucketBytes: 28, BucketAlign: 2, AfterBackward: after,
					ReduceBucket: func(bkt grads.Bucket, buf *tensor.Tensor, s comm.Stream) (comm.Work, error) {
						mu.Lock()
						for _, p := range ps.Params() {
							if p.Offset() < bkt.Hi && bkt.Lo < p.Offset()+p.Numel() && !ready[p] && !ended {
								problems = append(problems, fmt.Sprintf("bucket [%d, %d) started before %s was ready", bkt.Lo, bkt.Hi, p.Name))
							}
						}
						if after && !ended {
							problems = append(problems, fmt.Sprintf("bucket [%d, %d) started before EndBackward", bkt.Lo, bkt.Hi))
						}
						started = append(started, bkt)
						mu.Unlock()
						return bkt.Group.AllReduce(buf, comm.Sum, s)
					}}
				if red, err = grads.NewReducerWith(b, ps, shards, grads.GridGroups(grid, nil), cfg); err != nil {
					return err
				}
				bs := red.Buckets()
				lo := 0
				for i, bk := range bs {
					if bk.Lo != lo || bk.Hi <= bk.Lo || bk.Hi-bk.Lo > 6 {
						return fmt.Errorf("bucket %d is [%d, %d) after %d: want buckets of at most 6 fp32 elements (28 bytes, aligned to 2) that tile the gradient", i, bk.Lo, bk.Hi, lo)
					}
					lo = bk.Hi
				}
				if lo != ps.Numel() {
					return fmt.Errorf("the buckets end at %d of %d", lo, ps.Numel())
				}
				// The backward's order: the parameters from the last, two at a time.
				order := ps.Params()
				if err := red.BeginBackward(0, 1); err != nil {
					return err
				}
				for i := len(order) - 1; i >= 0; i -= 2 {
					call := []*layers.Param{order[i]}
					if i > 0 {
						call = append(call, order[i-1])
					}
					mu.Lock()
					for _, p := range call {
						ready[p] = true
					}
					n := len(started)
					mu.Unlock()
					if err := red.Ready(call); err != nil {
						return err
					}
					mu.Lock()
					for j := n + 1; j < len(started); j++ {
						if started[j].Lo > started[j-1].Lo {
							problems = append(problems, fmt.Sprintf("buckets started in flat order within one Ready: %v then %v", started[j-1], started[j]))
						}
					}
					mu.Unlock()
				}
				mu.Lock()
				if !after && len(started) == 0 {
					problems = append(problems, "no bucket started before EndBackward")
				}
				ended = true
				mu.Unlock()
				if err := red.EndBackward(nil); err != nil {
					return err
				}
				want := 0
				for _, bk := range bs {
					if bk.Group != nil {
						want++
						if !strings.Contains(bk.What, "DP") {
							return fmt.Errorf("bucket %+v: want a sum over DP or EDP", bk)
						}
					}
				}
				if len(started) != want {
					problems = append(problems, fmt.Sprintf("%d sums started, want one per bucket (%d)", len(started), want))
				}
				if len(problems) > 0 {
					return fmt.Errorf("rank %d: %s", c.Rank(), strings.Join(problems, "; "))
				}
				return nil
			}, local.WithTimeout(20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// inlineStreams is a CPU backend with tensor.Streams whose streams are
// the host: a comm op queued "on the side stream" runs when it is queued.
type inlineStreams struct{ *cpu.Backend }

func (inlineStreams) NewStream() (any, error)   { return "side", nil }
func (inlineStreams) StreamWait(_, _ any) error { return nil }
func (inlineStreams) DestroyStream(any) error   { return nil }

// onTwo runs fn on a rank of a local world of two, whose world is both
// the TP and the EP group of build's set (no DP or EDP group).
func onTwo(t *testing.T, fn func(c comm.Comm) error) {
	t.Helper()
	if err := local.Run(2, fn, local.WithTimeout(20*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestReduceDTypes: the sums run in the main gradients' dtype by default;
// a bf16 reduction is refused for f32 gradients and a mismatched dtype is
// refused naming both; negative sizes are refused.
func TestReduceDTypes(t *testing.T) {
	onTwo(t, func(c comm.Comm) error {
		b := cpu.New()
		ps, shards := build(t, b, c.Rank(), c.Rank(), tensor.Float32)
		groups := grads.Groups{TP: c, EP: c}
		for _, tc := range []struct {
			cfg  grads.Config
			want string
		}{
			{grads.Config{DType: tensor.BFloat16}, "a reduction in bf16 of f32 gradients"},
			{grads.Config{DType: tensor.Float64}, "a reduction in f64 of f32 gradients"},
			{grads.Config{BucketBytes: -1}, "BucketBytes = -1"},
			{grads.Config{BucketAlign: -2}, "BucketAlign = -2"},
		} {
			if _, err := grads.NewReducerWith(b, ps, shards, groups, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("%+v: %v, want an error containing %q", tc.cfg, err, tc.want)
			}
		}
		red, err := grads.NewReducerWith(b, ps, shards, groups, grads.Config{DType: tensor.Float32})
		if err != nil {
			return err
		}
		if err := red.EndBackward(nil); err == nil || !strings.Contains(err.Error(), "outside a backward") {
			return fmt.Errorf("EndBackward without BeginBackward: %v", err)
		}
		if err := red.BeginBackward(2, 2); err == nil {
			return fmt.Errorf("BeginBackward(2, 2): no error")
		}
		return nil
	})
}

// TestMainGradsAccumulate: through the Reducer's GradSync calls, the
// micro-batches' gradients of an f64 set add up in its gradients (the
// backward adds); after the last, the partial gradients are summed over
// TP and nothing else changes (no DP group).
func TestMainGradsAccumulate(t *testing.T) {
	onTwo(t, func(c comm.Comm) error { return mainGradsAccumulate(t, c) })
}

func mainGradsAccumulate(t *testing.T, c comm.Comm) error {
	b := cpu.New()
	ps, shards := build(t, b, c.Rank(), c.Rank(), tensor.Float64)
	red, err := grads.NewReducer(b, ps, shards, grads.Groups{TP: c, EP: c})
	if err != nil {
		return err
	}
	if ps.MainGrads() == nil || ps.SeparateMainGrads() {
		return fmt.Errorf("an f64 set has separate main gradients")
	}
	_, g := ps.Flat()
	want := make([]float64, g.Numel())
	for j := range 3 {
		if err := red.BeginBackward(j, 3); err != nil {
			return err
		}
		h := tensor.MustHost(tensor.Float64, g.Numel())
		for i := range h.F64() {
			h.F64()[i] = float64(j+1) * math.Sin(float64(i))
			want[i] += h.F64()[i]
		}
		cur := tensor.MustHost(tensor.Float64, g.Numel())
		b.Download(cur, g)
		for i := range h.F64() {
			h.F64()[i] += cur.F64()[i]
		}
		b.Upload(g, h) // the backward adds
		if err := red.EndBackward(nil); err != nil {
			return err
		}
	}
	partial := map[int]bool{}
	for _, s := range shards {
		if s.PartialGrad {
			for i := range s.Param.Numel() {
				partial[s.Param.Offset()+i] = true
			}
		}
	}
	got := tensor.MustHost(tensor.Float64, g.Numel())
	b.Download(got, ps.MainGrads())
	for i := range want {
		if partial[i] {
			want[i] *= 2 // the same on both ranks, summed over TP
		}
		if got.F64()[i] != want[i] {
			return fmt.Errorf("main gradient %d = %v, want %v", i, got.F64()[i], want[i])
		}
	}
	return nil
}
