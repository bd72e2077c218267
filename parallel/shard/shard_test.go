package shard_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestCutMerge cuts random tensors of every dtype into P pieces along each
// dimension, merges them back (with duplicate replicas among them), and
// compares with the original bit for bit, against testutil.Slice as the
// reference of each piece; then the errors of a missing, overlapping or
// disagreeing piece.
func TestCutMerge(t *testing.T) {
	full := []int{4, 6, 2}
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16, tensor.Int32} {
		for dim := range full {
			for _, P := range []int{1, 2} {
				t.Run(fmt.Sprintf("%v/dim%d/P%d", dt, dim, P), func(t *testing.T) {
					var x *tensor.Tensor
					if dt == tensor.Int32 {
						x = testutil.RandInts(testutil.Rng(uint64(dim)), 1000, full...)
					} else {
						x = testutil.Rand(testutil.Rng(uint64(dim)), dt, full...)
					}
					xv, _ := x.Float64s()
					w := full[dim] / P
					var pieces []shard.Piece
					for r := range P {
						sl := shard.Slice{Full: full, Dim: dim, Lo: r * w, Hi: (r + 1) * w}
						c, err := shard.Cut(x, sl)
						if err != nil {
							t.Fatal(err)
						}
						cv, _ := c.Float64s()
						if !slices.Equal(cv, testutil.Slice(xv, full, dim, r*w, (r+1)*w)) || c.DType() != dt {
							t.Fatalf("Cut of rank %d differs from the reference slice", r)
						}
						// Each piece twice: the second (a DP replica) is skipped.
						pieces = append(pieces, shard.Piece{Name: "x", Slice: sl, Tensor: c}, shard.Piece{Name: "x", Slice: sl, Tensor: c})
					}
					pieces = append(pieces, shard.Piece{Name: "whole", Slice: shard.Slice{Full: full, Dim: -1}, Tensor: x})
					got, err := shard.Merge(pieces)
					if err != nil {
						t.Fatal(err)
					}
					for _, n := range []string{"x", "whole"} {
						gv, _ := got[n].Float64s()
						if !slices.Equal(gv, xv) || got[n].DType() != dt {
							t.Errorf("merged %s differs from the original", n)
						}
					}
					if P == 2 {
						_, err := shard.Merge(pieces[:1])
						testutil.ErrorContains(t, err, fmt.Sprintf("no piece holds [%d, %d) of dimension %d", w, 2*w, dim))
						if dim == 1 {
							over := shard.Piece{Name: "x", Slice: shard.Slice{Full: full, Dim: 1, Lo: 2, Hi: 5}, Tensor: tensor.MustHost(dt, 4, 3, 2)}
							_, err = shard.Merge(append(pieces[:4:4], over))
							testutil.ErrorContains(t, err, "overlap")
						}
						other := pieces[0]
						odt := tensor.Float64
						if dt == odt {
							odt = tensor.Float32
						}
						other.Tensor = tensor.MustHost(odt, other.Tensor.Shape()...)
						_, err = shard.Merge([]shard.Piece{pieces[0], other})
						testutil.ErrorContains(t, err, "disagree")
					}
				})
			}
		}
	}
	_, err := shard.Cut(tensor.MustHost(tensor.Float32, 4, 6), shard.Slice{Full: []int{4, 6}, Dim: 1, Lo: 4, Hi: 7})
	testutil.ErrorContains(t, err, "expected a non-empty range inside it")
	_, err = shard.Merge([]shard.Piece{{Name: "a", Slice: shard.Slice{Full: []int{4}, Dim: -1}, Tensor: tensor.MustHost(tensor.Float32, 3)}})
	testutil.ErrorContains(t, err, "has shape (3)")
}

// tpModel registers a column-parallel and a row-parallel linear and a
// replicated norm weight on one TP rank: the parameters of a custom model.
type tpModel struct {
	ps     *layers.ParamSet
	shards []shard.Shard
}

func newTPModel(b tensor.Backend, par tp.Parallel, seed uint64) (*tpModel, error) {
	m := &tpModel{ps: layers.NewParamSet(seed)}
	up, err := tp.NewColumnParallelLinear(b, m.ps, par, "up", tp.ColumnConfig{In: 4, Out: 6, Bias: true, Std: 0.5})
	if err != nil {
		return nil, err
	}
	down, err := tp.NewRowParallelLinear(b, m.ps, par, "down", tp.RowConfig{In: 6, Out: 4, Std: 0.5})
	if err != nil {
		return nil, err
	}
	norm, err := layers.NewRMSNorm(b, m.ps, "norm", 4, 1e-5)
	if err != nil {
		return nil, err
	}
	m.shards = append(append(up.Shards(), down.Shards()...), shard.Replicated(norm.W, false))
	return m, m.ps.Materialize(b, tensor.Float32)
}

