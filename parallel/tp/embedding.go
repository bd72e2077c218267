package tp

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/tensor"
)

// VocabParallelEmbedding is layers.Embedding with the table's rows (the
// vocabulary) split over the TP group: rank r holds ids [Lo, Lo+Vocab/P).
// Each rank looks up the ids of its range and leaves the other tokens' rows
// zero; the partial tables then leave the TP region: all-reduced (forward
// all-reduce, backward identity) or, under sequence parallelism,
// reduce-scattered along the tokens (forward reduce-scatter, backward
// all-gather), so every token's row comes from exactly one rank.
//
// Which ids fall in the range is decided on the host (the ids are host
// int32 tensors, as a data loader yields them): the lookup is a gather of
// the in-range rows and a scatter into the zeroed output (Embedding and
// EmbeddingBackward on views), with no masking op needed on the backend.
type VocabParallelEmbedding struct {
	Name           string        // the layer's name, its parameter's prefix
	Vocab, Dim     int           // full sizes
	LocalVocab, Lo int           // Vocab/P and this rank's first id
	W              *layers.Param // (Vocab/P, Dim): rows [Lo, Lo+Vocab/P) of the full table, weight decay

	b      tensor.Backend
	par    Parallel
	shards []shard.Shard
	n      int            // tokens N of the last Forward; 0 before a successful one
	m      int            // how many of them have an id in this rank's range
	all    bool           // every id was in range (always so with P = 1): no scatter needed
	pos    *tensor.Tensor // (m) int32: positions of those tokens
	loc    *tensor.Tensor // (m) int32: their rows in the local table
	rows   *tensor.Tensor // (m, Dim) scratch: the gathered rows
	full   *tensor.Tensor // (N, Dim) SP: the partial output before the reduce-scatter, then the gathered gradient
}

// NewVocabParallelEmbedding registers name+".weight" with this rank's rows
// of the table layers.NewEmbedding draws from N(0, std²) with the same seed.
func NewVocabParallelEmbedding(b tensor.Backend, ps *layers.ParamSet, par Parallel, name string, vocab, dim int, std float64) (*VocabParallelEmbedding, error) {
	what := "tp: vocab-parallel embedding " + name
	if b == nil || ps == nil {
		return nil, fmt.Errorf("%s: nil backend or parameter set", what)
	}
	if err := par.check(what); err != nil {
		return nil, err
	}
	if vocab <= 0 || dim <= 0 {
		return nil, fmt.Errorf("%s: vocab = %d, dim = %d, expected positive sizes", what, vocab, dim)
	}
	lo, hi, err := par.split(what, "vocab", vocab)
	if err != nil {
		return nil, err
	}
	w, ws, err := addShard(ps, name+".weight", []int{vocab, dim}, 0, lo, hi, true, layers.Normal(std))
	if err != nil {
		return nil, err
	}
	return &VocabParallelEmbedding{Name: name, Vocab: vocab, Dim: dim, LocalVocab: hi - lo, Lo: lo, W: w,
		b: b, par: par, shards: []shard.Shard{ws}}, nil
}

// Params returns the table shard.
func (e *VocabParallelEmbedding) Params() []*layers.Param { return []*layers.Param{e.W} }

// Shards describes the table shard.
func (e *VocabParallelEmbedding) Shards() []shard.Shard { return e.shards }

func (e *VocabParallelEmbedding) what() string { return "tp: vocab-parallel embedding " + e.Name }

