package ep

import (
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// DeviceOffsets is an optional capability of an ExpertPath (found by type
// assertion; parallel/ep/peerep's Path has it): a step whose layout,
// counts, capacity and expert-major row offsets stay on the device, so the
// MoE layer runs its whole step — route, dispatch, the grouped expert
// GEMMs, SwiGLU, combine and the backward — without reading anything back
// to the host. The layer takes it when the backend has the grouped GEMM
// (tensor.UseGroupedFor); otherwise, and on the collective *Dispatcher, it
// runs the host-count ExpertPath methods.
//
// Rows are in expert-major order (local expert, then source rank, then
// the source's token order), in buffers of Bound rows: the handle's
// Offsets (local experts + 1, int32, on the device) say which rows are the
// step's, expert e's being [Offsets[e], Offsets[e+1]); rows in
// [Offsets[L], Bound) are not the step's. Every consumer ignores them: the
// grouped GEMMs touch only rows inside the offsets, the path sends only the
// step's rows, and the elementwise ops between the GEMMs are row-local, so
// whatever such a row holds never reaches an output or a gradient (the
// path's and the layer's buffers are zeroed when allocated and only ever
// written with finite values, so the rows are finite too).
//
// The handle of a device step carries no host counts (Plan, the counts,
// GlobalRouted are nil; Layout has Tokens, TopK, Experts and
// CapacityFactor, no Idx); Release ends it as for ExpertPath.
type DeviceOffsets interface {
	ExpertPath
	// DispatchDevice sends x (N, C) to the experts idx (N, K) int32 on the
	// device and returns the received rows xe (Bound, C) in expert-major
	// order and the handle (Offsets, Bound set). xe is the path's buffer,
	// valid until the next dispatch.
	DispatchDevice(x, idx *tensor.Tensor, capacityFactor float64) (xe *tensor.Tensor, h *Handle, err error)
	// CombineDevice returns the expert outputs ye (Bound, C), expert-major,
	// to their tokens: out (N, C) = Σ_j weights·y.
	CombineDevice(out, ye, weights *tensor.Tensor, h *Handle) error
	// CombineBackwardDevice writes dweights (N, K) and returns ∂L/∂ye
	// (Bound, C), expert-major (the path's buffer, valid until the next
	// dispatch).
	CombineBackwardDevice(dweights, dout, weights *tensor.Tensor, h *Handle) (*tensor.Tensor, error)
	// DispatchBackwardDevice returns the expert rows' gradients dxe (Bound,
	// C), expert-major, to their tokens: dx (N, C) = Σ of each token's
	// slot gradients.
	DispatchBackwardDevice(dx, dxe *tensor.Tensor, h *Handle) error
}

// FusedOffsets is an optional capability of a DeviceOffsets path (the
// fused strategy, parallel/ep/peerep's Expert with Fused): a device step whose
// dispatch and combine run inside the experts' grouped GEMMs. DispatchFused
// returns while the rows are still landing, with the GEMM hooks of the
// step: hooks.First's GEMM waits for each 128-row block of xe before it
// reads it (nothing else may read xe before CombineDevice), and
// hooks.Down's GEMM sends each block of its output to the tokens' homes as
// it is stored, so that CombineDevice of that output only waits and sums.
// The layer then calls CombineDevice and the backward as for DeviceOffsets.
//
// The backward is the same pair: CombineBackwardFused returns ∂L/∂ye while
// its rows still land, with hooks whose DH GEMM waits for each block and
// whose DX GEMM sends each block of dxe home as it is stored, after which
// DispatchBackwardDevice of that dxe only waits and sums.
//
// Fused says whether the path fuses its steps (false: DispatchFused and
// CombineBackwardFused are the DeviceOffsets calls with no hooks). A fused
// path runs only as the device step: a layer that cannot take it refuses.
type FusedOffsets interface {
	DeviceOffsets
	// Fused says whether the path fuses its steps (see above).
	Fused() bool
	// DispatchFused is DispatchOffsets with the hooks of the grouped GEMM
	// that consumes the rows as they land (nil hooks: not fused).
	DispatchFused(x, idx *tensor.Tensor, capacityFactor float64) (xe *tensor.Tensor, h *Handle, hooks *layers.GroupedHooks, err error)
	// CombineBackwardFused is CombineBackwardOffsets with the hooks of the
	// grouped GEMM that produces the rows' gradients (nil hooks: not fused).
	CombineBackwardFused(dweights, dout, weights *tensor.Tensor, h *Handle) (dye *tensor.Tensor, hooks *layers.GroupedBackwardHooks, err error)
}
