package peerep

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Expert builds the expert paths of this package: Path, the pipelined
// strategy's form on symmetric memory, or with Fused its fused mode (see
// the package documentation, "The fused strategy"). It has no strategy
// name and builds no TP site: the registry's strategies.Pipelined and
// strategies.Fused hold it for the expert path (and overlap/peercopy's
// Chunked and Engine for the TP sites).
type Expert struct {
	// Fused builds the fused path.
	Fused bool
	// Options apply to every path it builds.
	Options []Option
}

// Supports says whether an expert site of sp can run (a TP site cannot:
// ErrUnavailable). The pipelined path needs the CUDA backend, a group with
// symmetric memory and a bound on the tokens per rank
// (ep.Parallel.MaxTokens; the spec's Rows); the fused path also the
// backend's grouped GEMM on (the MoE device step), bf16 tensors (where
// the spec knows them) and the grouped GEMM engine (an sm_90a GPU; not
// with WithStreamHooks).
func (e Expert) Supports(sp overlap.Spec) error {
	if sp.Kind != overlap.KindExpert {
		return fmt.Errorf("peerep: %s site %q: only the expert path is built here; the TP sites are overlap/peercopy's (%w)", sp.Kind, sp.Name, overlap.ErrUnavailable)
	}
	b, _, err := env(sp.Backend, sp.Group, sp.Name, sp.Rows)
	if err != nil || !e.Fused {
		if err != nil && e.Fused {
			err = fmt.Errorf("fused: %w", err)
		}
		return err
	}
	what := fmt.Sprintf("fused expert path %q", sp.Name)
	if groupedFor(b, sp) == nil {
		return fmt.Errorf("%s: the backend's grouped GEMM is off (cudabackend.WithGroupedGEMM(true) turns it on), and the fused path runs only as the MoE device step on it (%w)", what, overlap.ErrUnavailable)
	}
	probe := &Path{}
	for _, o := range e.Options {
		o(probe)
	}
	if probe.streamHooks {
		return nil
	}
	if sp.DType != tensor.Invalid && sp.DType != tensor.BFloat16 {
		return fmt.Errorf("%s: tensors are %v, expected bf16 (the grouped GEMM engine's operands) (%w)", what, sp.DType, overlap.ErrUnavailable)
	}
	if err := b.GroupedEngineErr(); err != nil {
		return fmt.Errorf("%s: %v (%w)", what, err, overlap.ErrUnavailable)
	}
	return nil
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

// NewExpertPath builds the layer's Path (in its fused mode with Fused).
func (e Expert) NewExpertPath(c ep.ExpertConfig) (ep.ExpertPath, error) {
	opts := e.Options
	if e.Fused {
		opts = append(append([]Option(nil), e.Options...), withFused())
	}
	return New(c, opts...)
}
