package cudabackend

import (
	"math"
	"unsafe"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// ropeKey identifies a table of RoPE angles.
type ropeKey struct {
	t, d  int
	theta float64
}

// ropeTable returns the device table (T, D/2, 2) fp32 of (cos, sin) of
// t·θ^(−2i/D), computed on the host in float64 once per (T, D, θ) and kept
// until Close. The caller has acquired the device.
func (b *Backend) ropeTable(d gpu.Device, t, dim int, theta float64) (gpu.Ptr, error) {
	k := ropeKey{t, dim, theta}
	if p, ok := b.rope[k]; ok {
		return p, nil
	}
	half := dim / 2
	cs := make([]float32, 2*t*half)
	for pos := range t {
		for i := range half {
			a := float64(pos) * math.Pow(theta, -2*float64(i)/float64(dim))
			cs[2*(pos*half+i)] = float32(math.Cos(a))
			cs[2*(pos*half+i)+1] = float32(math.Sin(a))
		}
	}
	bytes := max(len(cs)*4, 4)
	p, err := d.Alloc(bytes)
	if err != nil {
		return 0, err
	}
	if len(cs) > 0 {
		if err := d.CopyHtoD(p, unsafe.Pointer(&cs[0]), len(cs)*4); err != nil {
			d.Free(p)
			return 0, err
		}
	}
	b.rope[k] = p
	return p, nil
}

// ropeFits checks T, H and D against the kernels' sizes.
func ropeFits(c *opcheck.Checker, nt, nh, d int) {
	fits(c, "T", nt)
	fits(c, "H", nh)
	fits(c, "D", d)
}

// RoPE rotates x (B, T, H, D) by position: for t < T and i < D/2 the pair
// (x[..., i], x[..., i+D/2]) turns by the angle t·θ^(−2i/D), with the angles'
// cos and sin from a float64 host table. out may alias x.
func (b *Backend) RoPE(out, x *tensor.Tensor, theta float64) {
	c := b.check("RoPE")
	_, nt, nh, d := opcheck.RoPE(c, out, x)
	ropeFits(c, nt, nh, d)
	if !c.OK() {
		return
	}
	b.rope4("RoPE", out, x, theta, 1)
}

// RoPEBackward sets dx to dout turned back by the same angles.
func (b *Backend) RoPEBackward(dx, dout *tensor.Tensor, theta float64) {
	c := b.check("RoPEBackward")
	_, nt, nh, d := opcheck.RoPEBackward(c, dx, dout)
	ropeFits(c, nt, nh, d)
	if !c.OK() {
		return
	}
	b.rope4("RoPEBackward", dx, dout, theta, -1)
}

func (b *Backend) rope4(op string, out, x *tensor.Tensor, theta float64, sign float32) {
	s := x.Shape()
	nt, nh, d := s[1], s[2], s[3]
	rowsN := s[0] * nt * nh
	if rowsN == 0 || d == 0 {
		return
	}
	b.do(op, func(dev gpu.Device) error {
		table, err := b.ropeTable(dev, nt, d, theta)
		if err != nil {
			return err
		}
		if x.DType() == tensor.BFloat16 && d%16 == 0 && rowsN*d < 1<<31 && tcAligned(out, x) {
			return dev.Launch("rope_v8_bf16", b.gridStride(rowsN*d/16, 1), gpu.D1(threads256), 0,
				ptr(out), ptr(x), table, int32(nt), int32(nh), int32(d), int32(rowsN), sign)
		}
		return dev.Launch("rope"+sfx(x.DType()), b.gridStride(rowsN*d/2, 1), gpu.D1(threads256), 0,
			ptr(out), ptr(x), table, int32(nt), int32(nh), int32(d), int64(rowsN), sign)
	})
}

// attnFits checks the limits of the attention kernels: D ≤ 128, B·H within
// the grid, T in 32 bits. (B·Hkv ≤ B·H: Hkv divides H.)
func attnFits(c *opcheck.Checker, q *tensor.Tensor, nb, nt, nh, d int) {
	if !c.Failed() && d > 128 {
		c.Failf("q has shape %v: head dim D = %d, the attention kernels take D ≤ 128", q.Shape(), d)
	}
	if !c.Failed() && nb*nh > 65535 {
		c.Failf("q has shape %v: B·H = %d exceeds the kernels' grid limit 65535", q.Shape(), nb*nh)
	}
	fits(c, "T", nt)
}

// attnVariant is the kernel name suffix for head dim d: "_d32", "_d64" or
// "_d128" (the smallest that holds d).
func attnVariant(d int) string {
	switch {
	case d <= 32:
		return "_d32"
	case d <= 64:
		return "_d64"
	default:
		return "_d128"
	}
}

// attnGrid is the grid of the attention kernels: 32 query (or key) rows per
// block, one block row per (b, h).
func attnGrid(nb, nt, nh int) gpu.Dim3 { return gpu.D2(ceilDiv(nt, 32), nb*nh) }

// Attention is causal multi-head attention, fused (flash style: no T×T
// scores in memory): out = softmax(scale·q·kᵀ, causal)·v, and lse (B, H, T)
// fp32 = log-sum-exp of each row of scores, for the backward. q, out
// (B, T, H, D), k, v (B, T, Hkv, D) with Hkv dividing H (grouped-query
// attention: query head h reads key/value head h / (H/Hkv)), D ≤ 128. On
// sm_90 the default takes the wgmma forward at D = 128 (AttentionWGMMA) and
// FA2's at D = 64, with the same bits.
func (b *Backend) Attention(out, lse, q, k, v *tensor.Tensor, scale float32) {
	c := b.check("Attention")
	nb, nt, nh, hkv, d := opcheck.Attention(c, out, lse, q, k, v)
	attnFits(c, q, nb, nt, nh, d)
	if !c.OK() || nb*nt*nh == 0 {
		return
	}
	if b.useTensorCores(q.DType(), d) && tcAligned(out, q, k, v) {
		st := attnStrides{h: nh, hkv: hkv, q: nh * d, kv: hkv * d, o: nh * d}
		if b.useWGFwd(d) {
			b.attentionWG(out, lse, q, k, v, scale, nb, nt, d, st)
			return
		}
		b.attentionFA2(out, lse, q, k, v, scale, nb, nt, d, st)
		return
	}
	b.launch("Attention", "attn_fwd"+attnVariant(d)+sfx(q.DType()), attnGrid(nb, nt, nh), gpu.D1(128), 0,
		ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), int32(nb), int32(nt), int32(nh), int32(hkv), int32(d), scale)
}

