package ablate

import (
	"testing"
	"time"

	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

func TestRunLocalSmoke(t *testing.T) {
	m := Matrix{Ops: []Op{OpAllGatherMatmul, OpMatmulReduceScatter, OpMatmulAllReduce, OpMoEDispatchCombine}, Models: []string{"tiny"}, Ms: []int{64},
		Worlds: []int{2}, Transports: []string{"local"}, Strategies: []string{Collective, Pipelined}, DType: "f32", Warmup: 1, Reps: 3, Alpha: DefaultAlpha, MinEffect: DefaultMinEffectCPU}
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

// off is collective with an all-gather∘matmul forward off by 1e-3.
type off struct{ overlap.Collective }

func (off) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	s, err := overlap.Collective{}.NewAllGatherMatmul(sp)
	return offAGMM{s, sp.Backend}, err
}

type offAGMM struct {
	overlap.AllGatherMatmul
	b tensor.Backend
}

func (s offAGMM) Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error {
	if err := s.AllGatherMatmul.Forward(outs, xFull, x, ws); err != nil {
		return err
	}
	s.b.Scale(outs[0], outs[0], 1.001)
	return nil
}

// The layer cells' collective is checked against the unsharded layers, not
// only against itself: a collective whose entry site is off is wrong in
// the block with sequence parallelism and in the step, right without it.
func TestLayerCollectiveAgainstUnsharded(t *testing.T) {
	m := Matrix{Ops: []Op{OpTPBlock, OpTrainStep}, Models: []string{"tiny"}, Ms: []int{64}, Worlds: []int{2}, Transports: []string{"local"},
		Strategies: []string{Collective}, DType: "f32", Warmup: 0, Reps: 1}
	cells := m.Cells()
	rs, err := RunLocal(2, cells, map[string]overlap.Strategy{Collective: off{}}, 0, 1, 1, 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("%d results, want 3 (block sp, nosp; step)", len(rs))
	}
	for _, r := range rs {
		want := StatusWrong
		if r.Dir == "nosp" {
			want = StatusOK // no all-gather-matmul site without SP
		}
		if r.Status != want {
			t.Errorf("%s: %s %q (rel. err %.3g), want %s", r.ID(), r.Status, r.Reason, r.RelErr, want)
		}
	}
}
