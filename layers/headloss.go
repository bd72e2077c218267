package layers

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// HeadLoss is an optional Decoder part (DecoderParts.HeadLoss) that runs the
// LM head and the loss together on a forward with targets: it writes the
// per-row losses and already the head's input gradient, so the (N, vocab)
// logits and their gradient need never be whole in memory.
type HeadLoss interface {
	// ForwardLoss writes losses (N) of x (N, Dim), the final norm's rows,
	// against host int32 targets (N), and dx (N, Dim) = gradScale·∂(Σ
	// losses)/∂x, and keeps the head weights' gradient for AddGrads.
	ForwardLoss(losses, dx, x, targets *tensor.Tensor, gradScale float32) error
	// AddGrads adds the head weights' gradient of the last ForwardLoss to
	// their parameters' gradients (the Decoder's Backward).
	AddGrads() error
}

// ChunkedHeadLoss is the plain LM head fused with the cross-entropy by
// chunks of rows: for each chunk, the logits chunk GEMM x_c·Wᵀ, the
// backend's cross-entropy turning the chunk into its own gradient in place,
// then dx_c = chunk·W and dW += chunkᵀ·x_c. Only one (ChunkRows, Vocab)
// buffer and the (Vocab, Dim) weight gradient exist (for gpt2-124m at 16k
// tokens: 134 MB and 77 MB in bf16 instead of 3.3 GB of logits and their
// gradient). The loss and the gradients are those of the head and
// layers.CrossEntropy, except that dW is rounded to the parameters' dtype
// once per chunk (and once more when added), where one GEMM over all rows
// rounds once.
//
// The weight gradient goes into a buffer of its own and reaches the
// parameter only at AddGrads, so a Forward (a validation pass) leaves the
// parameters' gradients alone, as it always did; the price is that such a
// forward computes the head's backward GEMMs too.
type ChunkedHeadLoss struct {
	Head *Linear       // the LM head
	CE   *CrossEntropy // the loss of its logits
	// ChunkRows is the rows per chunk; 0 picks about 64M logits per chunk.
	ChunkRows int

	b       tensor.Backend
	chunk   *tensor.Tensor // (rows, Vocab): the logits of a chunk, then their gradient
	dw      *tensor.Tensor // (Vocab, Dim): the head weight's gradient of the last ForwardLoss
	targets *tensor.Tensor // (N) int32 on the device
	ready   bool
}

// NewChunkedHeadLoss returns the fused head and loss over head and ce.
func NewChunkedHeadLoss(b tensor.Backend, head *Linear, ce *CrossEntropy) (*ChunkedHeadLoss, error) {
	if b == nil || head == nil || ce == nil || head.Bias != nil || head.Out != ce.Vocab {
		return nil, fmt.Errorf("layers: chunked head loss: expected a backend, a head without bias of %d outputs and its cross-entropy", ce.Vocab)
	}
	return &ChunkedHeadLoss{Head: head, CE: ce, b: b}, nil
}

const chunkedWhat = "layers: chunked head and cross-entropy"

// rows is the number of rows of a chunk of a batch of n rows.
func (h *ChunkedHeadLoss) rows(n int) int {
	r := h.ChunkRows
	if r <= 0 {
		r = max(1, (64<<20)/h.Head.Out)
	}
	return min(r, n)
}

// ForwardLoss is HeadLoss.ForwardLoss.
func (h *ChunkedHeadLoss) ForwardLoss(losses, dx, x, targets *tensor.Tensor, gradScale float32) error {
	h.ready = false
	b, C, V := h.b, h.Head.In, h.Head.Out
	if err := checkParams(chunkedWhat, h.Head.W); err != nil {
		return err
	}
	w := h.Head.W.W
	dt := w.DType()
	N, err := layerkit.CheckRows(b, chunkedWhat, "input x", x, dt, C)
	if err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(b, chunkedWhat, "input gradient dx", dx, dt, C, N, "like x"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(chunkedWhat, "input gradient dx", dx, "input x", x); err != nil {
		return err
	}
	if err := layerkit.CheckOn(b, chunkedWhat, "losses", losses, layerkit.StatDType(dt)); err != nil {
		return err
	}
	if losses.Numel() != N {
		return fmt.Errorf("%s: losses %v, expected %d values (one per row of x %v)", chunkedWhat, losses, N, x.Shape())
	}
	if err := h.CE.checkTargets(targets, N); err != nil {
		return err
	}
	rows := h.rows(N)
	h.chunk = layerkit.Ensure(b, h.chunk, dt, rows, V)
	h.dw = layerkit.Ensure(b, h.dw, dt, V, C)
	h.targets = layerkit.Ensure(b, h.targets, tensor.Int32, N)
	b.Upload(h.targets, layerkit.Reshape(targets, N))
	if err := layerkit.Sticky(b, chunkedWhat, "forward"); err != nil {
		return err
	}
	x2, dx2, l2 := layerkit.Reshape(x, N, C), layerkit.Reshape(dx, N, C), layerkit.Reshape(losses, N)
	for r0 := 0; r0 < N; r0 += rows {
		r := min(rows, N-r0)
		xc, e1 := x2.Rows(r0, r0+r)
		dxc, e2 := dx2.Rows(r0, r0+r)
		lc, e3 := l2.View(r0, r)
		tc, e4 := h.targets.View(r0, r)
		ch, e5 := h.chunk.View(0, r, V)
		for _, err := range []error{e1, e2, e3, e4, e5} {
			if err != nil {
				return fmt.Errorf("%s: %w", chunkedWhat, err)
			}
		}
		beta := float32(1)
		if r0 == 0 {
			beta = 0 // the first chunk overwrites dw
		}
		b.MatMul(ch, xc, w, false, true, 1, 0) // logits of the chunk
		b.CrossEntropy(lc, ch, ch, tc, gradScale)
		b.MatMul(dxc, ch, w, false, false, 1, 0)     // dx = dlogits·W
		b.MatMul(h.dw, ch, xc, true, false, 1, beta) // dW += dlogitsᵀ·x
	}
	if err := layerkit.Sticky(b, chunkedWhat, "forward"); err != nil {
		return err
	}
	h.ready = true
	return nil
}

// AddGrads is HeadLoss.AddGrads: the head weight's G += the last
// ForwardLoss's gradient.
func (h *ChunkedHeadLoss) AddGrads() error {
	if !h.ready {
		return fmt.Errorf("%s: AddGrads without a successful ForwardLoss", chunkedWhat)
	}
	h.ready = false
	h.b.Axpy(h.Head.W.G, 1, h.dw)
	return layerkit.Sticky(h.b, chunkedWhat, "backward")
}

// checkTargets checks host int32 targets of n values against the vocab.
func (ce *CrossEntropy) checkTargets(targets *tensor.Tensor, n int) error {
	if targets == nil || targets.I32() == nil || targets.Numel() != n {
		return fmt.Errorf("%s: targets %v, expected a host int32 tensor of %d values (one per row of logits)", ceWhat, targets, n)
	}
	for i, t := range targets.I32() {
		if int(t) >= ce.Vocab {
			return fmt.Errorf("%s: targets[%d] = %d, expected a value < Vocab = %d (or negative to ignore it)", ceWhat, i, t, ce.Vocab)
		}
	}
	return nil
}
