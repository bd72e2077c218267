package tp

import "github.com/asynctp/asynctp/layers"

// The linears and the MLP are layers.Layers: their Forward and Backward
// take this rank's part of the activations (see each type). Attention and
// Block take the batch and sequence sizes too (their rows may be this
// rank's share of the tokens under sequence parallelism).
var (
	_ layers.Layer = (*ColumnParallelLinear)(nil)
	_ layers.Layer = (*RowParallelLinear)(nil)
	_ layers.Layer = (*MLP)(nil)
)
