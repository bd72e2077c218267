package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// CrossEntropy is softmax cross-entropy over the last dim of logits (N, V)
// against targets (N) int32, fused with its gradient: losses (N, Float32)
// receives logsumexp(logits[n]) − logits[n, target]; rows whose target is
// negative are ignored (loss 0, gradient 0). If dlogits is not nil it
// receives (softmax − onehot(target))·gradScale; dlogits may be logits
// itself. A target ≥ V is found by the kernel and reported at the next Sync.
// One block per row, two passes over the row.
func (b *Backend) CrossEntropy(losses, dlogits, logits, targets *tensor.Tensor, gradScale float32) {
	c := b.check("CrossEntropy")
	c.float("logits", logits)
	c.rank("logits", logits, 1, 8)
	c.dtype("targets", targets, tensor.Int32)
	if c.failed() {
		c.ok()
		return
	}
	c.dtype("losses", losses, tensor.Float32)
	if dlogits != nil {
		c.like("dlogits", dlogits, "logits", logits)
	}
	n, v := rows(logits)
	rowsOf := "one per row of logits " + logits.Shape().String()
	if !c.failed() && targets.Numel() != n {
		c.failf("targets has shape %v, expected %v (%s)", targets.Shape(), outer(logits.Shape()), rowsOf)
	}
	if !c.failed() && losses.Numel() != n {
		c.failf("losses has shape %v, expected %v (%s)", losses.Shape(), outer(logits.Shape()), rowsOf)
	}
	c.fits("N", n)
	c.fits("V", v)
	if !c.ok() || n == 0 {
		return
	}
	shape := logits.Shape().String()
	b.do("CrossEntropy", func(d gpu.Device) error {
		flag := b.flagPtr(flagCrossEntropy, func(t int32) error {
			return fmt.Errorf("cuda: CrossEntropy: targets contain %d, expected < V = %d (the last dim of logits %s) or negative (ignored)", t, v, shape)
		})
		return d.Launch("cross_entropy"+sfx(logits.DType()), gpu.D1(n), rowBlock(v, packOf(logits.DType().Size())), 0,
			ptr(losses), ptr(dlogits), ptr(logits), ptr(targets), int32(n), int32(v), gradScale, flag)
	})
}
