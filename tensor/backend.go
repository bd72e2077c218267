package tensor

import (
	"errors"
	"fmt"
	"math"
)

// Backend is the set of ops the layers need, implemented once per device. The
// CPU backend (tensor/cpu) is the reference every other backend is compared
// with (tensor/backendtest).
//
// Conventions, shared by every implementation:
//   - Shapes are row-major and contiguous. "(N, C)" means N rows of C.
//   - Ops may be asynchronous (a GPU backend queues them on its stream). Errors
//     are sticky: the first failing op records an error that names the op and
//     what it expected and found; every later op is then a no-op, and Err (or
//     Sync) returns that first error. Callers check Err at the end of a step or
//     layer, the way CUDA reports errors at synchronisation points. ClearErr
//     (ErrClearer) forgets an error that left the backend usable.
//   - Gradients of parameters (dw, dbias, dtable) are accumulated (+=), so
//     micro-batches can add into the same gradient buffer; gradients of inputs
//     (dx, dq, dgate...) are overwritten. Residual sums are explicit Adds.
//   - dst may alias an input where the op is elementwise (Add, Scale, Axpy,
//     SwiGLU, GELU, Copy of the same dtype), never elsewhere.
//   - Float ops accept Float32 and Float64 on the CPU; a GPU backend uses
//     BFloat16 storage with fp32 accumulation. Index tensors are Int32.
//
// Float64 is the project's exactness oracle: a Float64 run on the CPU
// computes in float64 throughout, except for the scalars the interfaces
// take as float32, which reach it rounded to float32. An outside float64
// reference reproduces such a run by rounding the same values the same way
// (v → float64(float32(v))):
//   - MatMul's and the grouped GEMMs' (GroupedMatMul, GroupedMatMulTN)
//     alpha and beta: the MoE router's auxiliary-loss gradient,
//     float32(scale·aux_loss_coef·E/K), and its z-loss gradient,
//     float32(2·scale·z_loss_coef) (layers/moe_router.go); the others pass
//     0 and 1.
//   - Scale's s: the clipping factor of grads.Reducer.ClipGrads,
//     float32(ClipFactor(Σ g², max_norm)); Axpy's alpha (its callers pass
//     1).
//   - RMSNorm's and AddRMSNorm's eps: the model's norm_eps, a float32
//     already in layers.GPTConfig.
//   - Attention's and AttentionBackward's scale: float32(1/sqrt(head_dim)),
//     exact only where head_dim is a power of 4.
//   - CrossEntropy's gradScale: float32(1/targets), the mean over the
//     batch's targets, exact only where their count is a power of two.
//   - AdamW's hyper-parameters: LR (the schedule's value at each step),
//     Beta1, Beta2 (their bias corrections 1−β^t are computed from the
//     rounded values), Eps, WeightDecay; Clip, the clipping threshold; and
//     the clipping factor: ClipFactor(Σ g², clip) computed in float64 (from
//     the rounded Clip where the op reads NormSq) and rounded to float32
//     as GradScale, by the host or by the op.
//
// RoPE's theta and Fill's value are float64 and reach it unrounded; the
// moments and the master weights of a Float64 AdamW are Float64 too.
type Backend interface {
	// Name says which backend this is ("cpu", "cuda").
	Name() string
	// Device is where this backend's tensors live.
	Device() Device
	// Err returns the first error recorded by an op, or nil.
	Err() error
	// Sync waits for all queued work and returns Err().
	Sync() error

	// Zeros allocates a zeroed tensor on the backend's device.
	Zeros(dt DType, shape ...int) *Tensor
	// Free gives a tensor's storage back (a no-op where the GC owns memory).
	// Only whole allocations returned by Zeros may be freed.
	Free(t *Tensor)
	// Upload copies a host tensor into a tensor of this device (same shape
	// and numel; the dtype is converted if they differ).
	Upload(dst, src *Tensor)
	// Download copies a tensor of this device into a host tensor (converting
	// the dtype if they differ). It waits for the work that writes src.
	Download(dst, src *Tensor)
	// Copy copies src into dst on this device, converting the dtype (bf16
	// conversion rounds to nearest even). Same numel required.
	Copy(dst, src *Tensor)
	// Fill sets every element of t to v.
	Fill(t *Tensor, v float64)

	// MatMul computes C = alpha·op(A)·op(B) + beta·C, where op transposes
	// when asked. 2-D: A (m, k) or (k, m) with transA, B (k, n) or (n, k)
	// with transB, C (m, n). 3-D: the same with a leading batch dimension
	// shared by all three. beta = 0 overwrites C (its old contents, even NaN,
	// are ignored).
	MatMul(c, a, b *Tensor, transA, transB bool, alpha, beta float32)

	// Add: dst = a + b, all the same shape.
	Add(dst, a, b *Tensor)
	// Scale: dst = s·a.
	Scale(dst, a *Tensor, s float32)
	// Axpy: y += alpha·x.
	Axpy(y *Tensor, alpha float32, x *Tensor)
	// AddBias: x (N, C) += bias (C) on every row.
	AddBias(x, bias *Tensor)
	// SumRows: dst (C) += Σ_n x[n, :] for x (N, C) (the bias gradient).
	SumRows(dst, x *Tensor)

	// RMSNorm: out = x / rms(x) · w over the last dim. x, out (N, C); w (C);
	// rstd (N) receives 1/rms(x) per row (fp32), kept for the backward.
	RMSNorm(out, rstd, x, w *Tensor, eps float32)
	// RMSNormBackward: dx = ∂L/∂x (overwritten), dw += ∂L/∂w.
	RMSNormBackward(dx, dw, dout, x, w, rstd *Tensor)

	// AddRMSNorm is the residual add fused with the RMSNorm after it: h =
	// x + r (rounded to the dtype), out = h / rms(h) · w, rstd (N) as
	// RMSNorm's, in one pass. h may alias x or r; out aliases none of them.
	AddRMSNorm(h, out, rstd, x, r, w *Tensor, eps float32)
	// RMSNormBackwardAdd is RMSNormBackward at the forward's h with the
	// residual gradient added: dx = ∂L/∂h through the norm + dres
	// (overwritten; dx may alias dres), dw += ∂L/∂w.
	RMSNormBackwardAdd(dx, dw, dout, h, w, rstd, dres *Tensor)

	// SwiGLU: out = silu(gate) · up, elementwise; all (N, F).
	SwiGLU(out, gate, up *Tensor)
	// SwiGLUBackward: dgate, dup overwritten.
	SwiGLUBackward(dgate, dup, dout, gate, up *Tensor)
	// SwiGLUPacked is SwiGLU on packed rows: gu (N, 2F) holds [gate | up]
	// per row (one GEMM's output for both projections), out (N, F).
	SwiGLUPacked(out, gu *Tensor)
	// SwiGLUPackedBackward: dgu (N, 2F, overwritten) = [dgate | dup] per
	// row, the layout one GEMM takes back to dx and dW.
	SwiGLUPackedBackward(dgu, dout, gu *Tensor)
	// GELU (tanh approximation): out = gelu(x).
	GELU(out, x *Tensor)
	// GELUBackward: dx overwritten.
	GELUBackward(dx, dout, x *Tensor)

	// Softmax over the last dimension: out = softmax(x).
	Softmax(out, x *Tensor)
	// SoftmaxBackward: dx = out · (dout − Σ dout·out), row by row.
	SoftmaxBackward(dx, dout, out *Tensor)

	// RoPE rotates x (B, T, H, D) by position: for t in [0, T) and i < D/2,
	// the pair (x[..., i], x[..., i + D/2]) turns by angle t·theta^(−2i/D)
	// (the "rotate half" convention). D must be even.
	RoPE(out, x *Tensor, theta float64)
	// RoPEBackward: dx = the inverse rotation of dout (overwritten).
	RoPEBackward(dx, dout *Tensor, theta float64)

	// RoPEQKV is RoPE on packed projections: qkv (B, T, (H + 2·Hkv)·D)
	// holds [q | k | v] per token (one GEMM's output for the three); q
	// (B, T, H, D) and k (B, T, Hkv, D) receive the rotated q and k, v
	// (B, T, Hkv, D) the v part as it is. Hkv divides H (Hkv = H without
	// grouped-query attention).
	RoPEQKV(q, k, v, qkv *Tensor, theta float64)
	// RoPEQKVBackward: dqkv (B, T, (H + 2·Hkv)·D, overwritten) =
	// [RoPE⁻¹(dq) | RoPE⁻¹(dk) | dv] per token, the layout one GEMM takes
	// back to dx and dW.
	RoPEQKVBackward(dqkv, dq, dk, dv *Tensor, theta float64)

	// Attention is causal multi-head attention with grouped-query heads:
	// q, out (B, T, H, D); k, v (B, T, Hkv, D) with Hkv dividing H, query
	// head h reading key/value head h / (H/Hkv) (Hkv = H: multi-head
	// attention); lse (B, H, T) fp32 receives the log-sum-exp of each row
	// of scores (scale·q·kᵀ), kept for the backward. Position t attends to
	// [0, t].
	Attention(out, lse, q, k, v *Tensor, scale float32)
	// AttentionBackward: dq, dk, dv (overwritten) from dout and the forward's
	// q, k, v, out and lse. dk and dv of a key/value head sum over the
	// query heads of its group, in a fixed order (deterministic).
	AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, scale float32)

	// Embedding: out[n, :] = table[ids[n], :]. ids (N) int32, table (V, C),
	// out (N, C). An id outside [0, V) is an error.
	Embedding(out, table, ids *Tensor)
	// EmbeddingBackward: dtable[ids[n], :] += dout[n, :].
	EmbeddingBackward(dtable, dout, ids *Tensor)

	// CrossEntropy is softmax cross-entropy over the last dim of logits
	// (N, V) against targets (N) int32. losses (N, fp32) receives
	// −log softmax(logits)[target] per row; rows whose target is negative
	// are ignored (loss 0, gradient 0). If dlogits is not nil it receives
	// (softmax − onehot(target))·gradScale: the gradient of
	// gradScale·Σ losses. Fusing the two saves a pass over the logits.
	CrossEntropy(losses, dlogits, logits, targets *Tensor, gradScale float32)

	// AdamW updates p in place from g with moments m, v (decoupled weight
	// decay, bias correction by hp.Step). When master is not nil the update
	// is computed on master (fp32) and p receives master rounded to p's
	// dtype (mixed precision). All the same numel.
	AdamW(p, g, m, v, master *Tensor, hp AdamW)
	// SumSquares returns Σ x² (accumulated in float64 on the CPU, fp32 or
	// better elsewhere), waiting for the result.
	SumSquares(x *Tensor) float64
	// SumSquaresTo is SumSquares without the wait: dst (one element, of a
	// dtype AdamW computes in: Float32, or Float64 on the CPU) += Σ x², on
	// the device. Several calls add the parts of a sharded or viewed
	// gradient; AdamW's NormSq reads the result, so a training step need not
	// read the gradient norm back before its update.
	SumSquaresTo(dst, x *Tensor)
}

