package overlap_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// perRank names the seeded input of one rank.
func perRank(name string, r int) string { return fmt.Sprintf("%s/%d", name, r) }

// sum adds the seeded matrices of every rank.
func sum(name string, p, rows, cols int) mat {
	s := seeded(perRank(name, 0), rows, cols)
	for q := 1; q < p; q++ {
		s = add(s, seeded(perRank(name, q), rows, cols))
	}
	return s
}

func TestCopyAndReduceRegions(t *testing.T) {
	for _, p := range worlds {
		t.Run(fmt.Sprint("P=", p), func(t *testing.T) {
			onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
				r := c.Rank()
				x := seeded("x", 3, 4) // replicated
				xt := x.t64()
				if err := wait(overlap.CopyToRegionForward(c, xt, nil)); err != nil {
					return err
				}
				if err := near("copy-to-region forward", xt, x); err != nil {
					return err
				}
				dx := seeded(perRank("dx", r), 3, 4).t64()
				if err := wait(overlap.CopyToRegionBackward(c, dx, nil)); err != nil {
					return err
				}
				if err := near("copy-to-region backward", dx, sum("dx", p, 3, 4)); err != nil {
					return err
				}
				y := seeded(perRank("y", r), 2, 5).t64()
				if err := wait(overlap.ReduceFromRegionForward(c, y, nil)); err != nil {
					return err
				}
				if err := near("reduce-from-region forward", y, sum("y", p, 2, 5)); err != nil {
					return err
				}
				dy := seeded("dy", 2, 5)
				dyt := dy.t64()
				if err := wait(overlap.ReduceFromRegionBackward(c, dyt, nil)); err != nil {
					return err
				}
				return near("reduce-from-region backward", dyt, dy)
			})
		})
	}
}

func TestScatterAndGatherRegions(t *testing.T) {
	for _, p := range worlds {
		t.Run(fmt.Sprint("P=", p), func(t *testing.T) {
			onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
				r, n, w := c.Rank(), 3, 2 // rows, columns per rank
				// scatter: forward splits the replicated X, backward gathers the parts.
				x := seeded("x", n, w*p)
				part := tensor.MustHost(tensor.Float64, n, w)
				if err := wait(overlap.ScatterToRegionForward(b, c, part, x.t64(), nil)); err != nil {
					return err
				}
				if err := near("scatter-to-region forward", part, x.cols(r, p)); err != nil {
					return err
				}
				var dparts []mat
				for q := range p {
					dparts = append(dparts, seeded(perRank("dpart", q), n, w))
				}
				dx := tensor.MustHost(tensor.Float64, n, w*p)
				if err := wait(overlap.ScatterToRegionBackward(b, c, dx, dparts[r].t64(), nil)); err != nil {
					return err
				}
				if err := near("scatter-to-region backward", dx, catCols(dparts...)); err != nil {
					return err
				}
				// gather: forward gathers the parts, backward splits the replicated gradient.
				full := tensor.MustHost(tensor.Float64, n, w*p)
				if err := wait(overlap.GatherFromRegionForward(b, c, full, dparts[r].t64(), nil)); err != nil {
					return err
				}
				if err := near("gather-from-region forward", full, catCols(dparts...)); err != nil {
					return err
				}
				dfull := seeded("dfull", n, w*p)
				dpart := tensor.MustHost(tensor.Float64, n, w)
				if err := wait(overlap.GatherFromRegionBackward(b, c, dpart, dfull.t64(), nil)); err != nil {
					return err
				}
				return near("gather-from-region backward", dpart, dfull.cols(r, p))
			})
		})
	}
}

// TestGatherRegion3D: the last dim of a (B, T, C) tensor, in bf16.
func TestGatherRegion3D(t *testing.T) {
	onRanks(t, 2, func(c comm.Comm, b tensor.Backend) error {
		r := c.Rank()
		src := tensor.MustHost(tensor.BFloat16, 2, 2, 2)
		vals := make([]float64, 8)
		for i := range vals {
			vals[i] = float64(10*r + i)
		}
		src.SetFloat64s(vals)
		dst := tensor.MustHost(tensor.BFloat16, 2, 2, 4)
		if err := wait(overlap.GatherFromRegionForward(b, c, dst, src, nil)); err != nil {
			return err
		}
		got, _ := dst.Float64s()
		want := []float64{0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 14, 15, 6, 7, 16, 17}
		for i := range want {
			if got[i] != want[i] {
				return fmt.Errorf("got %v, want %v", got, want)
			}
		}
		return nil
	})
}

