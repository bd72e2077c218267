package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// ceSmemMax is the largest row (bytes) the shared-memory cross-entropy
// kernel takes; an H200 block may have 227 KiB, and gpt2's 50304 bf16
// logits (98 KiB) still let two blocks share an SM.
const ceSmemMax = 160 << 10

// aligned16 says whether t's data starts on a 16-byte boundary.
func aligned16(t *tensor.Tensor) bool { return ptr(t)%16 == 0 }

// CrossEntropy is softmax cross-entropy over the last dim of logits (N, V)
// against targets (N) int32, fused with its gradient: losses (N, Float32)
// receives logsumexp(logits[n]) − logits[n, target]; rows whose target is
// negative are ignored (loss 0, gradient 0). If dlogits is not nil it
// receives (softmax − onehot(target))·gradScale; dlogits may be logits
// itself. A target ≥ V is found by the kernel and reported at the next Sync.
// One block per row, two passes over the row; a row that fits in shared
// memory (V·size ≤ 160 KiB: V ≤ 81920 in bf16) is read from device memory
// once.
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
		size, pack := logits.DType().Size(), packOf(logits.DType().Size())
		if bytes := v * size; bytes <= ceSmemMax && v%pack == 0 && aligned16(logits) && (dlogits == nil || aligned16(dlogits)) {
			return d.Launch("cross_entropy_smem"+sfx(logits.DType()), gpu.D1(n), rowBlock(v, pack), bytes,
				ptr(losses), ptr(dlogits), ptr(logits), ptr(targets), int32(n), int32(v), gradScale, flag)
		}
		return d.Launch("cross_entropy"+sfx(logits.DType()), gpu.D1(n), rowBlock(v, pack), 0,
			ptr(losses), ptr(dlogits), ptr(logits), ptr(targets), int32(n), int32(v), gradScale, flag)
	})
}
