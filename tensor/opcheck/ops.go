package opcheck

import (
	"math"
	"slices"

	"github.com/asynctp/asynctp/tensor"
)

// The op families of tensor.Backend. Each function checks all the arguments
// of its op and returns the sizes that follow from them, which are
// meaningful only when no check has failed.

// MatMul checks C = op(A)·op(B) for 2-D operands, or 3-D ones with a shared
// leading batch dimension (batch is 1 for 2-D):
//
//	a (m, k), or (k, m) with transA
//	b (k, n), or (n, k) with transB
//	c (m, n)
func MatMul(ck *Checker, c, a, b *tensor.Tensor, transA, transB bool) (batch, m, n, k int) {
	ck.Float("a", a)
	ck.Rank("a", a, 2, 3)
	if ck.Failed() {
		return
	}
	r := len(a.Shape())
	ck.DType("b", b, a.DType())
	ck.DType("c", c, a.DType())
	ck.Rank("b", b, r, r)
	ck.Rank("c", c, r, r)
	if ck.Failed() {
		return
	}
	sa, sb := a.Shape(), b.Shape()
	batch = 1
	if r == 3 {
		batch = sa[0]
		if sb[0] != batch || c.Dim(0) != batch {
			ck.Failf("batch dimensions of a %v, b %v and c %v differ", sa, sb, c.Shape())
		}
		sa, sb = sa[1:], sb[1:]
	}
	m, k = sa[0], sa[1]
	if transA {
		m, k = k, m
	}
	kb, n := sb[0], sb[1]
	if transB {
		kb, n = n, kb
	}
	if kb != k {
		ck.Failf("b has shape %v, expected inner dimension %d (transB %v) to match a %v (transA %v)", b.Shape(), k, transB, a.Shape(), transA)
	}
	want := tensor.Shape{m, n}
	if r == 3 {
		want = tensor.Shape{batch, m, n}
	}
	ck.Shape("c", c, want, "for a "+a.Shape().String()+" and b "+b.Shape().String())
	return batch, m, n, k
}

// Elementwise checks tensors of one shape and float dtype (Add, Scale, Axpy,
// SwiGLU, GELU and their backwards): ts[0] is the reference, names[i] is the
// name of ts[i]. It returns the number of elements.
func Elementwise(ck *Checker, names []string, ts ...*tensor.Tensor) (n int) {
	ck.Float(names[0], ts[0])
	for i := 1; i < len(ts); i++ {
		ck.Like(names[i], ts[i], names[0], ts[0])
	}
	if ck.Failed() {
		return 0
	}
	return ts[0].Numel()
}

// RowsVec checks x (..., C) and the vector v (C) of x's dtype: AddBias
// (v = bias) and SumRows (v = dst). n is the number of rows of x.
func RowsVec(ck *Checker, x *tensor.Tensor, vName string, v *tensor.Tensor) (n, cols int) {
	n, cols = rows(ck, "x", x)
	if ck.Failed() {
		return
	}
	ck.DType(vName, v, x.DType())
	ck.Shape(vName, v, tensor.Shape{cols}, "to match the last dim of x "+x.Shape().String())
	return n, cols
}

// norm checks x (N, C), w (C) and rstd (N elements), a side output.
func norm(ck *Checker, x, w, rstd *tensor.Tensor) (n, cols int) {
	n, cols = RowsVec(ck, x, "w", w)
	if ck.Failed() {
		return
	}
	ck.Side("rstd", rstd, x.DType())
	if !ck.Failed() && rstd.Numel() != n {
		ck.Failf("rstd has shape %v, expected %v (one value per row of x %v)", rstd.Shape(), outer(x.Shape()), x.Shape())
	}
	return n, cols
}

// RMSNorm checks x, out (N, C), w (C) and rstd (N).
func RMSNorm(ck *Checker, out, rstd, x, w *tensor.Tensor) (n, cols int) {
	n, cols = norm(ck, x, w, rstd)
	ck.Like("out", out, "x", x)
	return n, cols
}