func TestSequenceRegions(t *testing.T) {
	for _, p := range worlds {
		t.Run(fmt.Sprint("P=", p), func(t *testing.T) {
			onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
				r, n, k := c.Rank(), 2, 3 // rows per rank, columns
				// gather: forward all-gathers the sequence, backward reduce-scatters it.
				var xs []mat
				for q := range p {
					xs = append(xs, seeded(perRank("x", q), n, k))
				}
				full := tensor.MustHost(tensor.Float64, n*p, k)
				if err := wait(overlap.SequenceGatherForward(b, c, full, xs[r].t64(), nil)); err != nil {
					return err
				}
				if err := near("sequence-gather forward", full, catRows(xs...)); err != nil {
					return err
				}
				dx := tensor.MustHost(tensor.Float64, n, k)
				if err := wait(overlap.SequenceGatherBackward(b, c, dx, seeded(perRank("dfull", r), n*p, k).t64(), nil)); err != nil {
					return err
				}
				if err := near("sequence-gather backward", dx, sum("dfull", p, n*p, k).rows(r, p)); err != nil {
					return err
				}
				// reduce-scatter: forward reduce-scatters partial sums, backward all-gathers.
				y := tensor.MustHost(tensor.Float64, n, k)
				if err := wait(overlap.SequenceReduceScatterForward(b, c, y, seeded(perRank("partial", r), n*p, k).t64(), nil)); err != nil {
					return err
				}
				if err := near("sequence-reduce-scatter forward", y, sum("partial", p, n*p, k).rows(r, p)); err != nil {
					return err
				}
				dfull := tensor.MustHost(tensor.Float64, n*p, k)
				if err := wait(overlap.SequenceReduceScatterBackward(b, c, dfull, xs[r].t64(), nil)); err != nil {
					return err
				}
				return near("sequence-reduce-scatter backward", dfull, catRows(xs...))
			})
		})
	}
}

// TestAllToAllRegion: forward moves rows by uneven counts (with zeros);
// backward, with the same counts, brings gradients back where they came
// from.
func TestAllToAllRegion(t *testing.T) {
	count := func(i, j int) int { return (2*i + j) % 3 }
	for _, p := range worlds {
		t.Run(fmt.Sprint("P=", p), func(t *testing.T) {
			onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
				r, k := c.Rank(), 2
				send, recv := make([]int, p), make([]int, p)
				var sent, got []mat // per peer: the rows r sends, the rows r receives
				for q := range p {
					send[q], recv[q] = count(r, q), count(q, r)
					sent = append(sent, seeded(fmt.Sprintf("x/%d->%d", r, q), send[q], k))
					got = append(got, seeded(fmt.Sprintf("x/%d->%d", q, r), recv[q], k))
				}
				src, want := catRows(sent...), catRows(got...)
				dst := tensor.MustHost(tensor.Float64, want.r, k)
				if err := wait(overlap.AllToAllForward(b, c, dst, src.t64(), send, recv, nil)); err != nil {
					return err
				}
				if err := near("all-to-all forward", dst, want); err != nil {
					return err
				}
				back := tensor.MustHost(tensor.Float64, src.r, k)
				if err := wait(overlap.AllToAllBackward(b, c, back, dst, send, recv, nil)); err != nil {
					return err
				}
				return near("all-to-all backward", back, src)
			})
		})
	}
}

// TestMappingErrors: a wrong shape is an error that names the mapping.
func TestMappingErrors(t *testing.T) {
	onRanks(t, 2, func(c comm.Comm, b tensor.Backend) error {
		_, err := overlap.ScatterToRegionForward(b, c, tensor.MustHost(tensor.Float32, 3, 3), tensor.MustHost(tensor.Float32, 3, 4), nil)
		var e *comm.Error
		if !errors.As(err, &e) || e.Op != "scatter-to-region forward" {
			return fmt.Errorf("scatter: got %v", err)
		}
		_, err = overlap.GatherFromRegionForward(b, c, tensor.MustHost(tensor.Float32, 3, 4), tensor.MustHost(tensor.Float32, 3, 3), nil)
		if !errors.As(err, &e) || e.Op != "gather-from-region forward" {
			return fmt.Errorf("gather: got %v", err)
		}
		return nil
	})
}
