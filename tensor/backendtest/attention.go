package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestAttention checks causal attention (out and lse) and its backward
// (dq, dk, dv) on (B, T, H, D) = (2, 37, 4, 16), multi-head (4 key/value
// heads) and grouped-query (2 and 1: groups of 2 and 4 query heads).
func TestAttention(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 11)
	const nb, nt, nh, d = 2, 37, 4, 16
	for _, hkv := range []int{4, 2, 1} {
		shape, kvShape := []int{nb, nt, nh, d}, []int{nb, nt, hkv, d}
		scale := float32(1 / math.Sqrt(d))
		q, k, v := h.rand(h.dt, shape...), h.rand(h.dt, kvShape...), h.rand(h.dt, kvShape...)
		// Larger scores than the random inputs give, so the softmax is peaked.
		h.b.Scale(q.dev, q.dev, 4)
		h.ref.Scale(q.ref, q.ref, 4)
		out, lse := h.out(h.dt, shape...), h.out(tensor.Float32, nb, nh, nt)
		h.b.Attention(out.dev, lse.dev, q.dev, k.dev, v.dev, scale)
		h.ref.Attention(out.ref, lse.ref, q.ref, k.ref, v.ref, scale)
		what := fmt.Sprintf("Attention (%d kv heads)", hkv)
		h.compare(what+" out", out)
		h.compare(what+" lse", lse)

		dout := h.rand(h.dt, shape...)
		dq, dk, dv := h.out(h.dt, shape...), h.out(h.dt, kvShape...), h.out(h.dt, kvShape...)
		h.b.AttentionBackward(dq.dev, dk.dev, dv.dev, dout.dev, q.dev, k.dev, v.dev, out.dev, lse.dev, scale)
		h.ref.AttentionBackward(dq.ref, dk.ref, dv.ref, dout.ref, q.ref, k.ref, v.ref, out.ref, lse.ref, scale)
		h.compare(what+"Backward dq", dq)
		h.compare(what+"Backward dk", dk)
		h.compare(what+"Backward dv", dv)
	}
}
