package peerep

import "github.com/asynctp/asynctp/overlap"

// named gives an Expert of this package the strategy name a chooser asks
// for, in this package's tests: the registry (overlap/strategies) holds
// Expert under the names "pipelined" and "fused" and imports this
// package, so these tests cannot use it. Its TP sites are refused, as
// Expert.Supports refuses them.
type named struct{ Expert }

func (n named) Name() string {
	if n.Fused {
		return "fused"
	}
	return "pipelined"
}

func (n named) NewAllGatherMatmul(sp overlap.Spec) (overlap.AllGatherMatmul, error) {
	return nil, n.Supports(sp)
}

func (n named) NewMatmulReduceScatter(sp overlap.Spec) (overlap.MatmulReduceScatter, error) {
	return nil, n.Supports(sp)
}

func (n named) NewMatmulAllReduce(sp overlap.Spec) (overlap.MatmulAllReduce, error) {
	return nil, n.Supports(sp)
}

// pipelinedStrategy and fusedStrategy are the strategies "pipelined" and
// "fused" of the expert path with opts.
func pipelinedStrategy(opts ...Option) named { return named{Expert{Options: opts}} }

func fusedStrategy(opts ...Option) named { return named{Expert{Fused: true, Options: opts}} }