// AttentionBackward sets dq, dk, dv (overwritten) from dout and the
// forward's q, k, v, out and lse; dk, dv (B, T, Hkv, D) sum over the query
// heads of each key/value head's group. Deterministic: delta = Σ dout·out
// per row, then one pass over key tiles that accumulates dk and dv in
// registers (over the group's query heads one after another), and one over
// query tiles for dq (the probabilities are recomputed from lse in each),
// with no atomics.
// On sm_90 the default (AttentionAuto) runs the tensor-core backward's
// passes on wgmma (AttentionWGMMA), elsewhere on mma.sync (AttentionFA2).
func (b *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32) {
	c := b.check("AttentionBackward")
	nb, nt, nh, hkv, d := opcheck.AttentionBackward(c, dq, dk, dv, dout, q, k, v, out, lse)
	attnFits(c, q, nb, nt, nh, d)
	if !c.OK() || nb*nt*nh*d == 0 {
		return
	}
	if b.useTensorCores(q.DType(), d) && tcAligned(dq, dk, dv, dout, q, k, v, out) {
		st := attnStrides{h: nh, hkv: hkv, q: nh * d, kv: hkv * d, o: nh * d, dq: nh * d, dkv: hkv * d}
		if b.useWG() {
			b.attentionBackwardWG(dq, dk, dv, dout, q, k, v, out, lse, scale, nb, nt, d, st)
			return
		}
		b.attentionBackwardFA2(dq, dk, dv, dout, q, k, v, out, lse, scale, nb, nt, d, st)
		return
	}
	s := sfx(q.DType())
	variant := attnVariant(d)
	rowsN := nb * nt * nh
	b.do("AttentionBackward", func(dev gpu.Device) error {
		delta, size, err := b.scratch(tensor.Float32, rowsN)
		if err != nil {
			return err
		}
		defer b.putScratch(delta, size)
		if err := dev.Launch("attn_bwd_delta"+s, rowGrid(rowsN), gpu.D1(threads256), 0,
			delta, ptr(dout), ptr(out), int32(nb), int32(nt), int32(nh), int32(d)); err != nil {
			return err
		}
		if err := dev.Launch("attn_bwd_dkdv"+variant+s, attnGrid(nb, nt, hkv), gpu.D1(128), 0,
			ptr(dk), ptr(dv), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), delta,
			int32(nb), int32(nt), int32(nh), int32(hkv), int32(d), scale); err != nil {
			return err
		}
		return dev.Launch("attn_bwd_dq"+variant+s, attnGrid(nb, nt, nh), gpu.D1(128), 0,
			ptr(dq), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), delta,
			int32(nb), int32(nt), int32(nh), int32(hkv), int32(d), scale)
	})
}

// attnStrides are the head counts and row strides (elements between
// consecutive positions t of one (b, head)) of the tensor-core attention
// kernels' operands: h query heads, hkv key/value heads; q for q, kv for k
// and v, o for out and dout, dq for dq, dkv for dk and dv. Contiguous
// tensors have h·D and hkv·D; column slices of one packed projection have
// the packed row's length.
type attnStrides struct {
	h, hkv            int
	q, kv, o, dq, dkv int
}

// tcAligned reports whether every tensor starts on a 16-byte boundary (the
// tensor-core kernels copy 16-byte chunks with cp.async).
func tcAligned(ts ...*tensor.Tensor) bool {
	for _, t := range ts {
		if ptr(t)%16 != 0 {
			return false
		}
	}
	return true
}

// useTensorCores says whether the tensor-core attention kernels
// (attention_fa2.cu, attention_wg.cu) run: bf16, D = 64 or 128, not
// AttentionSIMT, an image that has them.
func (b *Backend) useTensorCores(dt tensor.DType, d int) bool {
	return b.useFA2() && dt == tensor.BFloat16 && (d == 64 || d == 128)
}