// RMSNormBackward checks RMSNorm's operands and dx, dout like x, dw like w.
func RMSNormBackward(ck *Checker, dx, dw, dout, x, w, rstd *tensor.Tensor) (n, cols int) {
	n, cols = norm(ck, x, w, rstd)
	ck.Like("dout", dout, "x", x)
	ck.Like("dx", dx, "x", x)
	ck.Like("dw", dw, "w", w)
	return n, cols
}

// AddRMSNorm checks x (N, C), r and h like x, w (C), rstd (N) and out like
// x.
func AddRMSNorm(ck *Checker, h, out, rstd, x, r, w *tensor.Tensor) (n, cols int) {
	n, cols = norm(ck, x, w, rstd)
	ck.Like("r", r, "x", x)
	ck.Like("h", h, "x", x)
	ck.Like("out", out, "x", x)
	return n, cols
}

// RMSNormBackwardAdd checks RMSNormBackward's operands (h as x) and dres
// like h.
func RMSNormBackwardAdd(ck *Checker, dx, dw, dout, h, w, rstd, dres *tensor.Tensor) (n, cols int) {
	n, cols = RMSNormBackward(ck, dx, dw, dout, h, w, rstd)
	ck.Like("dres", dres, "x", h)
	return n, cols
}

// Softmax checks x (..., C) and out like x; n is the number of rows.
func Softmax(ck *Checker, out, x *tensor.Tensor) (n, cols int) {
	n, cols = rows(ck, "x", x)
	ck.Like("out", out, "x", x)
	return n, cols
}

// SoftmaxBackward checks out (..., C) and dout, dx like out.
func SoftmaxBackward(ck *Checker, dx, dout, out *tensor.Tensor) (n, cols int) {
	n, cols = rows(ck, "out", out)
	ck.Like("dout", dout, "out", out)
	ck.Like("dx", dx, "out", out)
	return n, cols
}

// rows checks a float tensor x of 1 to 8 dimensions (rows of its last
// dimension) and returns the number of rows and their length.
func rows(ck *Checker, name string, x *tensor.Tensor) (n, cols int) {
	ck.Float(name, x)
	ck.Rank(name, x, 1, 8)
	if ck.Failed() {
		return 0, 0
	}
	return Rows(x)
}

// RoPE checks x (B, T, H, D) with D even, and out like x.
func RoPE(ck *Checker, out, x *tensor.Tensor) (nb, nt, nh, d int) {
	return rope(ck, "x", x, "out", out)
}

// RoPEBackward checks dout (B, T, H, D) with D even, and dx like dout.
func RoPEBackward(ck *Checker, dx, dout *tensor.Tensor) (nb, nt, nh, d int) {
	return rope(ck, "dout", dout, "dx", dx)
}

func rope(ck *Checker, xName string, x *tensor.Tensor, outName string, out *tensor.Tensor) (nb, nt, nh, d int) {
	ck.Float(xName, x)
	ck.Rank(xName, x, 4, 4)
	if ck.Failed() {
		return
	}
	if x.Dim(3)%2 != 0 {
		ck.Failf("%s has shape %v, expected an even head dim D (the last)", xName, x.Shape())
	}
	ck.Like(outName, out, xName, x)
	return dims4(x)
}

// RoPEQKV checks q (B, T, H, D) with D even, k and v (B, T, Hkv, D) with
// Hkv dividing H (grouped-query attention; Hkv = H is multi-head), and qkv
// (B, T, (H + 2·Hkv)·D): per token the packed projections [q | k | v].
func RoPEQKV(ck *Checker, q, k, v, qkv *tensor.Tensor) (nb, nt, nh, hkv, d int) {
	return ropeQKV(ck, "q", q, "k", k, "v", v, "qkv", qkv)
}

// RoPEQKVBackward checks dq (B, T, H, D) with D even, dk and dv
// (B, T, Hkv, D) with Hkv dividing H, and dqkv (B, T, (H + 2·Hkv)·D).
func RoPEQKVBackward(ck *Checker, dqkv, dq, dk, dv *tensor.Tensor) (nb, nt, nh, hkv, d int) {
	return ropeQKV(ck, "dq", dq, "dk", dk, "dv", dv, "dqkv", dqkv)
}