// AdamW holds the hyper-parameters of one AdamW step.
type AdamW struct {
	LR          float32 // the learning rate
	Beta1       float32 // the first moment's decay
	Beta2       float32 // the second moment's decay
	Eps         float32 // added to sqrt(v̂)
	WeightDecay float32 // decoupled: p -= LR·WeightDecay·p
	Step        int     // 1-based step, for bias correction
	GradScale   float32 // g is multiplied by this first (gradient clipping); 0 means 1

	// NormSq, when not nil, is a one-element tensor of the backend (the
	// dtype of SumSquaresTo's dst) holding Σ g² of the whole gradient, read
	// by the op itself: g is then also multiplied by ClipFactor(NormSq,
	// Clip), and a non-finite NormSq skips the update (p, m, v and master
	// are left as they are). This is clipping with the norm kept on the
	// device: the host reads the norm later, only to report it, and a NaN
	// gradient still never reaches the weights.
	NormSq *Tensor
	Clip   float32 // the clipping threshold of NormSq's factor (≤ 0: none)
}

// ClipFactor is the clipping factor of a gradient whose Σ g² is normSq:
// min(1, clip/(sqrt(normSq)+1e-6)), 1 when clip ≤ 0. Every backend computes
// AdamW's NormSq factor this way (in float32 on the GPU, float64 here).
func ClipFactor(normSq, clip float64) float64 {
	if clip <= 0 {
		return 1
	}
	return min(1, clip/(math.Sqrt(normSq)+1e-6))
}

