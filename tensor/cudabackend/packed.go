package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// RoPEQKV rotates the q and k parts of the packed projections qkv
// (B, T, (H + 2·Hkv)·D) into q (B, T, H, D) and k (B, T, Hkv, D) and copies
// the v part into v (B, T, Hkv, D), in one launch (packed.cu: rope_qkv),
// with RoPE's angle table. When D/2 is a multiple of a 16-byte pack (D % 16
// == 0 in bf16, D % 8 == 0 in f32), the tensors are 16-byte aligned and
// B·T·(H + 2·Hkv)·D < 2³¹, the launch is rope_qkv_vec (a pack of both
// halves per thread, 32-bit indices) instead.
func (b *Backend) RoPEQKV(q, k, v, qkv *tensor.Tensor, theta float64) {
	c := b.check("RoPEQKV")
	nb, nt, nh, hkv, d := opcheck.RoPEQKV(c, q, k, v, qkv)
	ropeFits(c, nt, nh, d)
	if !c.OK() {
		return
	}
	b.ropePacked("RoPEQKV", "rope_qkv", []*tensor.Tensor{q, k, v, qkv}, nb, nt, nh, hkv, d, theta)
}

// RoPEQKVBackward writes dqkv (B, T, (H + 2·Hkv)·D) = [RoPE⁻¹(dq) |
// RoPE⁻¹(dk) | dv] per token in one launch (rope_qkv_bwd, or
// rope_qkv_bwd_vec under the conditions of RoPEQKV's).
func (b *Backend) RoPEQKVBackward(dqkv, dq, dk, dv *tensor.Tensor, theta float64) {
	c := b.check("RoPEQKVBackward")
	nb, nt, nh, hkv, d := opcheck.RoPEQKVBackward(c, dqkv, dq, dk, dv)
	ropeFits(c, nt, nh, d)
	if !c.OK() {
		return
	}
	b.ropePacked("RoPEQKVBackward", "rope_qkv_bwd", []*tensor.Tensor{dqkv, dq, dk, dv}, nb, nt, nh, hkv, d, theta)
}

func (b *Backend) ropePacked(op, kernel string, ts []*tensor.Tensor, nb, nt, nh, hkv, d int, theta float64) {
	tokens := nb * nt
	if tokens == 0 || nh == 0 || d == 0 {
		return
	}
	b.do(op, func(dev gpu.Device) error {
		table, err := b.ropeTable(dev, nt, d, theta)
		if err != nil {
			return err
		}
		dt := ts[0].DType()
		if v := packOf(dt.Size()); (d/2)%v == 0 && tokens*(nh+2*hkv)*d < 1<<31 && tcAligned(ts...) && table%16 == 0 {
			return dev.Launch(kernel+"_vec"+sfx(dt), b.gridStride(tokens*nh*d/(2*v), 1), gpu.D1(threads256), 0,
				ptr(ts[0]), ptr(ts[1]), ptr(ts[2]), ptr(ts[3]), table, int32(nt), int32(nh), int32(hkv), int32(d), int32(tokens))
		}
		return dev.Launch(kernel+sfx(dt), b.gridStride(tokens*nh*d/2, 1), gpu.D1(threads256), 0,
			ptr(ts[0]), ptr(ts[1]), ptr(ts[2]), ptr(ts[3]), table, int32(nt), int32(nh), int32(hkv), int32(d), int64(tokens))
	})
}

// SwiGLUPacked sets out (N, F) = silu(gate)·up from gu (N, 2F) = [gate | up]
// per row, one launch (swiglu_packed_fwd; swiglu_packed_fwd_vec, a pack of
// gate and one of up per thread with 32-bit indices, when F is a multiple of
// a 16-byte pack, the tensors are 16-byte aligned and N·2F < 2³¹).
func (b *Backend) SwiGLUPacked(out, gu *tensor.Tensor) {
	c := b.check("SwiGLUPacked")
	n, f := opcheck.SwiGLUPacked(c, out, gu)
	fits(c, "F", f)
	if !c.OK() || n*f == 0 {
		return
	}
	if v := packOf(gu.DType().Size()); swigluVec(f, v, n, out, gu) {
		b.launch("SwiGLUPacked", "swiglu_packed_fwd_vec"+sfx(gu.DType()), b.gridStride(n*f/v, 1), gpu.D1(threads256), 0,
			ptr(out), ptr(gu), int32(n), int32(f))
		return
	}
	b.launch("SwiGLUPacked", "swiglu_packed_fwd"+sfx(gu.DType()), b.gridStride(n*f, 1), gpu.D1(threads256), 0,
		ptr(out), ptr(gu), int64(n), int32(f))
}

// SwiGLUPackedBackward sets dgu (N, 2F) = [dgate | dup] per row from dout
// (N, F) and gu, one launch (swiglu_packed_bwd, or swiglu_packed_bwd_vec
// under the conditions of SwiGLUPacked's).
func (b *Backend) SwiGLUPackedBackward(dgu, dout, gu *tensor.Tensor) {
	c := b.check("SwiGLUPackedBackward")
	n, f := opcheck.SwiGLUPackedBackward(c, dgu, dout, gu)
	fits(c, "F", f)
	if !c.OK() || n*f == 0 {
		return
	}
	if v := packOf(gu.DType().Size()); swigluVec(f, v, n, dgu, dout, gu) {
		b.launch("SwiGLUPackedBackward", "swiglu_packed_bwd_vec"+sfx(gu.DType()), b.gridStride(n*f/v, 1), gpu.D1(threads256), 0,
			ptr(dgu), ptr(dout), ptr(gu), int32(n), int32(f))
		return
	}
	b.launch("SwiGLUPackedBackward", "swiglu_packed_bwd"+sfx(gu.DType()), b.gridStride(n*f, 1), gpu.D1(threads256), 0,
		ptr(dgu), ptr(dout), ptr(gu), int64(n), int32(f))
}

// swigluVec says whether the vectorised SwiGLU kernels fit: F a multiple of
// the pack of v elements (gate and up rows then start on 16 bytes), every
// tensor 16-byte aligned, N·2F in 32 bits.
func swigluVec(f, v, n int, ts ...*tensor.Tensor) bool {
	return f%v == 0 && n*2*f < 1<<31 && tcAligned(ts...)
}
