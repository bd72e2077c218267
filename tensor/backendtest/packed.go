package backendtest

import (
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// TestPacked checks the ops on packed projections (one GEMM's output for
// several weights) against the reference running the unfused ops on the
// parts: RoPEQKV against RoPE on q and k (and v copied), RoPEQKVBackward
// against RoPEBackward, SwiGLUPacked and its backward against SwiGLU on
// separate gate and up. Outputs start as NaN, so an element not written
// fails; shapes include a head dim and widths that are not multiples of 8,
// and grouped-query projections (fewer k and v heads than q heads).
func TestPacked(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 17)
	// D = 64 and 48 take the vectorised kernels of a backend that has them
	// (in bf16 and f32), D = 40 only in f32 (D/2 = 20 is no multiple of 8),
	// D = 6 never; 33 and 21 tokens are multiples of nothing useful.
	// (B, T, H, Hkv, D):
	for _, s := range [][5]int{{2, 5, 3, 3, 6}, {1, 33, 2, 2, 64}, {3, 7, 5, 5, 48}, {1, 7, 3, 3, 40},
		{2, 5, 4, 2, 6}, {1, 33, 8, 2, 64}, {1, 7, 4, 1, 40}} {
		B, T, H, Hkv, D := s[0], s[1], s[2], s[3], s[4]
		qd, kd := H*D, Hkv*D
		theta := 10000.0
		qkv := h.rand(h.dt, B, T, qd+2*kd)
		q, k, v := h.out(h.dt, B, T, H, D), h.out(h.dt, B, T, Hkv, D), h.out(h.dt, B, T, Hkv, D)
		h.b.RoPEQKV(q.dev, k.dev, v.dev, qkv.dev, theta)
		parts := unpackParts(qkv.ref, B*T, []int{qd, kd, kd}, [][]int{{B, T, H, D}, {B, T, Hkv, D}, {B, T, Hkv, D}})
		h.ref.RoPE(q.ref, parts[0], theta)
		h.ref.RoPE(k.ref, parts[1], theta)
		copy(v.ref.F64(), parts[2].F64())
		h.compare("RoPEQKV q", q)
		h.compare("RoPEQKV k", k)
		h.compare("RoPEQKV v", v)

		dq, dk, dv := h.rand(h.dt, B, T, H, D), h.rand(h.dt, B, T, Hkv, D), h.rand(h.dt, B, T, Hkv, D)
		dqkv := h.out(h.dt, B, T, qd+2*kd)
		h.b.RoPEQKVBackward(dqkv.dev, dq.dev, dk.dev, dv.dev, theta)
		rq, rk := tensor.MustHost(tensor.Float64, B, T, H, D), tensor.MustHost(tensor.Float64, B, T, Hkv, D)
		h.ref.RoPEBackward(rq, dq.ref, theta)
		h.ref.RoPEBackward(rk, dk.ref, theta)
		packParts(dqkv.ref, B*T, rq, rk, dv.ref)
		h.compare("RoPEQKVBackward dqkv", dqkv)
	}
	// F = 256 and 40 (an odd multiple of 8) take the vectorised kernels, F =
	// 37 and 12 (a multiple of 4, not 8: f32 only) the others.
	for _, s := range [][2]int{{7, 37}, {64, 256}, {13, 40}, {5, 12}} {
		N, F := s[0], s[1]
		gu := h.rand(h.dt, N, 2*F)
		out := h.out(h.dt, N, F)
		h.b.SwiGLUPacked(out.dev, gu.dev)
		gp := unpackParts(gu.ref, N, []int{F, F}, [][]int{{N, F}, {N, F}})
		h.ref.SwiGLU(out.ref, gp[0], gp[1])
		h.compare("SwiGLUPacked", out)

		dout := h.rand(h.dt, N, F)
		dgu := h.out(h.dt, N, 2*F)
		h.b.SwiGLUPackedBackward(dgu.dev, dout.dev, gu.dev)
		dg, du := tensor.MustHost(tensor.Float64, N, F), tensor.MustHost(tensor.Float64, N, F)
		h.ref.SwiGLUBackward(dg, du, dout.ref, gp[0], gp[1])
		packParts(dgu.ref, N, dg, du)
		h.compare("SwiGLUPackedBackward dgu", dgu)
	}
}

// unpackParts splits the float64 packed (rows, Σ widths) into tensors of
// shapes, part i holding widths[i] columns of each row after those of the
// parts before it.
func unpackParts(packed *tensor.Tensor, rows int, widths []int, shapes [][]int) []*tensor.Tensor {
	src, stride := packed.F64(), 0
	for _, w := range widths {
		stride += w
	}
	out := make([]*tensor.Tensor, len(widths))
	off := 0
	for i, w := range widths {
		out[i] = tensor.MustHost(tensor.Float64, shapes[i]...)
		dst := out[i].F64()
		for r := range rows {
			copy(dst[r*w:(r+1)*w], src[r*stride+off:][:w])
		}
		off += w
	}
	return out
}

// packParts writes the parts (rows, w_i) side by side into packed
// (rows, Σ w_i).
func packParts(packed *tensor.Tensor, rows int, parts ...*tensor.Tensor) {
	dst, stride := packed.F64(), packed.Numel()/rows
	off := 0
	for _, part := range parts {
		src, w := part.F64(), part.Numel()/rows
		for r := range rows {
			copy(dst[r*stride+off:][:w], src[r*w:(r+1)*w])
		}
		off += w
	}
}
