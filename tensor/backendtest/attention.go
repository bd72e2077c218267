package backendtest

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestAttention checks causal attention (out and lse) and its backward
// (dq, dk, dv) on (B, T, H, D) = (2, 37, 3, 16).
func TestAttention(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 11)
	const nb, nt, nh, d = 2, 37, 3, 16
	shape := []int{nb, nt, nh, d}
	scale := float32(1 / math.Sqrt(d))
	q, k, v := h.rand(h.dt, shape...), h.rand(h.dt, shape...), h.rand(h.dt, shape...)
	// Larger scores than the random inputs give, so the softmax is peaked.
	h.b.Scale(q.dev, q.dev, 4)
	h.ref.Scale(q.ref, q.ref, 4)
	out, lse := h.out(h.dt, shape...), h.out(tensor.Float32, nb, nh, nt)
	h.b.Attention(out.dev, lse.dev, q.dev, k.dev, v.dev, scale)
	h.ref.Attention(out.ref, lse.ref, q.ref, k.ref, v.ref, scale)
	h.compare("Attention out", out)
	h.compare("Attention lse", lse)

	dout := h.rand(h.dt, shape...)
	dq, dk, dv := h.out(h.dt, shape...), h.out(h.dt, shape...), h.out(h.dt, shape...)
	h.b.AttentionBackward(dq.dev, dk.dev, dv.dev, dout.dev, q.dev, k.dev, v.dev, out.dev, lse.dev, scale)
	h.ref.AttentionBackward(dq.ref, dk.ref, dv.ref, dout.ref, q.ref, k.ref, v.ref, out.ref, lse.ref, scale)
	h.compare("AttentionBackward dq", dq)
	h.compare("AttentionBackward dk", dk)
	h.compare("AttentionBackward dv", dv)
}
