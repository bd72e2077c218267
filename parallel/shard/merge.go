package shard

import (
	"fmt"
	"sort"

	"github.com/asynctp/asynctp/tensor"
)

// Piece is one rank's part of a named full parameter: where it lies, and
// its values in a host tensor shaped like the slice.
type Piece struct {
	Name   string         // the full parameter's name
	Slice  Slice          // where the piece lies in it
	Tensor *tensor.Tensor // the piece's values, a host tensor of the slice's shape
}

// Merge puts the pieces of every named parameter together into full host
// tensors, by name. The pieces of a name must agree on the full shape and
// the dtype, and together cover every element: where several pieces are
// the same slice (data-parallel replicas, replicated parameters) the first
// one is taken; pieces that overlap otherwise, or leave a part uncovered,
// are an error naming the parameter.
func Merge(pieces []Piece) (map[string]*tensor.Tensor, error) {
	byName := map[string][]Piece{}
	var names []string
	for i, p := range pieces {
		if p.Tensor == nil {
			return nil, fmt.Errorf("shard: merge: piece %d (%q) has no tensor", i, p.Name)
		}
		if err := p.Slice.check(); err != nil {
			return nil, fmt.Errorf("shard: merge: piece %d of %q: %w", i, p.Name, err)
		}
		if !p.Tensor.Shape().Equal(p.Slice.Shape()) {
			return nil, fmt.Errorf("shard: merge: piece %d of %q has shape %v, but its slice of %v has shape %v", i, p.Name, p.Tensor.Shape(), p.Slice.Full, p.Slice.Shape())
		}
		if _, ok := byName[p.Name]; !ok {
			names = append(names, p.Name)
		}
		byName[p.Name] = append(byName[p.Name], p)
	}
	out := make(map[string]*tensor.Tensor, len(names))
	for _, name := range names {
		t, err := mergeOne(name, byName[name])
		if err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}

// mergeOne assembles one parameter from its pieces.
func mergeOne(name string, ps []Piece) (*tensor.Tensor, error) {
	first := ps[0]
	full := first.Slice.Full
	dt := first.Tensor.DType()
	var kept []Piece
	for _, p := range ps {
		if !p.Slice.Full.Equal(full) || p.Tensor.DType() != dt {
			return nil, fmt.Errorf("shard: merge: the pieces of %q disagree: full shape %v and %v, dtype %v and %v", name, full, p.Slice.Full, dt, p.Tensor.DType())
		}
		dup := false
		for _, k := range kept {
			if k.Slice.Equal(p.Slice) {
				dup = true
				break
			}
		}
		if !dup {
			kept = append(kept, p)
		}
	}
	out, err := tensor.Host(dt, full...)
	if err != nil {
		return nil, fmt.Errorf("shard: merge of %q: %w", name, err)
	}
	if len(kept) == 1 && kept[0].Slice.Whole() {
		if err := copyPart(out, kept[0].Tensor, Slice{Full: full, Dim: -1}, true); err != nil {
			return nil, fmt.Errorf("shard: merge of %q: %w", name, err)
		}
		return out, nil
	}
	// Several distinct slices: they must all split the same dimension and
	// tile it exactly.
	dim := kept[0].Slice.Dim
	for _, k := range kept {
		if k.Slice.Whole() || k.Slice.Dim != dim {
			return nil, fmt.Errorf("shard: merge: the pieces of %q overlap: %s and %s", name, describe(kept[0].Slice), describe(k.Slice))
		}
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].Slice.Lo < kept[j].Slice.Lo })
	pos := 0
	for _, k := range kept {
		switch {
		case k.Slice.Lo < pos:
			return nil, fmt.Errorf("shard: merge: the pieces of %q overlap at [%d, %d) of dimension %d", name, k.Slice.Lo, pos, dim)
		case k.Slice.Lo > pos:
			return nil, fmt.Errorf("shard: merge: no piece holds [%d, %d) of dimension %d of %q %v (a rank's weights are missing)", pos, k.Slice.Lo, dim, name, full)
		}
		if err := copyPart(out, k.Tensor, k.Slice, true); err != nil {
			return nil, fmt.Errorf("shard: merge of %q: %w", name, err)
		}
		pos = k.Slice.Hi
	}
	if pos != full[dim] {
		return nil, fmt.Errorf("shard: merge: no piece holds [%d, %d) of dimension %d of %q %v (a rank's weights are missing)", pos, full[dim], dim, name, full)
	}
	return out, nil
}

