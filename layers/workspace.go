package layers

import (
	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/tensor"
)

// workspace holds the buffers that the layers of one model share because
// each lives only inside one layer's forward or one layer's backward: a
// block's attention and MLP outputs (dead once added into the residual
// stream), the packed q, k, v projections (dead once RoPE has copied them
// out), and every backward buffer (∂L/∂ of a layer's intermediates, dead
// once the layer's input gradient is written). Kept per layer, as they
// were, they grew with the depth: for gpt2-124m at 16k tokens 12 copies of
// ~0.5 GiB (docs/measurements/2026-12-02.md, "Memory"). All users run one after another on the
// backend's stream, so a layer's ops on a slot are queued after the
// previous layer's last use of it.
//
// A slot is the buffer of one role (the attention's ∂L/∂qr, the block's
// ∂L/∂h, ...) in every layer that plays it, so its stale contents are
// always those of the same role, as with the per-layer buffers before:
// nothing reads one before writing it, and the results are bit for bit
// those of separate buffers (TestWorkspaceBitIdentical). The ParamSet
// holds the workspace (a model's lifetime); layers built by this package's
// constructors (NewBlock, NewAttention, NewMLP) use it, the parallel
// layers (which may touch their buffers from side streams) keep their own.
//
// Under activation recompute (Recompute) the activations a layer's
// forward keeps for its backward become shared slots too, those the mode
// drops (keep): the backward recomputes them first (a block's forward
// again, or the attention core's), so they are again the layer's own
// values when it reads them.
type workspace struct {
	b     tensor.Backend
	slots [wsSlots]*tensor.Tensor
	mode  Recompute // what the forwards keep (Decoder.SetRecompute)
}

// The roles.
const (
	wsBlockOut = iota // the block's mixer output a, then its FFN output m (forward)
	wsBlockDH         // the block's ∂L/∂h2, then ∂L/∂h1
	wsBlockDX1        // the block's ∂L/∂x1
	wsAttnQKV         // the packed projections [q | k | v] (forward, until RoPEQKV)
	wsAttnDAtt
	wsAttnDQR
	wsAttnDKR
	wsAttnDV
	wsAttnDQKV
	wsAttnDQ
	wsAttnDK
	wsMLPDH
	wsMLPDGU
	wsMLPDGate
	wsMLPDUp
	// The activations the forward keeps for the backward, shared under
	// recompute: the block's (RecomputeBlock) ...
	wsKeepH1
	wsKeepX1
	wsKeepH2
	wsKeepQ // the attention core's unpacked projections
	wsKeepK
	wsKeepV
	wsKeepQR
	wsKeepKR
	wsKeepGate // the MLP core's
	wsKeepUp
	wsKeepGU
	wsKeepH
	// ... and the attention core's output (RecomputeAttention too).
	wsKeepAtt
	wsKeepLSE
	wsSlots
)

// noWorkspace turns the sharing off (each layer keeps its own buffers, as
// before), for the test that compares the two.
var noWorkspace = false

// workspace returns the set's workspace on b, made on first use.
func (s *ParamSet) workspace(b tensor.Backend) *workspace {
	if s == nil || noWorkspace {
		return nil
	}
	if s.ws == nil || s.ws.b != b {
		s.ws = &workspace{b: b}
	}
	return s.ws
}

// keep returns the buffer of a kept activation of the given role: the
// shared slot when the recompute mode drops it (mode ≥ from), else own,
// ensured (own is the layer's own buffer, never a slot: after a switch of
// mode a fresh one is made).
func (w *workspace) keep(slot int, from Recompute, b tensor.Backend, own *tensor.Tensor, dt tensor.DType, shape ...int) *tensor.Tensor {
	if w != nil && w.mode >= from {
		w.slots[slot] = layerkit.Ensure(w.b, w.slots[slot], dt, shape...)
		return w.slots[slot]
	}
	if w != nil && own != nil && own == w.slots[slot] {
		own = nil
	}
	return layerkit.Ensure(b, own, dt, shape...)
}

// dropped reports whether the recompute mode drops the activations kept
// from mode from on.
func (w *workspace) dropped(from Recompute) bool { return w != nil && w.mode >= from }

// ensure is Ensure of the slot's buffer, or of *own without a workspace.
func (w *workspace) ensure(slot int, b tensor.Backend, own *tensor.Tensor, dt tensor.DType, shape ...int) *tensor.Tensor {
	if w == nil {
		return layerkit.Ensure(b, own, dt, shape...)
	}
	w.slots[slot] = layerkit.Ensure(w.b, w.slots[slot], dt, shape...)
	return w.slots[slot]
}