// Forward writes out (N, Dim) — or (N/P, Dim), this rank's tokens, under
// sequence parallelism — from ids, a host int32 tensor of N ids in
// [0, Vocab) (any shape; row-major order gives the token order).
func (e *VocabParallelEmbedding) Forward(out, ids *tensor.Tensor) error {
	e.n = 0
	if err := checkParams(e.what(), e.W); err != nil {
		return err
	}
	if ids == nil || ids.DType() != tensor.Int32 || ids.I32() == nil || len(ids.Shape()) == 0 || ids.Numel() == 0 {
		return fmt.Errorf("%s: ids is %v, expected a non-empty host int32 tensor (N) or (B, T)", e.what(), ids)
	}
	if err := layerkit.CheckIDs("ids", ids, e.Vocab); err != nil {
		return fmt.Errorf("%s: %w", e.what(), err)
	}
	N := ids.Numel()
	n, err := e.par.seqRows(e.what(), N)
	if err != nil {
		return err
	}
	dt := e.W.W.DType()
	if err := layerkit.CheckRowsN(e.b, e.what(), "output", out, dt, e.Dim, n, "this rank's tokens"); err != nil {
		return err
	}
	if err := layerkit.Sticky(e.b, e.what(), "forward"); err != nil {
		return err
	}
	// This rank's tokens: positions and local rows, in token order.
	var pos, loc []int32
	for i, id := range ids.I32() {
		if l := int(id) - e.Lo; l >= 0 && l < e.LocalVocab {
			pos = append(pos, int32(i))
			loc = append(loc, int32(l))
		}
	}
	e.m, e.all = len(pos), len(pos) == N
	if e.m > 0 {
		e.pos = layerkit.Ensure(e.b, e.pos, tensor.Int32, e.m)
		e.loc = layerkit.Ensure(e.b, e.loc, tensor.Int32, e.m)
		e.b.Upload(e.pos, hostI32(pos))
		e.b.Upload(e.loc, hostI32(loc))
	}
	out2 := layerkit.Reshape(out, n, e.Dim)
	target := out2
	if e.par.SequenceParallel && e.par.Size() > 1 {
		e.full = layerkit.Ensure(e.b, e.full, dt, N, e.Dim)
		target = e.full
	}
	switch {
	case e.all:
		e.b.Embedding(target, e.W.W, e.loc)
	default:
		e.b.Fill(target, 0)
		if e.m > 0 {
			e.rows = layerkit.Ensure(e.b, e.rows, dt, e.m, e.Dim)
			e.b.Embedding(e.rows, e.W.W, e.loc)          // gather this rank's rows
			e.b.EmbeddingBackward(target, e.rows, e.pos) // scatter them to their tokens
		}
	}
	if err := layerkit.Sticky(e.b, e.what(), "forward"); err != nil {
		return err
	}
	g, s := e.par.Group, e.par.Stream
	if e.par.SequenceParallel {
		err = wait(s)(overlap.SequenceReduceScatterForward(e.b, g, out2, target, s))
	} else {
		err = wait(s)(overlap.ReduceFromRegionForward(g, out2, s))
	}
	if err != nil {
		return fmt.Errorf("%s forward: %w", e.what(), err)
	}
	e.n = N
	return layerkit.Sticky(e.b, e.what(), "forward")
}

// Backward adds ∂L/∂W from dout (shaped like the forward's out); ids get
// no gradient.
func (e *VocabParallelEmbedding) Backward(dout *tensor.Tensor) error {
	if e.n == 0 {
		return fmt.Errorf("%s: %w", e.what(), errNoForward)
	}
	N, dt := e.n, e.W.W.DType()
	n, _ := e.par.seqRows(e.what(), N)
	if err := layerkit.CheckRowsN(e.b, e.what(), "output gradient", dout, dt, e.Dim, n, "like the forward's output"); err != nil {
		return err
	}
	if err := layerkit.Sticky(e.b, e.what(), "backward"); err != nil {
		return err
	}
	g, s := e.par.Group, e.par.Stream
	d := layerkit.Reshape(dout, n, e.Dim)
	if e.par.SequenceParallel && e.par.Size() > 1 {
		e.full = layerkit.Ensure(e.b, e.full, dt, N, e.Dim)
		if err := wait(s)(overlap.SequenceReduceScatterBackward(e.b, g, e.full, d, s)); err != nil {
			return fmt.Errorf("%s backward: %w", e.what(), err)
		}
		d = e.full
	} else if err := wait(s)(overlap.ReduceFromRegionBackward(g, d, s)); err != nil {
		return fmt.Errorf("%s backward: %w", e.what(), err)
	}
	switch {
	case e.all:
		e.b.EmbeddingBackward(e.W.G, d, e.loc)
	case e.m > 0:
		e.b.Embedding(e.rows, d, e.pos)             // this rank's tokens' gradients
		e.b.EmbeddingBackward(e.W.G, e.rows, e.loc) // into their table rows, in token order
	}
	return layerkit.Sticky(e.b, e.what(), "backward")
}

// hostI32 wraps v as a host int32 tensor (N).
func hostI32(v []int32) *tensor.Tensor {
	t, err := tensor.FromInt32(v, len(v))
	if err != nil {
		panic("tp: internal error: " + err.Error())
	}
	return t
}