func describe(s Slice) string {
	if s.Whole() {
		return fmt.Sprintf("the whole %v", s.Full)
	}
	return fmt.Sprintf("[%d, %d) of dimension %d", s.Lo, s.Hi, s.Dim)
}

// Cut returns the part s of the host tensor full (shaped s.Full) as a new
// host tensor of its dtype.
func Cut(full *tensor.Tensor, s Slice) (*tensor.Tensor, error) {
	if full == nil {
		return nil, fmt.Errorf("shard: cut of a nil tensor")
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("shard: cut: %w", err)
	}
	if !full.Shape().Equal(s.Full) {
		return nil, fmt.Errorf("shard: cut: the tensor has shape %v, the slice is of %v", full.Shape(), s.Full)
	}
	out, err := tensor.Host(full.DType(), s.Shape()...)
	if err != nil {
		return nil, fmt.Errorf("shard: cut: %w", err)
	}
	if err := copyPart(full, out, s, false); err != nil {
		return nil, fmt.Errorf("shard: cut: %w", err)
	}
	return out, nil
}

// copyPart copies between a full host tensor and a part of it (slice s):
// into the full one when toFull, else out of it. Both have one dtype.
func copyPart(full, part *tensor.Tensor, s Slice, toFull bool) error {
	if full.DType() != part.DType() {
		return fmt.Errorf("dtypes %v and %v", full.DType(), part.DType())
	}
	switch full.DType() {
	case tensor.Float32:
		return copySlice(full.F32(), part.F32(), s, toFull)
	case tensor.Float64:
		return copySlice(full.F64(), part.F64(), s, toFull)
	case tensor.BFloat16:
		return copySlice(full.BF16(), part.BF16(), s, toFull)
	case tensor.Int32:
		return copySlice(full.I32(), part.I32(), s, toFull)
	}
	return fmt.Errorf("dtype %v", full.DType())
}

// copySlice copies the part s between fullV (shape s.Full) and partV (the
// slice's shape).
func copySlice[T any](fullV, partV []T, s Slice, toFull bool) error {
	if fullV == nil || partV == nil {
		return fmt.Errorf("not a host tensor")
	}
	if s.Whole() {
		if toFull {
			copy(fullV, partV)
		} else {
			copy(partV, fullV)
		}
		return nil
	}
	outer := s.Full[:s.Dim].Numel()
	inner := s.Full[s.Dim+1:].Numel()
	F, n := s.Full[s.Dim], s.Hi-s.Lo
	for o := range outer {
		f := fullV[(o*F+s.Lo)*inner : (o*F+s.Hi)*inner]
		p := partV[o*n*inner : (o+1)*n*inner]
		if toFull {
			copy(f, p)
		} else {
			copy(p, f)
		}
	}
	return nil
}

// Overlaps reports whether two slices of the same full shape share an
// element: a whole slice overlaps every slice, two slices of one dimension
// when their ranges meet. (Slices of two different dimensions always
// share elements.)
func (s Slice) Overlaps(o Slice) bool {
	if s.Whole() || o.Whole() || s.Dim != o.Dim {
		return true
	}
	return s.Lo < o.Hi && o.Lo < s.Hi
}

