package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// RoPEQKV rotates the q and k parts of the packed projections qkv
// (B, T, 3·H·D) into q and k (B, T, H, D) and copies the v part into v, in
// one launch (packed.cu: rope_qkv), with RoPE's angle table.
func (b *Backend) RoPEQKV(q, k, v, qkv *tensor.Tensor, theta float64) {
	c := b.check("RoPEQKV")
	nb, nt, nh, d := opcheck.RoPEQKV(c, q, k, v, qkv)
	ropeFits(c, nt, nh, d)
	if !c.OK() {
		return
	}
	b.ropePacked("RoPEQKV", "rope_qkv", []*tensor.Tensor{q, k, v, qkv}, nb, nt, nh, d, theta)
}

// RoPEQKVBackward writes dqkv (B, T, 3·H·D) = [RoPE⁻¹(dq) | RoPE⁻¹(dk) | dv]
// per token in one launch (rope_qkv_bwd).
func (b *Backend) RoPEQKVBackward(dqkv, dq, dk, dv *tensor.Tensor, theta float64) {
	c := b.check("RoPEQKVBackward")
	nb, nt, nh, d := opcheck.RoPEQKVBackward(c, dqkv, dq, dk, dv)
	ropeFits(c, nt, nh, d)
	if !c.OK() {
		return
	}
	b.ropePacked("RoPEQKVBackward", "rope_qkv_bwd", []*tensor.Tensor{dqkv, dq, dk, dv}, nb, nt, nh, d, theta)
}

func (b *Backend) ropePacked(op, kernel string, ts []*tensor.Tensor, nb, nt, nh, d int, theta float64) {
	tokens := nb * nt
	if tokens == 0 || nh == 0 || d == 0 {
		return
	}
	b.do(op, func(dev gpu.Device) error {
		table, err := b.ropeTable(dev, nt, d, theta)
		if err != nil {
			return err
		}
		return dev.Launch(kernel+sfx(ts[0].DType()), b.gridStride(tokens*nh*d/2, 1), gpu.D1(threads256), 0,
			ptr(ts[0]), ptr(ts[1]), ptr(ts[2]), ptr(ts[3]), table, int32(nt), int32(nh), int32(d), int64(tokens))
	})
}

// SwiGLUPacked sets out (N, F) = silu(gate)·up from gu (N, 2F) = [gate | up]
// per row, one launch (swiglu_packed_fwd).
func (b *Backend) SwiGLUPacked(out, gu *tensor.Tensor) {
	c := b.check("SwiGLUPacked")
	n, f := opcheck.SwiGLUPacked(c, out, gu)
	fits(c, "F", f)
	if !c.OK() || n*f == 0 {
		return
	}
	b.launch("SwiGLUPacked", "swiglu_packed_fwd"+sfx(gu.DType()), b.gridStride(n*f, 1), gpu.D1(threads256), 0,
		ptr(out), ptr(gu), int64(n), int32(f))
}

// SwiGLUPackedBackward sets dgu (N, 2F) = [dgate | dup] per row from dout
// (N, F) and gu, one launch (swiglu_packed_bwd).
func (b *Backend) SwiGLUPackedBackward(dgu, dout, gu *tensor.Tensor) {
	c := b.check("SwiGLUPackedBackward")
	n, f := opcheck.SwiGLUPackedBackward(c, dgu, dout, gu)
	fits(c, "F", f)
	if !c.OK() || n*f == 0 {
		return
	}
	b.launch("SwiGLUPackedBackward", "swiglu_packed_bwd"+sfx(gu.DType()), b.gridStride(n*f, 1), gpu.D1(threads256), 0,
		ptr(dgu), ptr(dout), ptr(gu), int64(n), int32(f))
}