func ropeQKV(ck *Checker, qn string, q *tensor.Tensor, kn string, k *tensor.Tensor, vn string, v *tensor.Tensor, pn string, packed *tensor.Tensor) (nb, nt, nh, hkv, d int) {
	ck.Float(qn, q)
	ck.Rank(qn, q, 4, 4)
	if ck.Failed() {
		return
	}
	if q.Dim(3)%2 != 0 {
		ck.Failf("%s has shape %v, expected an even head dim D (the last)", qn, q.Shape())
	}
	kvHeads(ck, qn, q, kn, k, vn, v)
	if ck.Failed() {
		return
	}
	nb, nt, nh, d = dims4(q)
	hkv = k.Dim(2)
	ck.DType(pn, packed, q.DType())
	ck.Shape(pn, packed, tensor.Shape{nb, nt, (nh + 2*hkv) * d}, "(B, T, (H + 2·Hkv)·D): [q | k | v] per token")
	return
}

// kvHeads checks k (B, T, Hkv, D) against q (B, T, H, D): q's dtype, B, T
// and D, Hkv ≥ 1 dividing H (each kv head serves a group of H/Hkv
// consecutive q heads); and v like k.
func kvHeads(ck *Checker, qn string, q *tensor.Tensor, kn string, k *tensor.Tensor, vn string, v *tensor.Tensor) {
	ck.DType(kn, k, q.DType())
	ck.Rank(kn, k, 4, 4)
	if ck.Failed() {
		return
	}
	qs, ks := q.Shape(), k.Shape()
	if ks[0] != qs[0] || ks[1] != qs[1] || ks[3] != qs[3] || ks[2] < 1 || qs[2]%ks[2] != 0 {
		ck.Failf("%s has shape %v, expected (%d, %d, Hkv, %d) with Hkv dividing the %d heads of %s %v", kn, ks, qs[0], qs[1], qs[3], qs[2], qn, qs)
		return
	}
	ck.Like(vn, v, kn, k)
}

// SwiGLUPacked checks gu (N, 2F), the packed [gate | up] rows, and out
// (N, F) of its dtype.
func SwiGLUPacked(ck *Checker, out, gu *tensor.Tensor) (n, f int) {
	n, f = packedRows(ck, "gu", gu)
	ck.DType("out", out, gu.DType())
	ck.Shape("out", out, tensor.Shape{n, f}, "(N, F) for gu (N, 2F)")
	return
}

// SwiGLUPackedBackward checks gu (N, 2F), dout (N, F) and dgu like gu.
func SwiGLUPackedBackward(ck *Checker, dgu, dout, gu *tensor.Tensor) (n, f int) {
	n, f = packedRows(ck, "gu", gu)
	ck.DType("dout", dout, gu.DType())
	ck.Shape("dout", dout, tensor.Shape{n, f}, "(N, F) for gu (N, 2F)")
	ck.Like("dgu", dgu, "gu", gu)
	return
}

func packedRows(ck *Checker, name string, t *tensor.Tensor) (n, f int) {
	ck.Float(name, t)
	ck.Rank(name, t, 2, 2)
	if ck.Failed() {
		return
	}
	if t.Dim(1)%2 != 0 {
		ck.Failf("%s has shape %v, expected an even row length 2F ([gate | up])", name, t.Shape())
		return
	}
	return t.Dim(0), t.Dim(1) / 2
}

func dims4(t *tensor.Tensor) (a, b, c, d int) {
	s := t.Shape()
	return s[0], s[1], s[2], s[3]
}

// attention checks q (B, T, H, D), k and v (B, T, Hkv, D) with Hkv
// dividing H, and lse (B, H, T), a side output.
func attention(ck *Checker, q, k, v, lse *tensor.Tensor) (nb, nt, nh, hkv, d int) {
	ck.Float("q", q)
	ck.Rank("q", q, 4, 4)
	if ck.Failed() {
		return
	}
	kvHeads(ck, "q", q, "k", k, "v", v)
	if ck.Failed() {
		return
	}
	ck.Side("lse", lse, q.DType())
	s := q.Shape()
	ck.Shape("lse", lse, tensor.Shape{s[0], s[2], s[1]}, "(B, H, T) for q "+s.String()+" (B, T, H, D)")
	nb, nt, nh, d = dims4(q)
	return nb, nt, nh, k.Dim(2), d
}

