package overlap

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Kind is the kind of a communication site: the collective and the math it
// meets. It is also the key of a site kind in the overlap configuration.
type Kind string

const (
	// KindAllGatherMatmul is the sequence-parallel entry of a TP region:
	// out_i = all-gather(x)·W_iᵀ for one or more weights sharing one
	// gather (q, k, v; gate, up). Backward: dx = reduce-scatter(Σ_i
	// dout_i·W_i), dW_i += dout_iᵀ·all-gather(x).
	KindAllGatherMatmul Kind = "all-gather-matmul"
	// KindMatmulReduceScatter is the sequence-parallel exit of a TP
	// region: out = reduce-scatter(x·Wᵀ). Backward: dx = all-gather(dout)·W,
	// dW += all-gather(dout)ᵀ·x.
	KindMatmulReduceScatter Kind = "matmul-reduce-scatter"
	// KindMatmulAllReduce is TP without sequence parallelism: out =
	// all-reduce(Σ_i a_i·op(W_i)), the exit of a row-parallel linear
	// (forward) and the entry of column-parallel ones (backward).
	KindMatmulAllReduce Kind = "matmul-all-reduce"
	// KindExpert is the MoE expert path: route → dispatch → expert GEMMs →
	// combine (parallel/ep).
	KindExpert Kind = "expert"
)

// Kinds lists every site kind, in the order reports print them.
var Kinds = []Kind{KindAllGatherMatmul, KindMatmulReduceScatter, KindMatmulAllReduce, KindExpert}

// Spec describes a site: what a layer asks its strategy for at
// construction. The site keeps what lives as long as the layer (buffers,
// side streams, signal words) sized from it.
type Spec struct {
	Kind Kind // which site: all-gather-matmul, matmul-reduce-scatter, matmul-all-reduce, expert
	// Name is the layer's name ("blocks.0.attn.qkv"): errors name it, and
	// the overlap configuration can choose a strategy for it.
	Name    string
	Group   comm.Comm      // the TP (or EP) group the site spans
	Backend tensor.Backend // the backend of the layer's tensors
	// Stream is the backend's stream (nil on the CPU): results are
	// ordered on it.
	Stream comm.Stream
	// Rows is the most rows of this rank's input the site will see (the
	// size of its persistent buffers); 0 sizes them on first use.
	Rows  int
	K     int          // the inner width (the input's features)
	Outs  []int        // the output widths, one per weight
	DType tensor.DType // the dtype of the activations and weights
	// Experts is an expert site's experts over the whole group
	// (KindExpert; 0: not given); the TP sites leave it 0.
	Experts int
}

func (s Spec) what() string {
	g := "<nil group>"
	if s.Group != nil {
		g = s.Group.Name()
	}
	return fmt.Sprintf("overlap: %s site %q on %s", s.Kind, s.Name, g)
}

func (s Spec) check(kind Kind) error {
	switch {
	case s.Kind != kind:
		return fmt.Errorf("%s: expected a %s spec", s.what(), kind)
	case s.Group == nil || s.Backend == nil:
		return fmt.Errorf("%s: expected a group and a backend", s.what())
	case s.Rows < 0 || s.K < 0:
		return fmt.Errorf("%s: rows %d, K %d: expected sizes ≥ 0", s.what(), s.Rows, s.K)
	}
	for _, m := range s.Outs {
		if m < 0 {
			return fmt.Errorf("%s: output widths %v: expected sizes ≥ 0", s.what(), s.Outs)
		}
	}
	return nil
}

// ErrUnavailable is wrapped by the error of a strategy that cannot build a
// site (a transport it needs is absent, the site kind has no such
// strategy yet).
var ErrUnavailable = errors.New("strategy unavailable")

// AllGatherMatmul is the sequence-parallel entry site (KindAllGatherMatmul).
//
// Shapes, with P ranks in the group, n = this rank's rows and N = P·n:
// x (n, K); xFull (N, K), the gathered input, kept by the caller for the
// backward; ws[i] (M_i, K); outs[i] (N, M_i).
type AllGatherMatmul interface {
	// Forward: xFull = all-gather(x) in rank order, outs[i] = xFull·ws[i]ᵀ.
	// Results are ordered on the spec's stream.
	Forward(outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) error
	// Backward: dx (n, K) = reduce-scatter(Σ_i douts[i]·ws[i]),
	// dws[i] (M_i, K) += douts[i]ᵀ·xFull. The Work orders dx: until it is
	// waited, the site owns its group (issue no other op on it).
	Backward(dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (comm.Work, error)
	// Close releases what the site holds (buffers, streams, signals).
	Close() error
}

// MatmulReduceScatter is the sequence-parallel exit site
// (KindMatmulReduceScatter). Shapes: x (N, K), w (M, K), out (n, M).
type MatmulReduceScatter interface {
	// Forward: out = reduce-scatter(x·wᵀ) (sum over ranks).
	Forward(out, x, w *tensor.Tensor) error
	// Backward, with doutFull (N, M) = all-gather(dout (n, M)): dx (N, K) =
	// doutFull·w, dw (M, K) += doutFullᵀ·x. The Work orders dx and dw.
	Backward(dx, dw, dout, x, w *tensor.Tensor) (comm.Work, error)
	// Close releases what the site holds (buffers, streams, signals).
	Close() error
}

// MatmulAllReduce is the site of TP without sequence parallelism
// (KindMatmulAllReduce).
type MatmulAllReduce interface {
	// Run: out (R, C) = all-reduce(Σ_i as[i]·op(ws[i])) (sum over ranks),
	// op(w) = wᵀ when transW. as[i] (R, K_i); ws[i] (C, K_i) when transW,
	// else (K_i, C). The Work orders out: until it is waited the site owns
	// its group, and the caller may queue other math (the weight
	// gradients) meanwhile.
	Run(out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (comm.Work, error)
	// Close releases what the site holds.
	Close() error
}

// Builder builds the sites of one implementation of a strategy: what a
// strategy does, without the name a configuration knows it by. The
// implementations (Exchange here; overlap/peercopy's and
// parallel/ep/peerep's on symmetric memory) are Builders; the strategies
// that carry a name are Collective and the types of overlap/strategies,
// which pick an implementation per site, so that a name is one type.
type Builder interface {
	// Supports says whether a site of spec's kind and group can be built,
	// and if not why (wrapping ErrUnavailable).
	Supports(spec Spec) error
	// NewAllGatherMatmul builds the site of spec (KindAllGatherMatmul).
	NewAllGatherMatmul(spec Spec) (AllGatherMatmul, error)
	// NewMatmulReduceScatter builds the site of spec (KindMatmulReduceScatter).
	NewMatmulReduceScatter(spec Spec) (MatmulReduceScatter, error)
	// NewMatmulAllReduce builds the site of spec (KindMatmulAllReduce).
	NewMatmulAllReduce(spec Spec) (MatmulAllReduce, error)
}

// Strategy is a Builder under the name flags and configurations give it:
// Collective, and overlap/strategies' Pipelined and Fused (one type per
// name; strategies.All and strategies.Available list them). Collective is
// the reference; every other strategy gives the same numbers within the
// dtype's tolerance (the conformance suite in overlap/overlaptest).
type Strategy interface {
	// Name is the strategy's name in flags and configuration:
	// "collective", "pipelined", "fused".
	Name() string
	Builder
}
