package layers

import "github.com/asynctp/asynctp/tensor"

// Layer is a layer from activations to activations with an explicit
// backward: what a program that builds its own model composes. Linear,
// MLP, Attention, Block, RMSNorm and MoE are Layers; so are the tensor-
// parallel linears and MLP (parallel/tp) and the expert-parallel MoE
// (parallel/ep), whose Forward and Backward take this rank's part of the
// activations.
//
// Shapes are the layer's: (N, In) rows for a linear, (B, T, Dim) for
// Attention and Block, (n, Dim) rows for the others. The layers whose
// input is not such a tensor are not Layers: Embedding (token ids), the
// Experts of an MoE (rows grouped by expert), the Router.
type Layer interface {
	// Forward writes out from x and keeps what the backward needs (x
	// itself: do not change it before Backward).
	Forward(out, x *tensor.Tensor) error
	// Backward overwrites dx with ∂L/∂x and adds ∂L/∂W to the gradients
	// of the parameters, from dout = ∂L/∂out, for the last Forward.
	Backward(dx, dout *tensor.Tensor) error
	// Params returns the layer's parameters (registered in its ParamSet).
	Params() []*Param
}

var (
	_ Layer = (*Linear)(nil)
	_ Layer = (*MLP)(nil)
	_ Layer = (*Attention)(nil)
	_ Layer = (*Block)(nil)
	_ Layer = (*RMSNorm)(nil)
	_ Layer = (*MoE)(nil)
)