// Attention checks q, out (B, T, H, D), k, v (B, T, Hkv, D) with Hkv
// dividing H (grouped-query attention: q head h reads kv head
// h / (H/Hkv)), and lse (B, H, T).
func Attention(ck *Checker, out, lse, q, k, v *tensor.Tensor) (nb, nt, nh, hkv, d int) {
	nb, nt, nh, hkv, d = attention(ck, q, k, v, lse)
	ck.Like("out", out, "q", q)
	return
}

// AttentionBackward checks Attention's operands, dout and dq like q, and
// dk, dv like k.
func AttentionBackward(ck *Checker, dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor) (nb, nt, nh, hkv, d int) {
	nb, nt, nh, hkv, d = attention(ck, q, k, v, lse)
	ck.Like("out", out, "q", q)
	ck.Like("dout", dout, "q", q)
	ck.Like("dq", dq, "q", q)
	ck.Like("dk", dk, "k", k)
	ck.Like("dv", dv, "k", k)
	return
}

// Embedding checks table (V, C), ids int32 (N elements, any shape) and out
// (ids' shape, then C). The values of ids are the backend's to check.
func Embedding(ck *Checker, out, table, ids *tensor.Tensor) (n, v, cols int) {
	return embedding(ck, "table", table, ids, "out", out)
}

// EmbeddingBackward checks dtable (V, C), ids and dout like Embedding's.
func EmbeddingBackward(ck *Checker, dtable, dout, ids *tensor.Tensor) (n, v, cols int) {
	return embedding(ck, "dtable", dtable, ids, "dout", dout)
}

func embedding(ck *Checker, tableName string, table, ids *tensor.Tensor, xName string, x *tensor.Tensor) (n, v, cols int) {
	ck.Float(tableName, table)
	ck.Rank(tableName, table, 2, 2)
	ck.DType("ids", ids, tensor.Int32)
	if ck.Failed() {
		return
	}
	ck.DType(xName, x, table.DType())
	want := append(ids.Shape().Clone(), table.Dim(1))
	ck.Shape(xName, x, want, "(one row of "+tableName+" "+table.Shape().String()+" per id of ids "+ids.Shape().String()+")")
	return ids.Numel(), table.Dim(0), table.Dim(1)
}

// CrossEntropy checks logits (..., V), targets int32 and losses (a side
// output) with one element per row of logits, and dlogits like logits
// unless nil. The values of targets are the backend's to check.
func CrossEntropy(ck *Checker, losses, dlogits, logits, targets *tensor.Tensor) (n, v int) {
	n, v = rows(ck, "logits", logits)
	ck.DType("targets", targets, tensor.Int32)
	if ck.Failed() {
		return
	}
	ck.Side("losses", losses, logits.DType())
	if dlogits != nil {
		ck.Like("dlogits", dlogits, "logits", logits)
	}
	rowsOf := "one per row of logits " + logits.Shape().String()
	if !ck.Failed() && targets.Numel() != n {
		ck.Failf("targets has shape %v, expected %v (%s)", targets.Shape(), outer(logits.Shape()), rowsOf)
	}
	if !ck.Failed() && losses.Numel() != n {
		ck.Failf("losses has shape %v, expected %v (%s)", losses.Shape(), outer(logits.Shape()), rowsOf)
	}
	return n, v
}

