package hf

import (
	"fmt"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// Placement is where a rank of a parallel run sits: TP rank TPRank of a TP
// group of TP ranks (which splits the attention heads, the MLP's hidden
// features and the vocabulary), and EP rank EPRank of EP (which splits the
// experts). A single rank is {1, 0, 1, 0}.
type Placement struct {
	TP, TPRank, EP, EPRank int
}

// Single is the placement of a model of one rank.
var Single = Placement{TP: 1, EP: 1}

// part says which slice of the full parameter p a rank at pl whose tensor
// has shape local holds. Expert weights are split along their first
// dimension over EP; the other split parameters over TP, along the one
// dimension where the shapes differ.
func part(p Param, local []int, pl Placement) (shard.Slice, error) {
	full := tensor.Shape(p.Shape).Clone()
	if len(local) != len(p.Shape) {
		return shard.Slice{}, fmt.Errorf("hf: %s has shape %v, expected a part of %v", p.Name, local, p.Shape)
	}
	if slices.Equal(local, p.Shape) {
		return shard.Slice{Full: full, Dim: -1}, nil
	}
	if p.Expert {
		if !slices.Equal(local[1:], p.Shape[1:]) || local[0]*pl.EP != p.Shape[0] {
			return shard.Slice{}, fmt.Errorf("hf: %s has shape %v, expected %d/%d experts of %v (EP %d)", p.Name, local, p.Shape[0], pl.EP, p.Shape, pl.EP)
		}
		lo := pl.EPRank * local[0]
		return shard.Slice{Full: full, Dim: 0, Lo: lo, Hi: lo + local[0]}, nil
	}
	dim := -1
	for d := range local {
		if local[d] != p.Shape[d] {
			if dim >= 0 {
				return shard.Slice{}, fmt.Errorf("hf: %s has shape %v, which differs from the full %v in more than one dimension", p.Name, local, p.Shape)
			}
			dim = d
		}
	}
	if local[dim]*pl.TP != p.Shape[dim] {
		return shard.Slice{}, fmt.Errorf("hf: %s has shape %v, expected 1/%d of %v along dimension %d (TP %d)", p.Name, local, pl.TP, p.Shape, dim, pl.TP)
	}
	lo := pl.TPRank * local[dim]
	return shard.Slice{Full: full, Dim: dim, Lo: lo, Hi: lo + local[dim]}, nil
}

// RankWeights are the parameters one rank holds (by our names, its
// shards) and where it sits.
type RankWeights struct {
	Placement Placement
	Tensors   map[string]*tensor.Tensor
}

// Consolidate merges the ranks' shards into the full parameters of m, as
// float32 host tensors by name (shard.Merge). Every element of every
// parameter must be held by some rank; where several ranks hold the same
// part (DP replicas, the replicated parameters) the lowest rank's is
// taken. A name no rank holds, or one the model does not have, is an
// error.
func Consolidate(m layers.GPTConfig, ranks []RankWeights) (map[string]*tensor.Tensor, error) {
	params := Params(m)
	known := map[string]bool{}
	var pieces []shard.Piece
	for _, p := range params {
		known[p.Name] = true
		for r, rw := range ranks {
			t, ok := rw.Tensors[p.Name]
			if !ok {
				return nil, fmt.Errorf("hf: rank %d holds no %s", r, p.Name)
			}
			sl, err := part(p, t.Shape(), rw.Placement)
			if err != nil {
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
			v, err := tensor.ToFloat32(t)
			if err != nil {
				return nil, fmt.Errorf("hf: rank %d: %s: %w", r, p.Name, err)
			}
			pieces = append(pieces, shard.Piece{Name: p.Name, Slice: sl, Tensor: v})
		}
	}
	for r, rw := range ranks {
		for n := range rw.Tensors {
			if !known[n] {
				return nil, fmt.Errorf("hf: rank %d holds %s, which the model of its config does not have", r, n)
			}
		}
	}
	out, err := shard.Merge(pieces)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	return out, nil
}

// Shard cuts the part a rank at pl holds, of shape local, out of the full
// parameter named name of m, as a float32 host tensor (shard.Cut).
func Shard(m layers.GPTConfig, name string, full *tensor.Tensor, local []int, pl Placement) (*tensor.Tensor, error) {
	var p Param
	for _, q := range Params(m) {
		if q.Name == name {
			p = q
		}
	}
	if p.Name == "" {
		return nil, fmt.Errorf("hf: the model has no parameter %s", name)
	}
	if !slices.Equal([]int(full.Shape()), p.Shape) {
		return nil, fmt.Errorf("hf: %s has shape %v, expected %v", name, full.Shape(), p.Shape)
	}
	sl, err := part(p, local, pl)
	if err != nil {
		return nil, err
	}
	f, err := tensor.ToFloat32(full)
	if err != nil {
		return nil, err
	}
	if sl.Whole() {
		return f, nil
	}
	return shard.Cut(f, sl)
}

// IsExpert reports whether our parameter name is a stacked expert weight.
func IsExpert(name string) bool {
	return strings.Contains(name, ".moe.w_")
}