// singleModel is the same model on one rank (plain layers: the values a TP
// rank's shards are slices of).
func singleModel(t *testing.T, b tensor.Backend, seed uint64) map[string][]float64 {
	ps := layers.NewParamSet(seed)
	if _, err := layers.NewLinear(b, ps, "up", layers.LinearConfig{In: 4, Out: 6, Bias: true, Std: 0.5}); err != nil {
		t.Fatal(err)
	}
	if _, err := layers.NewLinear(b, ps, "down", layers.LinearConfig{In: 6, Out: 4, Std: 0.5}); err != nil {
		t.Fatal(err)
	}
	if _, err := layers.NewRMSNorm(b, ps, "norm", 4, 1e-5); err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, p := range ps.Params() {
		out[p.Name] = testutil.Download(b, p.W)
	}
	return out
}

func onRanks(t *testing.T, p int, fn func(c comm.Comm, b tensor.Backend) error) {
	t.Helper()
	if err := local.Run(p, func(c comm.Comm) error {
		return fn(c, cpu.New(cpu.WithThreads(1)))
	}, local.WithTimeout(20*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestSaveMergeLoad: the ranks of a TP 2 model save their weights; merging
// the files gives the one-rank model's parameters; the merged full file
// loads into a TP 2 model of another seed (each rank cutting its slice),
// and so does a rank's own file; a file of the other rank's slices, a
// missing tensor and an extra tensor are refused with the weights left as
// they were.
func TestSaveMergeLoad(t *testing.T) {
	dir := t.TempDir()
	const P, seed = 2, 7
	rankFile := func(r int) string { return filepath.Join(dir, fmt.Sprintf("rank%d.safetensors", r)) }
	onRanks(t, P, func(c comm.Comm, b tensor.Backend) error {
		m, err := newTPModel(b, tp.Parallel{Group: c}, seed)
		if err != nil {
			return err
		}
		return shard.SaveWeights(rankFile(c.Rank()), b, m.shards)
	})
	merged, err := shard.MergeFiles(rankFile(0), rankFile(1))
	if err != nil {
		t.Fatal(err)
	}
	want := singleModel(t, cpu.New(), seed)
	if len(merged) != len(want) {
		t.Fatalf("merged %d tensors, the model has %d", len(merged), len(want))
	}
	var fullFile []safetensors.Named
	for name, w := range want {
		got, _ := merged[name].Float64s()
		if !slices.Equal(got, w) {
			t.Errorf("merged %s differs from the one-rank model's", name)
		}
		fullFile = append(fullFile, safetensors.Named{Name: name, Tensor: merged[name]})
	}
	slices.SortFunc(fullFile, func(a, b safetensors.Named) int { return strings.Compare(a.Name, b.Name) })
	full := filepath.Join(dir, "full.safetensors")
	if err := safetensors.WriteFile(full, fullFile, nil); err != nil {
		t.Fatal(err)
	}
	extra := filepath.Join(dir, "extra.safetensors")
	if err := safetensors.WriteFile(extra, append(fullFile, safetensors.Named{Name: "head", Tensor: merged["norm.weight"]}), nil); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.safetensors")
	if err := safetensors.WriteFile(missing, fullFile[1:], nil); err != nil {
		t.Fatal(err)
	}
	onRanks(t, P, func(c comm.Comm, b tensor.Backend) error {
		m, err := newTPModel(b, tp.Parallel{Group: c}, seed+1)
		if err != nil {
			return err
		}
		before := map[string][]float64{}
		for _, s := range m.shards {
			before[s.Param.Name] = testutil.Download(b, s.Param.W)
		}
		for _, tc := range []struct{ path, want string }{
			{rankFile(1 - c.Rank()), "this rank holds"},
			{missing, fullFile[0].Name + " is missing"},
			{extra, "tensors the model does not have: head"},
		} {
			err := shard.LoadWeights(tc.path, b, m.shards)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("loading %s: %v, want an error containing %q", filepath.Base(tc.path), err, tc.want)
			}
			for _, s := range m.shards {
				if !slices.Equal(testutil.Download(b, s.Param.W), before[s.Param.Name]) {
					return fmt.Errorf("a refused load of %s changed %s", filepath.Base(tc.path), s.Param.Name)
				}
			}
		}
		for _, path := range []string{full, rankFile(c.Rank())} {
			for _, s := range m.shards { // start from other values each time
				b.Fill(s.Param.W, 3)
			}
			if err := shard.LoadWeights(path, b, m.shards); err != nil {
				return err
			}
			for _, s := range m.shards {
				sl := s.Slice()
				ref := testutil.Slice(want[s.Param.Name], sl.Full, sl.Dim, sl.Lo, sl.Hi)
				if !slices.Equal(testutil.Download(b, s.Param.W), ref) {
					return fmt.Errorf("rank %d: %s loaded from %s differs from its slice of the full weights", c.Rank(), s.Param.Name, filepath.Base(path))
				}
			}
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(dir, "rank0.safetensors")); err != nil {
		t.Fatal(err)
	}
}

// TestCheck: descriptions that do not fit their parameter are refused.
func TestCheck(t *testing.T) {
	ps := layers.NewParamSet(1)
	p, err := ps.Add("w", []int{3, 4}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		s    shard.Shard
		want string
	}{
		{shard.Shard{}, "without a parameter"},
		{shard.Shard{Param: p, Full: []int{3, 8}, Dim: -1}, "described as replicated"},
		{shard.Shard{Param: p, Full: []int{3, 8}, Over: shard.TP, Dim: 1, Lo: 0, Hi: 3}, "has shape (3, 4)"},
		{shard.Shard{Param: p, Full: []int{3, 8}, Over: shard.TP, Dim: 1, Lo: 6, Hi: 10}, "inside it"},
		{shard.Shard{Param: p, Full: []int{3, 8}, Over: 7, Dim: 1, Lo: 0, Hi: 4}, "split over Group(7)"},
	} {
		testutil.ErrorContains(t, tc.s.Check(), tc.want)
	}
	if err := (shard.Shard{Param: p, Full: []int{3, 8}, Over: shard.TP, Dim: 1, Lo: 4, Hi: 8}).Check(); err != nil {
		t.Error(err)
	}
	if err := shard.Replicated(p, false).Check(); err != nil {
		t.Error(err)
	}
}

// TestAssemble: a tensor cut into P pieces along a dimension (each piece
// twice: DP replicas) is assembled into each part of Q pieces along the
// same dimension, and into the whole, for P, Q in {1, 2, 4} (1: a whole
// piece); each part equals the reference slice of the original bit for
// bit. A part that a missing piece should cover, and pieces of another
// dimension, are refused.
func TestAssemble(t *testing.T) {
	full := []int{8, 4, 2}
	x := testutil.Rand(testutil.Rng(9), tensor.Float32, full...)
	xv, _ := x.Float64s()
	part := func(dim, n, r int) shard.Slice {
		if n == 1 {
			return shard.Slice{Full: full, Dim: -1}
		}
		w := full[dim] / n
		return shard.Slice{Full: full, Dim: dim, Lo: r * w, Hi: (r + 1) * w}
	}
	for _, dim := range []int{0, 1} {
		for _, P := range []int{1, 2, 4} {
			var pieces []shard.Piece
			for r := range P {
				c, err := shard.Cut(x, part(dim, P, r))
				if err != nil {
					t.Fatal(err)
				}
				p := shard.Piece{Name: "x", Slice: part(dim, P, r), Tensor: c}
				pieces = append(pieces, p, p)
			}
			for _, Q := range []int{1, 2, 4} {
				for q := range Q {
					dst := part(dim, Q, q)
					got, err := shard.Assemble(dst, pieces)
					if err != nil {
						t.Fatalf("dim %d, %d pieces into part %d of %d: %v", dim, P, q, Q, err)
					}
					gv, _ := got.Float64s()
					want := xv
					if !dst.Whole() {
						want = testutil.Slice(xv, full, dim, dst.Lo, dst.Hi)
					}
					if !slices.Equal(gv, want) || !got.Shape().Equal(dst.Shape()) {
						t.Fatalf("dim %d, %d pieces into part %d of %d: differs from the reference slice", dim, P, q, Q)
					}
				}
			}
			if P > 1 {
				// Without the last piece (and its replica) the last part is missing.
				_, err := shard.Assemble(part(dim, 1, 0), pieces[:2*(P-1)])
				testutil.ErrorContains(t, err, "no piece holds")
			}
		}
	}
	c, _ := shard.Cut(x, part(1, 2, 0))
	_, err := shard.Assemble(part(0, 2, 0), []shard.Piece{{Name: "x", Slice: part(1, 2, 0), Tensor: c}})
	testutil.ErrorContains(t, err, "split along dimension 1")
}
