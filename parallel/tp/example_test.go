package tp_test

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// A column-parallel linear feeding a row-parallel one (the Megatron MLP
// pattern) on two ranks with sequence parallelism: each rank enters with
// its half of the 8 tokens, computes all tokens on its half of the hidden
// features, and leaves with its half of the tokens again.
func Example() {
	shapes := make([]string, 2)
	err := local.Run(2, func(c comm.Comm) error {
		b := cpu.New()
		par := tp.Parallel{Group: c, SequenceParallel: true} // Overlap nil: every site collective
		ps := layers.NewParamSet(1)
		up, err := tp.NewColumnParallelLinear(b, ps, par, "up", tp.ColumnConfig{In: 4, Out: 16, Std: 0.1})
		if err != nil {
			return err
		}
		down, err := tp.NewRowParallelLinear(b, ps, par, "down", tp.RowConfig{In: 16, Out: 4, Std: 0.1})
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		x := b.Zeros(tensor.Float32, 4, 4) // this rank's 4 of the 8 tokens
		b.Fill(x, 1)
		h, y := b.Zeros(tensor.Float32, 8, 8), b.Zeros(tensor.Float32, 4, 4)
		if err := up.Forward(h, x); err != nil { // all-gather + matmul
			return err
		}
		if err := down.Forward(y, h); err != nil { // matmul + reduce-scatter
			return err
		}
		shapes[c.Rank()] = fmt.Sprintf("rank %d: x %v → h %v → y %v, weights %v and %v",
			c.Rank(), x.Shape(), h.Shape(), y.Shape(), up.W.Shape(), down.W.Shape())
		return nil
	})
	fmt.Println("error:", err)
	for _, s := range shapes {
		fmt.Println(s)
	}
	// Output:
	// error: <nil>
	// rank 0: x (4, 4) → h (8, 8) → y (4, 4), weights (8, 4) and (4, 8)
	// rank 1: x (4, 4) → h (8, 8) → y (4, 4), weights (8, 4) and (4, 8)
}
