package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
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
	n, v := opcheck.CrossEntropy(c, losses, dlogits, logits, targets)
	fits(c, "N", n)
	fits(c, "V", v)
	if !c.OK() || n == 0 {
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