// AdamW checks p and g (Policy.Params), master (nil, or Policy.Optim), the
// moments m and v (the dtype the update is computed in: see Policy.Optim),
// all of p's numel, and hp.Step ≥ 1. It returns the compute dtype.
func AdamW(ck *Checker, p, g, m, v, master *tensor.Tensor, hp tensor.AdamW) tensor.DType {
	pol := ck.pol
	ck.oneOf("p", p, pol.Params, "a float tensor")
	ck.oneOf("g", g, pol.Params, "a float tensor")
	if master != nil {
		ck.oneOf("master", master, pol.Optim, "")
	}
	if ck.Failed() {
		return tensor.Invalid
	}
	cd := p.DType()
	switch {
	case master != nil:
		cd = master.DType()
	case slices.Contains(pol.Optim, cd):
	case pol.Upcast:
		cd = pol.Optim[0]
	default:
		ck.Failf("p is %v, expected %s, or an %v master copy for a %v p", p, list(pol.Optim), pol.Optim[0], p.DType())
	}
	ck.DType("m", m, cd)
	ck.DType("v", v, cd)
	if ck.Failed() {
		return tensor.Invalid
	}
	for _, t := range []struct {
		name string
		t    *tensor.Tensor
	}{{"g", g}, {"m", m}, {"v", v}, {"master", master}} {
		if t.t != nil && t.t.Numel() != p.Numel() {
			ck.Failf("%s %v has %d elements, expected %d like p %v", t.name, t.t, t.t.Numel(), p.Numel(), p)
		}
	}
	if hp.Step < 1 {
		ck.Failf("hp.Step = %d, expected ≥ 1 (bias correction counts steps from 1)", hp.Step)
	}
	if hp.NormSq != nil {
		scalar(ck, "hp.NormSq", hp.NormSq)
	}
	return cd
}

// scalar checks a one-element device scalar of a dtype AdamW computes in
// (Policy.Optim): SumSquaresTo's dst, AdamW's NormSq.
func scalar(ck *Checker, name string, t *tensor.Tensor) {
	ck.oneOf(name, t, ck.pol.Optim, "")
	if !ck.Failed() && t.Numel() != 1 {
		ck.Failf("%s has shape %v, expected one element", name, t.Shape())
	}
}

// SumSquaresTo checks dst (one element of Policy.Optim) and x (a float
// tensor of Policy.Params).
func SumSquaresTo(ck *Checker, dst, x *tensor.Tensor) {
	scalar(ck, "dst", dst)
	ck.oneOf("x", x, ck.pol.Params, "a float tensor")
}

// SumSquares checks x, a float tensor of Policy.Params.
func SumSquares(ck *Checker, x *tensor.Tensor) {
	ck.oneOf("x", x, ck.pol.Params, "a float tensor")
}

// Upload checks dst (the backend's) and src (host memory) for a conversion.
func Upload(ck *Checker, dst, src *tensor.Tensor) {
	ck.Own("dst", dst)
	ck.Host("src", src)
	convertible(ck, dst, src)
}

// Download checks dst (host memory) and src (the backend's) for a
// conversion.
func Download(ck *Checker, dst, src *tensor.Tensor) {
	ck.Host("dst", dst)
	ck.Own("src", src)
	convertible(ck, dst, src)
}

// Copy checks dst and src, both the backend's, for a conversion.
func Copy(ck *Checker, dst, src *tensor.Tensor) {
	ck.Own("dst", dst)
	ck.Own("src", src)
	convertible(ck, dst, src)
}

// convertible checks the numels and dtypes of a conversion src → dst: the
// same numel, and float and integer dtypes do not mix.
func convertible(ck *Checker, dst, src *tensor.Tensor) {
	if ck.Failed() {
		return
	}
	if dst.Numel() != src.Numel() {
		ck.Failf("dst %v has %d elements, expected %d like src %v", dst, dst.Numel(), src.Numel(), src)
	}
	if (dst.DType() == tensor.Int32) != (src.DType() == tensor.Int32) {
		ck.Failf("cannot convert %v to %v (integer and float dtypes do not mix)", src, dst)
	}
}

// Fill checks t and that v fits t's dtype (an integer in range for Int32).
func Fill(ck *Checker, t *tensor.Tensor, v float64) {
	ck.Own("t", t)
	if !ck.Failed() && t.DType() == tensor.Int32 && (v != math.Trunc(v) || v < math.MinInt32 || v > math.MaxInt32) {
		ck.Failf("value %v does not fit %v", v, t)
	}
}