// Assemble builds the part dst of a full tensor, as a new host tensor of
// dst's shape, from pieces of it: the pieces of another layout, each the
// same full tensor's slice (a resharding: a rank of one layout taking its
// part from the ranks of another). Every element of dst must be in some
// piece; pieces outside dst are skipped, and pieces that are the same
// slice (replicas) are taken once. The pieces and dst must split the same
// dimension where both are split. Merge is Assemble of the whole tensor.
func Assemble(dst Slice, pieces []Piece) (*tensor.Tensor, error) {
	if err := dst.check(); err != nil {
		return nil, fmt.Errorf("shard: assemble: %w", err)
	}
	if len(pieces) == 0 {
		return nil, fmt.Errorf("shard: assemble: no pieces")
	}
	name := pieces[0].Name
	// Each piece's part inside dst, as a piece of dst's own shape.
	var local []Piece
	for i, p := range pieces {
		if p.Tensor == nil {
			return nil, fmt.Errorf("shard: assemble: piece %d (%q) has no tensor", i, p.Name)
		}
		if err := p.Slice.check(); err != nil {
			return nil, fmt.Errorf("shard: assemble: piece %d of %q: %w", i, p.Name, err)
		}
		if !p.Slice.Full.Equal(dst.Full) {
			return nil, fmt.Errorf("shard: assemble: piece %d of %q is a slice of %v, the part wanted one of %v", i, p.Name, p.Slice.Full, dst.Full)
		}
		if !p.Tensor.Shape().Equal(p.Slice.Shape()) {
			return nil, fmt.Errorf("shard: assemble: piece %d of %q has shape %v, but its slice of %v has shape %v", i, p.Name, p.Tensor.Shape(), p.Slice.Full, p.Slice.Shape())
		}
		if !p.Slice.Overlaps(dst) {
			continue
		}
		var lp Piece
		var err error
		switch {
		case dst.Whole():
			lp = p // the full tensor: the piece's own slice
		case p.Slice.Whole():
			// dst's range, cut out of the whole piece.
			t, err := Cut(p.Tensor, dst)
			if err != nil {
				return nil, fmt.Errorf("shard: assemble of %q: %w", p.Name, err)
			}
			lp = Piece{Name: p.Name, Slice: Slice{Full: dst.Shape(), Dim: -1}, Tensor: t}
		case p.Slice.Dim != dst.Dim:
			return nil, fmt.Errorf("shard: assemble of %q: a piece split along dimension %d, the part wanted along %d", p.Name, p.Slice.Dim, dst.Dim)
		default:
			lo, hi := max(p.Slice.Lo, dst.Lo), min(p.Slice.Hi, dst.Hi)
			t := p.Tensor
			if lo != p.Slice.Lo || hi != p.Slice.Hi {
				if t, err = Cut(p.Tensor, Slice{Full: p.Slice.Shape(), Dim: dst.Dim, Lo: lo - p.Slice.Lo, Hi: hi - p.Slice.Lo}); err != nil {
					return nil, fmt.Errorf("shard: assemble of %q: %w", p.Name, err)
				}
			}
			lp = Piece{Name: p.Name, Slice: Slice{Full: dst.Shape(), Dim: dst.Dim, Lo: lo - dst.Lo, Hi: hi - dst.Lo}, Tensor: t}
			if lp.Slice.Lo == 0 && lp.Slice.Hi == lp.Slice.Full[dst.Dim] {
				lp.Slice = Slice{Full: lp.Slice.Full, Dim: -1}
			}
		}
		local = append(local, lp)
	}
	if len(local) == 0 {
		return nil, fmt.Errorf("shard: assemble: no piece of %q holds any of %s of %v", name, describe(dst), dst.Full)
	}
	for _, p := range local[1:] {
		if p.Name != name {
			return nil, fmt.Errorf("shard: assemble: pieces of %q and %q", name, p.Name)
		}
	}
	if dst.Whole() {
		return mergeOne(name, local)
	}
	t, err := mergeOne(name, local)
	if err != nil {
		return nil, fmt.Errorf("%w (assembling %s of %v)", err, describe(dst), dst.Full)
	}
	return t, nil
}
