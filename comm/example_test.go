package comm_test

import (
	"fmt"
	"sync"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
)

// Four ranks (goroutines, the local transport) split into a grid of two
// data-parallel replicas of two tensor-parallel ranks, and sum a value
// over their TP group.
func ExampleNewGrid() {
	lines := make([]string, 4)
	var mu sync.Mutex
	err := local.Run(4, func(world comm.Comm) error {
		g, err := comm.NewGrid(world, 2, 2, 1) // DP 2 × TP 2, EP 1
		if err != nil {
			return err
		}
		x, _ := tensor.FromFloat32([]float32{float32(world.Rank())}, 1)
		w, err := g.TPGroup.AllReduce(x, comm.Sum, nil)
		if err == nil {
			err = w.Wait(nil)
		}
		mu.Lock()
		lines[world.Rank()] = fmt.Sprintf("rank %d: %s, %s, Σ over TP = %v", world.Rank(), g.TPGroup.Name(), g.DPGroup.Name(), x.F32()[0])
		mu.Unlock()
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// rank 0: tp[0 1], dp[0 2], Σ over TP = 1
	// rank 1: tp[0 1], dp[1 3], Σ over TP = 1
	// rank 2: tp[2 3], dp[0 2], Σ over TP = 5
	// rank 3: tp[2 3], dp[1 3], Σ over TP = 5
}
