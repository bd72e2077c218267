package ep

import (
	"errors"
	"fmt"
	"io"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// ExpertPath is the communication site of an MoE layer (overlap's
// KindExpert): DeepEP's contract of layout → dispatch → handle → combine,
// and the backwards with the same handle. The MoE layer calls only these;
// *Dispatcher is the collective implementation (all-to-all-v of the
// permuted rows through the transport); the pipelined and fused forms over
// NVSHMEM implement the same interface. A Handle's exported fields are the
// contract (counts, plan); its unexported ones are *Dispatcher's.
//
// One step is in flight at a time: a Dispatch invalidates the buffers of
// the previous handle, which the layer releases first.
type ExpertPath interface {
	// LocalExperts is the range [first, first+count) of experts this rank
	// holds.
	LocalExperts() (first, count int)
	// TokenGroup is the group whose tokens make a step (the capacity and
	// the router statistics are over it).
	TokenGroup() comm.Comm
	// Layout counts this rank's routed slots (idx (N·K) expert ids).
	Layout(idx []int32, tokens, topK int, capacityFactor float64) (*Layout, error)
	// Dispatch sends x (N, C) to the experts and returns the received rows
	// (source rank, then local expert, then token order), the handle, and
	// the Work to wait on before reading the rows.
	Dispatch(x *tensor.Tensor, l *Layout) (*tensor.Tensor, *Handle, comm.Work, error)
	// SortByExpert moves the received rows into expert order.
	SortByExpert(dst, recv *tensor.Tensor, h *Handle)
	// UnsortByExpert moves rows in expert order back to the received order.
	UnsortByExpert(dst, src *tensor.Tensor, h *Handle)
	// Combine returns expert outputs y to their tokens and writes out =
	// Σ_j weights·y per token.
	Combine(out, y, weights *tensor.Tensor, h *Handle) error
	// CombineBackward returns ∂L/∂y at the experts' ranks and the Work to
	// wait on before reading it; dweights is overwritten (nil skips it).
	CombineBackward(dweights, dout, weights *tensor.Tensor, h *Handle) (*tensor.Tensor, comm.Work, error)
	// DispatchBackward returns the received rows' gradients to their
	// tokens: dx = Σ of each token's slot gradients.
	DispatchBackward(dx, drecv *tensor.Tensor, h *Handle) error
	// Release gives back what the handle holds for its step.
	Release(h *Handle)
}

var _ ExpertPath = (*Dispatcher)(nil)

// ExpertStrategy is an overlap.Strategy that builds the expert path
// itself (the pipelined strategy over symmetric memory,
// parallel/ep/peerep): the chooser picks it for the site, and the layer
// calls NewExpertPath instead of building the collective *Dispatcher.
type ExpertStrategy interface {
	overlap.Strategy
	// NewExpertPath builds one layer's expert path.
	NewExpertPath(ExpertConfig) (ExpertPath, error)
}

// ExpertConfig is what an ExpertStrategy gets to build one layer's path.
type ExpertConfig struct {
	Name    string         // the layer
	Backend tensor.Backend // the layer's backend
	Stream  comm.Stream    // the backend's stream (nil on the CPU)
	Group   comm.Comm      // the EP group
	Tokens  comm.Comm      // the token group (Parallel.TokenGroup); nil: the EP group
	Experts int            // the experts over the whole group
	Cols    int            // the width of a token's row (the model's Dim)
	// MaxTokens is Parallel.MaxTokens (0: none given).
	MaxTokens int
}

// newExpertPath builds the expert path of a layer: the strategy the chooser
// picks for the site — collective (*Dispatcher), or a strategy that builds
// its own path (ExpertStrategy), wrapped when the chooser's shadow samples
// it (shadow.go); any other refuses.
func newExpertPath(b tensor.Backend, name string, experts, dim int, par Parallel) (ExpertPath, error) {
	group := par.Group
	ch := par.Overlap
	if ch == nil {
		ch = overlap.Single(overlap.Collective{})
	}
	sp := overlap.Spec{Kind: overlap.KindExpert, Name: name, Group: group, Backend: b, Stream: par.Stream,
		Rows: par.MaxTokens, K: dim, Outs: []int{dim}, Experts: experts}
	s, err := ch.Choose(sp)
	if err != nil {
		return nil, err
	}
	es, ok := s.(ExpertStrategy)
	if !ok {
		if s.Name() != (overlap.Collective{}).Name() {
			return nil, fmt.Errorf("ep: moe %q: strategy %s has no expert path (%w)", name, s.Name(), overlap.ErrUnavailable)
		}
		ch.ShadowOf(sp, s) // nil: the reference itself (the shadow's patterns learn of the site)
		return newDispatcher(b, experts, par)
	}
	path, err := es.NewExpertPath(ExpertConfig{Name: name, Backend: b, Stream: par.Stream, Group: group, Tokens: par.TokenGroup,
		Experts: experts, Cols: dim, MaxTokens: par.MaxTokens})
	if err != nil {
		return nil, err
	}
	if ss := ch.ShadowOf(sp, s); ss != nil {
		ref, err := newDispatcher(b, experts, par)
		if err != nil {
			if c, ok := path.(io.Closer); ok {
				err = errors.Join(err, c.Close())
			}
			return nil, err
		}
		return shadowExpertPath(path, ref, ss, b, par.Stream), nil
	}
	return path, nil
}

// newDispatcher builds the collective expert path of a layer.
func newDispatcher(b tensor.Backend, experts int, par Parallel) (*Dispatcher, error) {
	d, err := NewDispatcher(b, par.Group, experts, par.Stream)
	if err != nil {
		return nil, err
	}
	if err := d.SetTokenGroup(par.TokenGroup); err != nil {
		return nil, err
	}
	if par.MaxTokens > 0 {
		d.SetMaxTokens(par.MaxTokens)
	}
	return d, nil
}

// rowBuffer is a persistent (rows, C) buffer of the dispatcher that grows
// to the largest step (or is sized once by SetMaxTokens).
type rowBuffer struct{ t *tensor.Tensor }

func (r *rowBuffer) get(b tensor.Backend, dt tensor.DType, rows, cols int) *tensor.Tensor {
	if r.t == nil || r.t.DType() != dt || r.t.Dim(1) != cols || r.t.Dim(0) < rows {
		if r.t != nil {
			b.Free(r.t)
		}
		r.t = b.Zeros(dt, max(rows, 1), cols)
	}
	v, err := r.t.Rows(0, rows)
	if err != nil { // cannot happen: rows ≤ the buffer's
		panic("ep: internal error: " + err.Error())
	}
	return v
}

// free gives the buffer back to b (nothing when it holds none).
func (r *rowBuffer) free(b tensor.Backend) {
	if r.t != nil {
		b.Free(r.t)
		r.t = nil
	}
}