// ErrClearer is an optional capability of a backend whose sticky error can
// be cleared (the CPU and CUDA backends have it): ClearErr forgets an
// error that left the backend usable (a wrong argument, found before the
// op wrote anything; a kernel's check of its data) and returns nil, or
// returns an error saying why the backend must be replaced (a failure of
// the device's driver, which may have lost its context). Either way the
// tensors the failed op and the skipped ops after it would have written
// are not what the program meant them to be: recompute or upload them.
type ErrClearer interface {
	// ClearErr clears the recorded error, or says why it cannot.
	ClearErr() error
}

// ClearErr clears b's sticky error through its ErrClearer. A backend
// without one cannot be cleared: make a new one and upload the state.
func ClearErr(b Backend) error {
	if b.Err() == nil {
		return nil
	}
	if c, ok := b.(ErrClearer); ok {
		return c.ClearErr()
	}
	return fmt.Errorf("tensor: the %s backend cannot clear its error (no ClearErr): make a new backend and upload the state: %w", b.Name(), b.Err())
}

// AsyncReader is an optional capability of a backend whose ops run behind
// the host (a GPU): ReadAsync queues a copy of src (a few values: a loss, a
// norm) to the host after the work queued so far and returns at once; the
// HostRead's Wait returns those values, waiting for the copy only. src may
// be overwritten by later ops: the copy sees it as it was at ReadAsync. Use
// it through the function ReadAsync, which falls back to a Download.
type AsyncReader interface {
	// ReadAsync queues the read of src (see above).
	ReadAsync(src *Tensor) HostRead
}

