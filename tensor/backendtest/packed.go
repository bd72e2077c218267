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
// fails; shapes include a head dim and widths that are not multiples of 8.
func TestPacked(t *testing.T, b tensor.Backend, opts Options) {
	h := newHarness(t, b, opts, 17)
	// D = 64 and 48 take the vectorised kernels of a backend that has them
	// (in bf16 and f32), D = 40 only in f32 (D/2 = 20 is no multiple of 8),
	// D = 6 never; 33 and 21 tokens are multiples of nothing useful.
	for _, s := range [][4]int{{2, 5, 3, 6}, {1, 33, 2, 64}, {3, 7, 5, 48}, {1, 7, 3, 40}} {
		B, T, H, D := s[0], s[1], s[2], s[3]
		hd := H * D
		theta := 10000.0
		qkv := h.rand(h.dt, B, T, 3*hd)
		q, k, v := h.out(h.dt, B, T, H, D), h.out(h.dt, B, T, H, D), h.out(h.dt, B, T, H, D)
		h.b.RoPEQKV(q.dev, k.dev, v.dev, qkv.dev, theta)
		parts := unpackRef(qkv.ref, B*T, hd, 3, B, T, H, D)
		h.ref.RoPE(q.ref, parts[0], theta)
		h.ref.RoPE(k.ref, parts[1], theta)
		copy(v.ref.F64(), parts[2].F64())
		h.compare("RoPEQKV q", q)
		h.compare("RoPEQKV k", k)
		h.compare("RoPEQKV v", v)

		dq, dk, dv := h.rand(h.dt, B, T, H, D), h.rand(h.dt, B, T, H, D), h.rand(h.dt, B, T, H, D)
		dqkv := h.out(h.dt, B, T, 3*hd)
		h.b.RoPEQKVBackward(dqkv.dev, dq.dev, dk.dev, dv.dev, theta)
		rq, rk := tensor.MustHost(tensor.Float64, B, T, H, D), tensor.MustHost(tensor.Float64, B, T, H, D)
		h.ref.RoPEBackward(rq, dq.ref, theta)
		h.ref.RoPEBackward(rk, dk.ref, theta)
		packRef(dqkv.ref, B*T, hd, rq, rk, dv.ref)
		h.compare("RoPEQKVBackward dqkv", dqkv)
	}
	// F = 256 and 40 (an odd multiple of 8) take the vectorised kernels, F =
	// 37 and 12 (a multiple of 4, not 8: f32 only) the others.
	for _, s := range [][2]int{{7, 37}, {64, 256}, {13, 40}, {5, 12}} {
		N, F := s[0], s[1]
		gu := h.rand(h.dt, N, 2*F)
		out := h.out(h.dt, N, F)
		h.b.SwiGLUPacked(out.dev, gu.dev)
		gp := unpackRef(gu.ref, N, F, 2, N, F)
		h.ref.SwiGLU(out.ref, gp[0], gp[1])
		h.compare("SwiGLUPacked", out)

		dout := h.rand(h.dt, N, F)
		dgu := h.out(h.dt, N, 2*F)
		h.b.SwiGLUPackedBackward(dgu.dev, dout.dev, gu.dev)
		dg, du := tensor.MustHost(tensor.Float64, N, F), tensor.MustHost(tensor.Float64, N, F)
		h.ref.SwiGLUBackward(dg, du, dout.ref, gp[0], gp[1])
		packRef(dgu.ref, N, F, dg, du)
		h.compare("SwiGLUPackedBackward dgu", dgu)
	}
}

// unpackRef splits the float64 packed (rows, p·w) into p tensors of shape,
// part i holding columns [i·w, (i+1)·w) of each row.
func unpackRef(packed *tensor.Tensor, rows, w, p int, shape ...int) []*tensor.Tensor {
	src := packed.F64()
	out := make([]*tensor.Tensor, p)
	for i := range out {
		out[i] = tensor.MustHost(tensor.Float64, shape...)
		dst := out[i].F64()
		for r := range rows {
			copy(dst[r*w:(r+1)*w], src[r*p*w+i*w:][:w])
		}
	}
	return out
}

// packRef writes the parts (rows, w) side by side into packed (rows, p·w).
func packRef(packed *tensor.Tensor, rows, w int, parts ...*tensor.Tensor) {
	dst, p := packed.F64(), len(parts)
	for i, part := range parts {
		src := part.F64()
		for r := range rows {
			copy(dst[r*p*w+i*w:][:w], src[r*w:(r+1)*w])
		}
	}
}
