package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// Embedding looks up rows of a table: out[n, :] = W[ids[n], :].
type Embedding struct {
	Name       string // the layer's name, its parameter's prefix
	Vocab, Dim int    // the table's rows (token ids) and columns
	W          *Param // (Vocab, Dim), weight decay

	b   tensor.Backend
	ids *tensor.Tensor // (N) int32: the ids of the last Forward (the caller's)
}

// NewEmbedding registers name+".weight", drawn from N(0, std²).
func NewEmbedding(b tensor.Backend, ps *ParamSet, name string, vocab, dim int, std float64) (*Embedding, error) {
	if b == nil || ps == nil {
		return nil, fmt.Errorf("layers: embedding %q: nil backend or parameter set", name)
	}
	if vocab <= 0 || dim <= 0 {
		return nil, fmt.Errorf("layers: embedding %q: vocab = %d, dim = %d, expected positive sizes", name, vocab, dim)
	}
	w, err := ps.Add(name+".weight", []int{vocab, dim}, true, Normal(std))
	if err != nil {
		return nil, err
	}
	return &Embedding{Name: name, Vocab: vocab, Dim: dim, W: w, b: b}, nil
}

// Params returns the table.
func (e *Embedding) Params() []*Param { return []*Param{e.W} }

func (e *Embedding) what() string { return "layers: embedding " + e.Name }

// Forward writes out (..., Dim) from ids (...) int32 on the backend's
// device. Ids in host memory are checked to lie in [0, Vocab) before any op
// runs; elsewhere the backend checks them (a sticky error).
func (e *Embedding) Forward(out, ids *tensor.Tensor) error {
	e.ids = nil
	if err := checkParams(e.what(), e.W); err != nil {
		return err
	}
	if err := layerkit.CheckOn(e.b, e.what(), "ids", ids, tensor.Int32); err != nil {
		return err
	}
	if len(ids.Shape()) == 0 {
		return fmt.Errorf("%s: ids is a scalar, expected (N) or (B, T)", e.what())
	}
	n := ids.Numel()
	if err := layerkit.CheckShape(e.b, e.what(), "output", out, e.W.W.DType(), append(ids.Shape().Clone(), e.Dim)...); err != nil {
		return err
	}
	if err := layerkit.CheckIDs("ids", ids, e.Vocab); err != nil {
		return fmt.Errorf("%s: %w", e.what(), err)
	}
	ids1 := layerkit.Reshape(ids, n)
	e.b.Embedding(layerkit.Reshape(out, n, e.Dim), e.W.W, ids1)
	e.ids = ids1
	return layerkit.Sticky(e.b, e.what(), "forward")
}

// Backward adds ∂L/∂W from dout (..., Dim); ids get no gradient.
func (e *Embedding) Backward(dout *tensor.Tensor) error {
	if e.ids == nil {
		return errors.New(e.what() + ": Backward without a successful Forward")
	}
	n := e.ids.Numel()
	if err := layerkit.CheckRowsN(e.b, e.what(), "output gradient", dout, e.W.W.DType(), e.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	e.b.EmbeddingBackward(e.W.G, layerkit.Reshape(dout, n, e.Dim), e.ids)
	return layerkit.Sticky(e.b, e.what(), "backward")
}
