package model_test

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Four goroutine ranks, DP 2 × TP 2 with sequence parallelism, compute the
// loss of layers.GPT on the same global batch.
func Example() {
	cfg := layers.GPTConfig{Layers: 1, Dim: 16, Heads: 2, Vocab: 32, Seq: 4, FFN: 32, Seed: 1}
	ids, _ := tensor.FromInt32([]int32{1, 5, 9, 2, 7, 7, 3, 30}, 2, 4)
	targets, _ := tensor.FromInt32([]int32{5, 9, 2, 4, 7, 3, 30, 0}, 2, 4)
	ref, _ := layers.NewGPT(cpu.New(), cfg, tensor.Float32)
	want, _ := ref.Forward(ids, targets)

	losses := make([]float64, 4)
	err := local.Run(4, func(c comm.Comm) error {
		grid, err := comm.NewGrid(c, 2, 2, 1) // DP 2 × TP 2, EP 1
		if err != nil {
			return err
		}
		defer grid.Close()
		m, err := model.New(cpu.New(), grid, cfg, model.Options{SequenceParallel: true}, tensor.Float32)
		if err != nil {
			return err
		}
		losses[c.Rank()], err = m.Forward(ids, targets) // the global batch on every rank
		if err != nil {
			return err
		}
		return m.Backward() // gradients reduced over TP and DP
	})
	fmt.Println("error:", err)
	for r, l := range losses {
		fmt.Printf("rank %d: loss equals layers.GPT's: %v\n", r, math.Abs(l-want) < 1e-5*want)
	}
	// Output:
	// error: <nil>
	// rank 0: loss equals layers.GPT's: true
	// rank 1: loss equals layers.GPT's: true
	// rank 2: loss equals layers.GPT's: true
	// rank 3: loss equals layers.GPT's: true
}
