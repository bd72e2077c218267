package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// CrossEntropy is softmax cross-entropy over the last dim of logits (N, V)
// against targets (N) int32: losses[n] = logsumexp(logits[n]) −
// logits[n, target]. A negative target ignores its row (loss 0, gradient 0);
// a target ≥ V is an error. If dlogits is not nil it receives
// (softmax − onehot(target))·gradScale, the gradient of gradScale·Σ losses;
// dlogits may be logits itself (the gradient overwrites the logits).
//
// logits may have more leading dimensions; targets and losses then have as
// many elements as logits has rows. losses is Float32 or logits' dtype.
func (bk *Backend) CrossEntropy(losses, dlogits, logits, targets *tensor.Tensor, gradScale float32) {
	c := bk.check("CrossEntropy")
	_, v := opcheck.CrossEntropy(c, losses, dlogits, logits, targets)
	if !c.Failed() {
		for i, t := range targets.I32() {
			if int(t) >= v {
				c.Failf("targets[%d] = %d, expected < V = %d (the last dim of logits %v) or negative (ignored)", i, t, v, logits.Shape())
				break
			}
		}
	}
	if !c.OK() {
		return
	}
	switch {
	case logits.DType() == tensor.Float32:
		crossEntropy(bk, losses.F32(), optional(dlogits, (*tensor.Tensor).F32), logits.F32(), targets.I32(), v, gradScale)
	case losses.DType() == tensor.Float64:
		crossEntropy(bk, losses.F64(), optional(dlogits, (*tensor.Tensor).F64), logits.F64(), targets.I32(), v, gradScale)
	default:
		crossEntropy(bk, losses.F32(), optional(dlogits, (*tensor.Tensor).F64), logits.F64(), targets.I32(), v, gradScale)
	}
}

// optional returns the elements of t, or nil for a nil t.
func optional[T any](t *tensor.Tensor, data func(*tensor.Tensor) []T) []T {
	if t == nil {
		return nil
	}
	return data(t)
}

// crossEntropy writes losses and, when dlogits is not nil, the scaled
// gradient; each row reads its logits before overwriting them.
func crossEntropy[T, S float](bk *Backend, losses []S, dlogits, logits []T, targets []int32, v int, gradScale float32) {
	gs := T(gradScale)
	bk.parallelFor(len(targets), 16*v, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			row := logits[n*v : (n+1)*v]
			var drow []T
			if dlogits != nil {
				drow = dlogits[n*v : (n+1)*v]
			}
			t := int(targets[n])
			if t < 0 {
				losses[n] = 0
				clear(drow)
				continue
			}
			m := T(math.Inf(-1))
			for _, x := range row {
				m = max(m, x)
			}
			var sum T
			for _, x := range row {
				sum += T(math.Exp(float64(x - m)))
			}
			lse := m + T(math.Log(float64(sum)))
			losses[n] = S(lse - row[t])
			if drow == nil {
				continue
			}
			for j, x := range row {
				drow[j] = T(math.Exp(float64(x-lse))) * gs
			}
			drow[t] -= gs
		}
	})
}
