package peerep

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Pipelined is "pipelined" on symmetric memory for every site kind: the TP
// sites are overlap/peercopy's, the expert path is Path.
type Pipelined struct {
	peercopy.Pipelined
	// Options apply to every expert path it builds.
	Options []Option
}

var _ ep.ExpertStrategy = Pipelined{}

// Supports the TP sites as peercopy.Pipelined does; the expert path needs
// the CUDA backend, a group with symmetric memory and a
// bound on the tokens per rank (ep.Parallel.MaxTokens; the spec's Rows).
func (p Pipelined) Supports(sp overlap.Spec) error {
	if sp.Kind != overlap.KindExpert {
		return p.Pipelined.Supports(sp)
	}
	_, _, err := env(sp.Backend, sp.Group, sp.Name, sp.Rows)
	return err
}

func env(b any, g comm.Comm, name string, maxTokens int) (*cudabackend.Backend, comm.SymmetricMemory, error) {
	what := fmt.Sprintf("pipelined expert path %q", name)
	cb, ok := b.(*cudabackend.Backend)
	if !ok {
		return nil, nil, fmt.Errorf("%s: backend %T: expected the CUDA backend (%w)", what, b, overlap.ErrUnavailable)
	}
	if g == nil {
		return nil, nil, fmt.Errorf("%s: nil group", what)
	}
	sm, ok := comm.SymmetricOf(g)
	if !ok {
		return nil, nil, fmt.Errorf("%s: group %s has no symmetric memory (comm.SymmetricMemory: the NVSHMEM transport has it) (%w)", what, g.Name(), overlap.ErrUnavailable)
	}
	if maxTokens <= 0 {
		return nil, nil, fmt.Errorf("%s: its symmetric buffers are sized by a maximum of tokens per rank, and the layer has none (ep.Parallel.MaxTokens) (%w)", what, overlap.ErrUnavailable)
	}
	return cb, sm, nil
}

// NewExpertPath builds the layer's Path.
func (p Pipelined) NewExpertPath(c ep.ExpertConfig) (ep.ExpertPath, error) {
	return New(c, p.Options...)
}
