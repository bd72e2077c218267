package ablate

import (
	"testing"
	"time"
)

func TestRunLocalSmoke(t *testing.T) {
	m := Matrix{Ops: []Op{OpAllGatherMatmul, OpMatmulReduceScatter, OpMatmulAllReduce, OpMoEDispatchCombine}, Models: []string{"quick"}, Ms: []int{64},
		Worlds: []int{2}, Transports: []string{"local"}, Strategies: []string{Collective, Pipelined}, DType: "f32", Warmup: 1, Reps: 3}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	var cells []Cell
	for _, c := range m.Cells() {
		if Runnable(c, 0, "no GPU") == "" {
			cells = append(cells, c)
		}
	}
	rs, err := RunLocal(2, cells, LocalStrategies(), 1, 3, 1, 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		t.Logf("%s: %s %s err %.2g %.1f µs gemm %.1f comm %.1f", r.ID(), r.Status, r.Reason, r.RelErr, r.MedianUS, r.GemmUS, r.CommUS)
	}
}
