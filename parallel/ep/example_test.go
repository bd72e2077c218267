package ep_test

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Two ranks share an MoE layer of 4 experts, 2 each; each brings 6 tokens.
func Example() {
	cfg := layers.MoEConfig{Dim: 8, Hidden: 16, Experts: 4, TopK: 2, AuxLossCoef: 0.01, Std: 0.5, OutStd: 0.1}
	stats := make([]layers.MoEStats, 2)
	lines := make([]string, 2)
	err := local.Run(2, func(c comm.Comm) error {
		b, ps := cpu.New(), layers.NewParamSet(1)
		m, err := ep.New(b, ps, ep.Parallel{Group: c}, "moe", cfg)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		x := b.Zeros(tensor.Float32, 6, cfg.Dim) // this rank's tokens
		host := tensor.MustHost(tensor.Float32, 6, cfg.Dim)
		for i := range host.F32() {
			host.F32()[i] = float32((i*7+c.Rank()*3)%11) - 5
		}
		b.Upload(x, host)
		out, dx := b.Zeros(tensor.Float32, 6, cfg.Dim), b.Zeros(tensor.Float32, 6, cfg.Dim)
		if err := m.Forward(out, x); err != nil {
			return err
		}
		if err := m.Backward(dx, out); err != nil { // d(½‖out‖²)/d out = out
			return err
		}
		stats[c.Rank()] = m.Stats()
		first, count := m.Dispatch.LocalExperts()
		lines[c.Rank()] = fmt.Sprintf("rank %d: experts [%d, %d), received %d rows", c.Rank(), first, first+count, m.Handle().RecvRows())
		return nil
	})
	fmt.Println(err)
	fmt.Println(lines[0])
	fmt.Println(lines[1])
	fmt.Println("slots per expert:", stats[0].TokensPerExpert, "same on both ranks:", fmt.Sprint(stats[0]) == fmt.Sprint(stats[1]))
	// Output:
	// <nil>
	// rank 0: experts [0, 2), received 10 rows
	// rank 1: experts [2, 4), received 14 rows
	// slots per expert: [4 6 8 6] same on both ranks: true
}
