package hf

import (
	"fmt"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/layers"
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
// has shape local holds: [lo, lo+local[dim]) along dim, or all of it when
// dim is -1. Expert weights are split along their first dimension over
// EP; the other split parameters over TP, along the one dimension where
// the shapes differ.
func part(p Param, local []int, pl Placement) (dim, lo int, err error) {
	if len(local) != len(p.Shape) {
		return 0, 0, fmt.Errorf("hf: %s has shape %v, expected a part of %v", p.Name, local, p.Shape)
	}
	if slices.Equal(local, p.Shape) {
		return -1, 0, nil
	}
	if p.Expert {
		if !slices.Equal(local[1:], p.Shape[1:]) || local[0]*pl.EP != p.Shape[0] {
			return 0, 0, fmt.Errorf("hf: %s has shape %v, expected %d/%d experts of %v (EP %d)", p.Name, local, p.Shape[0], pl.EP, p.Shape, pl.EP)
		}
		return 0, pl.EPRank * local[0], nil
	}
	dim = -1
	for d := range local {
		if local[d] != p.Shape[d] {
			if dim >= 0 {
				return 0, 0, fmt.Errorf("hf: %s has shape %v, which differs from the full %v in more than one dimension", p.Name, local, p.Shape)
			}
			dim = d
		}
	}
	if local[dim]*pl.TP != p.Shape[dim] {
		return 0, 0, fmt.Errorf("hf: %s has shape %v, expected 1/%d of %v along dimension %d (TP %d)", p.Name, local, pl.TP, p.Shape, dim, pl.TP)
	}
	return dim, pl.TPRank * local[dim], nil
}

// copySlice copies between a full tensor's values (shape full) and a
// part's (the same shape but n along dim, from lo): toFull copies the
// part in, else out.
func copySlice(fullV, partV []float32, full []int, dim, lo, n int, toFull bool) {
	outer, inner := 1, 1
	for _, d := range full[:dim] {
		outer *= d
	}
	for _, d := range full[dim+1:] {
		inner *= d
	}
	F := full[dim]
	for o := range outer {
		f := fullV[(o*F+lo)*inner : (o*F+lo+n)*inner]
		p := partV[o*n*inner : (o+1)*n*inner]
		if toFull {
			copy(f, p)
		} else {
			copy(p, f)
		}
	}
}

// RankWeights are the parameters one rank holds (by our names, its
// shards) and where it sits.
type RankWeights struct {
	Placement Placement
	Tensors   map[string]*tensor.Tensor
}

// Consolidate merges the ranks' shards into the full parameters of m, as
// float32 host tensors by name. Every element of every parameter must be
// held by some rank; where several ranks hold the same part (DP replicas,
// the replicated parameters) the lowest rank's is taken. A name no rank
// holds, or one the model does not have, is an error.
func Consolidate(m layers.GPTConfig, ranks []RankWeights) (map[string]*tensor.Tensor, error) {
	params := Params(m)
	known := map[string]bool{}
	out := map[string]*tensor.Tensor{}
	for _, p := range params {
		known[p.Name] = true
		full := make([]float32, tensor.Shape(p.Shape).Numel())
		covered := map[[2]int]bool{} // (dim, lo) parts already in
		have := 0
		for r, rw := range ranks {
			t, ok := rw.Tensors[p.Name]
			if !ok {
				return nil, fmt.Errorf("hf: rank %d holds no %s", r, p.Name)
			}
			dim, lo, err := part(p, t.Shape(), rw.Placement)
			if err != nil {
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
			if covered[[2]int{dim, lo}] {
				continue
			}
			covered[[2]int{dim, lo}] = true
			v, err := toF32(t)
			if err != nil {
				return nil, fmt.Errorf("hf: rank %d: %s: %w", r, p.Name, err)
			}
			if dim < 0 {
				copy(full, v.F32())
				have = len(full)
				continue
			}
			copySlice(full, v.F32(), p.Shape, dim, lo, t.Shape()[dim], true)
			have += t.Numel()
		}
		if have != len(full) {
			return nil, fmt.Errorf("hf: the ranks hold %d of the %d values of %s %v: a rank's checkpoint is missing", have, len(full), p.Name, p.Shape)
		}
		t, err := tensor.FromFloat32(full, p.Shape...)
		if err != nil {
			return nil, err
		}
		out[p.Name] = t
	}
	for r, rw := range ranks {
		for n := range rw.Tensors {
			if !known[n] {
				return nil, fmt.Errorf("hf: rank %d holds %s, which the model of its config does not have", r, n)
			}
		}
	}
	return out, nil
}

// Shard cuts the part a rank at pl holds, of shape local, out of the full
// parameter named name of m, as a float32 host tensor.
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
	dim, lo, err := part(p, local, pl)
	if err != nil {
		return nil, err
	}
	f, err := toF32(full)
	if err != nil {
		return nil, err
	}
	if dim < 0 {
		return f, nil
	}
	v := make([]float32, tensor.Shape(local).Numel())
	copySlice(f.F32(), v, p.Shape, dim, lo, local[dim], false)
	return tensor.FromFloat32(v, local...)
}

// IsExpert reports whether our parameter name is a stacked expert weight.
func IsExpert(name string) bool {
	return strings.Contains(name, ".moe.w_")
}
