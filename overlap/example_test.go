package overlap_test

import (
	"fmt"

	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// A chooser gives every site pipelined except the MLP's of block 0, which
// keep the collective; the layers ask it for their sites' strategies at
// construction (tp.Parallel.Overlap), and its summary says what each kind
// got. The strategies are the registry's (strategies.All): each says per
// site whether its group and backend can run it.
func ExampleChooser() {
	group := local.NewWorld(2)[0] // rank 0 of a TP group of two (nothing is sent here)
	cfg := overlap.Config{Default: "pipelined", Sites: map[string]string{"blocks.0.mlp.*": "collective"}}
	ch, err := overlap.NewChooser(cfg, strategies.All(strategies.Options{}), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, name := range []string{"blocks.0.attn.qkv", "blocks.0.mlp.gate_up", "blocks.1.mlp.gate_up"} {
		s, err := ch.Choose(overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: name, Group: group,
			Backend: cpu.New(), K: 8, Outs: []int{8}, DType: tensor.Float32})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%-20s %s\n", name, s.Name())
	}
	fmt.Println(ch.Summary())
	// Output:
	// blocks.0.attn.qkv    pipelined
	// blocks.0.mlp.gate_up collective
	// blocks.1.mlp.gate_up pipelined
	// [all-gather-matmul: collective (1 site, the group's collectives) as sites["blocks.0.mlp.*"] asks, pipelined (2 sites, exchanges on the group's collectives) as the default asks]
}
