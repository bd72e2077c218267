package cpu

import (
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// Attention is causal multi-head attention: position t of each (batch, head)
// attends to positions [0, t] with weights softmax(scale·q·kᵀ). With
// grouped-query attention (Hkv < H), query head h reads key/value head
// h / (H/Hkv).
//
//	q, out (B, T, H, D); k, v (B, T, Hkv, D); lse (B, H, T), Float32 or q's dtype
//
// lse receives the log-sum-exp of each row of scores, for the backward.
func (bk *Backend) Attention(out, lse, q, k, v *tensor.Tensor, scale float32) {
	c := bk.check("Attention")
	nb, nt, nh, hkv, d := opcheck.Attention(c, out, lse, q, k, v)
	if !c.OK() {
		return
	}
	a := attn{b: nb, t: nt, h: nh, hkv: hkv, d: d, scale: scale}
	switch {
	case q.DType() == tensor.Float32:
		attention(bk, a, out.F32(), lse.F32(), q.F32(), k.F32(), v.F32())
	case lse.DType() == tensor.Float64:
		attention(bk, a, out.F64(), lse.F64(), q.F64(), k.F64(), v.F64())
	default:
		attention(bk, a, out.F64(), lse.F32(), q.F64(), k.F64(), v.F64())
	}
}

// attn holds the dimensions of an attention op: H query heads, Hkv
// key/value heads (Hkv divides H).
type attn struct {
	b, t, h, hkv, d int
	scale           float32
}

// rows returns the offset of position 0 of query pair bh (= b·H + h) in a
// (B, T, H, D) tensor, and the distance between positions (H·D).
func (a attn) rows(bh int) (base, stride int) {
	return (bh/a.h*a.t*a.h + bh%a.h) * a.d, a.h * a.d
}

// kvRows is rows for the key/value head that query pair bh reads, in a
// (B, T, Hkv, D) tensor: head h / (H/Hkv) of batch b.
func (a attn) kvRows(bh int) (base, stride int) {
	b, h := bh/a.h, bh%a.h
	return (b*a.t*a.hkv + h/(a.h/a.hkv)) * a.d, a.hkv * a.d
}

// dot is Σ x·y over len(x) elements, in four interleaved partial sums
// (always in the same order).
func dot[T float](x, y []T) T {
	y = y[:len(x)]
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * y[i]
		s1 += x[i+1] * y[i+1]
		s2 += x[i+2] * y[i+2]
		s3 += x[i+3] * y[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func attention[T, S float](bk *Backend, a attn, out []T, lse []S, q, k, v []T) {
	d, scale := a.d, T(a.scale)
	bk.parallelFor(a.b*a.h, a.t*a.t*a.d, func(lo, hi int) {
		s := make([]T, a.t) // scores of one row
		for bh := lo; bh < hi; bh++ {
			base, stride := a.rows(bh)
			kbase, kstride := a.kvRows(bh)
			for i := range a.t {
				if i&63 == 63 && bk.interrupted("Attention") {
					return // the output is undefined; the error is recorded
				}
				oi := base + i*stride
				qi := q[oi : oi+d]
				m := T(math.Inf(-1))
				for j := 0; j <= i; j++ {
					s[j] = scale * dot(qi, k[kbase+j*kstride:][:d])
					m = max(m, s[j])
				}
				var sum T
				for j := 0; j <= i; j++ {
					s[j] = T(math.Exp(float64(s[j] - m)))
					sum += s[j]
				}
				outi := out[oi : oi+d]
				clear(outi)
				inv := 1 / sum
				for j := 0; j <= i; j++ {
					p := s[j] * inv
					for x, vv := range v[kbase+j*kstride:][:d] {
						outi[x] += p * vv
					}
				}
				lse[bh*a.t+i] = S(m + T(math.Log(float64(sum))))
			}
		}
	})
}

// AttentionBackward sets dq, dk, dv (overwritten) from dout and the
// forward's q, k, v, out and lse, recomputing the probabilities
// p = exp(scale·q·kᵀ − lse):
//
//	dv = pᵀ·dout;  ds = p∘(dout·vᵀ − rowsum(dout∘out));  dq = scale·ds·k;  dk = scale·dsᵀ·q
//
// dk and dv of a key/value head sum the terms of the query heads of its
// group, head by head in order.
func (bk *Backend) AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32) {
	c := bk.check("AttentionBackward")
	nb, nt, nh, hkv, d := opcheck.AttentionBackward(c, dq, dk, dv, dout, q, k, v, out, lse)
	if !c.OK() {
		return
	}
	a := attn{b: nb, t: nt, h: nh, hkv: hkv, d: d, scale: scale}
	switch {
	case q.DType() == tensor.Float32:
		attentionBackward(bk, a, dq.F32(), dk.F32(), dv.F32(), dout.F32(), q.F32(), k.F32(), v.F32(), out.F32(), lse.F32())
	case lse.DType() == tensor.Float64:
		attentionBackward(bk, a, dq.F64(), dk.F64(), dv.F64(), dout.F64(), q.F64(), k.F64(), v.F64(), out.F64(), lse.F64())
	default:
		attentionBackward(bk, a, dq.F64(), dk.F64(), dv.F64(), dout.F64(), q.F64(), k.F64(), v.F64(), out.F64(), lse.F32())
	}
}

func attentionBackward[T, S float](bk *Backend, a attn, dq, dk, dv, dout, q, k, v, out []T, lse []S) {
	d, scale, group := a.d, T(a.scale), a.h/a.hkv
	// Every gradient row of a key/value pair (b, kv head) and of its
	// group's query pairs is written by the goroutine that owns the
	// key/value pair, so those pairs run in parallel.
	bk.parallelFor(a.b*a.hkv, 2*group*a.t*a.t*a.d, func(lo, hi int) {
		for bkv := lo; bkv < hi; bkv++ {
			first := bkv/a.hkv*a.h + bkv%a.hkv*group // the group's first query pair
			kbase, kstride := a.kvRows(first)
			for i := range a.t {
				o := kbase + i*kstride
				clear(dk[o : o+d])
				clear(dv[o : o+d])
			}
			for bh := first; bh < first+group; bh++ {
				base, stride := a.rows(bh)
				for i := range a.t {
					o := base + i*stride
					clear(dq[o : o+d])
				}
				for i := range a.t {
					if i&63 == 63 && bk.interrupted("AttentionBackward") {
						return
					}
					oi := base + i*stride
					qi, doi, dqi := q[oi:oi+d], dout[oi:oi+d], dq[oi:oi+d]
					di := dot(doi, out[oi:oi+d])
					l := T(lse[bh*a.t+i])
					for j := 0; j <= i; j++ {
						oj := kbase + j*kstride
						kj, vj, dkj, dvj := k[oj:oj+d], v[oj:oj+d], dk[oj:oj+d], dv[oj:oj+d]
						p := T(math.Exp(float64(scale*dot(qi, kj) - l)))
						ds := p * (dot(doi, vj) - di) * scale
						for x := range d {
							dvj[x] += p * doi[x]
							dqi[x] += ds * kj[x]
							dkj[x] += ds * qi[x]
						}
					}
				}
			}
		}
	})
}
