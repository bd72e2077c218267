package opcheck

import "github.com/asynctp/asynctp/tensor"

// The ops of tensor.MoEOps. The values of index tensors (idx, pos) are the
// backend's to check.

// TopK checks x (N, E), vals (N, K) of x's dtype with 1 ≤ K ≤ E, and idx
// (N, K) int32.
func TopK(ck *Checker, vals, idx, x *tensor.Tensor) (n, e, k int) {
	ck.rows2("x", x, tensor.Invalid, -1)
	if !ck.Failed() {
		ck.DType("vals", vals, x.DType())
	}
	ck.Rank("vals", vals, 2, 2)
	if ck.Failed() {
		return
	}
	n, e, k = x.Dim(0), x.Dim(1), vals.Dim(1)
	ck.Shape("vals", vals, tensor.Shape{n, k}, "(N, K) for x "+x.Shape().String())
	if !ck.Failed() && (k < 1 || k > e) {
		ck.Failf("vals has shape %v: K = %d, expected 1 ≤ K ≤ E = %d", vals.Shape(), k, e)
	}
	ck.DType("idx", idx, tensor.Int32)
	ck.Shape("idx", idx, vals.Shape(), "like vals")
	return n, e, k
}

// TopKBackward checks x and dx (N, E), vals and dvals (N, K) of x's dtype,
// and idx (N, K) int32.
func TopKBackward(ck *Checker, dx, dvals, vals, idx, x *tensor.Tensor) (n, e, k int) {
	ck.rows2("x", x, tensor.Invalid, -1)
	ck.Like("dx", dx, "x", x)
	ck.rows2("vals", vals, tensor.Invalid, -1)
	if !ck.Failed() {
		ck.Shape("vals", vals, tensor.Shape{x.Dim(0), vals.Dim(1)}, "(N, K) for x "+x.Shape().String())
	}
	ck.Like("dvals", dvals, "vals", vals)
	if !ck.Failed() && vals.DType() != x.DType() {
		ck.Failf("vals is %v, expected dtype %v like x", vals, x.DType())
	}
	ck.DType("idx", idx, tensor.Int32)
	if ck.Failed() {
		return
	}
	ck.Shape("idx", idx, vals.Shape(), "like vals")
	return x.Dim(0), x.Dim(1), vals.Dim(1)
}

// GatherRows checks src (R, C), dst (M, C) apart from src, idx (M) int32
// and scale (M) or nil.
func GatherRows(ck *Checker, dst, src, idx, scale *tensor.Tensor) (m, r, cols int) {
	ck.rows2("src", src, tensor.Invalid, -1)
	if !ck.Failed() {
		ck.rows2("dst", dst, src.DType(), src.Dim(1))
		ck.apart("dst", dst, "src", src)
	}
	ck.DType("idx", idx, tensor.Int32)
	if ck.Failed() {
		return
	}
	byRow := "(M) for dst " + dst.Shape().String()
	ck.Shape("idx", idx, tensor.Shape{dst.Dim(0)}, byRow)
	if scale != nil {
		ck.DType("scale", scale, src.DType())
		ck.Shape("scale", scale, tensor.Shape{dst.Dim(0)}, byRow)
	}
	return dst.Dim(0), src.Dim(0), src.Dim(1)
}

// combine checks the operands shared by CombineRows and its backward:
// out-like (N, C), src (M, C), pos (N, K) int32 and weights (N, K) or nil.
func combine(ck *Checker, outName string, out, src, pos, weights *tensor.Tensor) (n, k, m, cols int) {
	ck.rows2("src", src, tensor.Invalid, -1)
	if ck.Failed() {
		return
	}
	ck.rows2(outName, out, src.DType(), src.Dim(1))
	ck.DType("pos", pos, tensor.Int32)
	ck.Rank("pos", pos, 2, 2)
	if ck.Failed() {
		return
	}
	ck.Shape("pos", pos, tensor.Shape{out.Dim(0), pos.Dim(1)}, "(N, K) for "+outName+" "+out.Shape().String())
	if weights != nil {
		ck.DType("weights", weights, src.DType())
		ck.Shape("weights", weights, pos.Shape(), "like pos")
	}
	return out.Dim(0), pos.Dim(1), src.Dim(0), src.Dim(1)
}

// CombineRows checks out (N, C) apart from src (M, C), pos (N, K) int32 and
// weights (N, K) or nil.
func CombineRows(ck *Checker, out, src, pos, weights *tensor.Tensor) (n, k, m, cols int) {
	n, k, m, cols = combine(ck, "out", out, src, pos, weights)
	ck.apart("out", out, "src", src)
	return
}

// CombineRowsBackward checks CombineRows' operands (dout for out), dsrc
// like src and apart from dout and src, and dweights (N, K) or nil.
func CombineRowsBackward(ck *Checker, dsrc, dweights, dout, src, pos, weights *tensor.Tensor) (n, k, m, cols int) {
	n, k, m, cols = combine(ck, "dout", dout, src, pos, weights)
	ck.Like("dsrc", dsrc, "src", src)
	ck.apart("dsrc", dsrc, "dout", dout)
	ck.apart("dsrc", dsrc, "src", src)
	if dweights != nil && !ck.Failed() {
		ck.DType("dweights", dweights, src.DType())
		ck.Shape("dweights", dweights, pos.Shape(), "like pos")
	}
	return
}

// logSumExp checks x (N, E) and a side vector (N).
func logSumExp(ck *Checker, x *tensor.Tensor, name string, v *tensor.Tensor) (n, e int) {
	ck.rows2("x", x, tensor.Invalid, -1)
	if ck.Failed() {
		return
	}
	ck.Side(name, v, x.DType())
	ck.Shape(name, v, tensor.Shape{x.Dim(0)}, "(N) for x "+x.Shape().String())
	return x.Dim(0), x.Dim(1)
}

// LogSumExp checks x (N, E) and lse (N), a side output.
func LogSumExp(ck *Checker, lse, x *tensor.Tensor) (n, e int) {
	return logSumExp(ck, x, "lse", lse)
}

// LogSumExpBackward checks x and dx (N, E), lse and dlse (N).
func LogSumExpBackward(ck *Checker, dx, dlse, x, lse *tensor.Tensor) (n, e int) {
	n, e = logSumExp(ck, x, "lse", lse)
	ck.Like("dx", dx, "x", x)
	ck.Like("dlse", dlse, "lse", lse)
	return
}

// rows2 checks a 2-D tensor t with cols columns (cols < 0: any) and dtype
// dt (Invalid: one of the policy's Floats).
func (c *Checker) rows2(name string, t *tensor.Tensor, dt tensor.DType, cols int) {
	if dt == tensor.Invalid {
		c.Float(name, t)
	} else {
		c.DType(name, t, dt)
	}
	c.Rank(name, t, 2, 2)
	if !c.Failed() && cols >= 0 && t.Dim(1) != cols {
		c.Failf("%s has shape %v, expected %d columns", name, t.Shape(), cols)
	}
}

// apart fails when two tensors share storage.
func (c *Checker) apart(nameA string, a *tensor.Tensor, nameB string, b *tensor.Tensor) {
	if c.Failed() || a.Buffer() != b.Buffer() {
		return
	}
	if a.Offset() < b.Offset()+b.Numel() && b.Offset() < a.Offset()+a.Numel() {
		c.Failf("%s overlaps %s, expected separate storage", nameA, nameB)
	}
}