// HostRead is a read queued by ReadAsync.
type HostRead interface {
	// Wait waits for the copy and returns src's values as float64 (an
	// error of the backend, or of the copy, instead). It may be called once.
	Wait() ([]float64, error)
}

// ReadAsync queues a read of src through b's AsyncReader; on a backend
// without one it downloads src at once (a backend whose ops run on the host
// has nothing to overlap) and the HostRead returns those values.
func ReadAsync(b Backend, src *Tensor) HostRead {
	if r, ok := b.(AsyncReader); ok {
		return r.ReadAsync(src)
	}
	return readNow(b, src)
}

// readNow is the synchronous HostRead of a backend without AsyncReader.
func readNow(b Backend, src *Tensor) HostRead {
	if src == nil {
		return doneRead{err: errors.New("tensor: ReadAsync of a nil tensor")}
	}
	h, err := Host(Float64, src.Shape()...)
	if err != nil {
		return doneRead{err: err}
	}
	b.Download(h, src)
	if err := b.Err(); err != nil {
		return doneRead{err: err}
	}
	return doneRead{vals: h.F64()}
}

// DoneRead is a HostRead whose values are already known (or its error).
func DoneRead(vals []float64, err error) HostRead { return doneRead{vals, err} }

type doneRead struct {
	vals []float64
	err  error
}

func (d doneRead) Wait() ([]float64, error) { return d.vals, d.err }

// Streams is an optional capability of a GPU backend, found by type
// assertion: the stream fork/join that the communication sites use to run
// communication on a side stream beside the math on the backend's stream.
// Stream values are the backend's own (a *cuda.Stream for the CUDA
// backend); nil names the backend's stream.
type Streams interface {
	// NewStream makes a stream on the backend's device.
	NewStream() (any, error)
	// StreamWait makes stream waiter wait for the work queued so far on
	// stream on (an event recorded on on; no host synchronisation).
	StreamWait(waiter, on any) error
	// DestroyStream releases a stream of NewStream once its work is done.
	DestroyStream(s any) error
}

// ErrInterrupted is what an Interruptible backend records when its stop
// function asks it to stop.
var ErrInterrupted = errors.New("interrupted")

// Interruptible is an optional interface of a Backend whose ops can be
// stopped from outside (the CPU backend): a training loop that is asked to
// stop in the middle of a long step need not wait for the step's end.
type Interruptible interface {
	// SetInterrupt has the backend call stop before each op and, in the
	// long ops, every so often inside it; once stop returns true the
	// backend records an error wrapping ErrInterrupted (the op in progress
	// leaves its outputs undefined, the ops after it do nothing). nil
	// turns the checks off.
	SetInterrupt(stop func() bool)
	// ClearInterrupt turns the checks off and clears the backend's error
	// when it is the interrupt's, so that the backend works again. Tensors
	// the interrupted ops were writing hold undefined values.
	ClearInterrupt()
}
