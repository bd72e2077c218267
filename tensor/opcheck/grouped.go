package opcheck

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// The ops of tensor.GroupedGEMM. The values of offsets are the backend's to
// check (OffsetsError says what is wrong with them).

// GroupedMatMul checks a (M, K), w (G, N, K) with transW or (G, K, N)
// without, c (M, N) apart from a and w, all of one float dtype, and
// offsets (G+1) int32.
func GroupedMatMul(ck *Checker, c, a, w, offsets *tensor.Tensor, transW bool) (g, m, n, k int) {
	ck.rows2("a", a, tensor.Invalid, -1)
	if ck.Failed() {
		return
	}
	ck.DType("w", w, a.DType())
	ck.Rank("w", w, 3, 3)
	ck.rows2("c", c, a.DType(), -1)
	if ck.Failed() {
		return
	}
	m, k = a.Dim(0), a.Dim(1)
	g, n = w.Dim(0), w.Dim(2)
	kw, layout := w.Dim(1), "(G, K, N)"
	if transW {
		n, kw, layout = w.Dim(1), w.Dim(2), "(G, N, K)"
	}
	if kw != k {
		ck.Failf("w has shape %v, expected %s with K = %d like a %v (transW %v)", w.Shape(), layout, k, a.Shape(), transW)
	}
	if !ck.Failed() && g < 1 {
		ck.Failf("w has shape %v, expected at least one group", w.Shape())
	}
	ck.Shape("c", c, tensor.Shape{m, n}, "(M, N) for a "+a.Shape().String()+" and w "+w.Shape().String())
	ck.apart("c", c, "a", a)
	ck.apart("c", c, "w", w)
	groupOffsets(ck, offsets, g)
	return g, m, n, k
}

// GroupedMatMulTN checks a (M, P), b (M, Q), c (G, P, Q) apart from a and
// b, all of one float dtype, and offsets (G+1) int32.
func GroupedMatMulTN(ck *Checker, c, a, b, offsets *tensor.Tensor) (g, m, p, q int) {
	ck.rows2("a", a, tensor.Invalid, -1)
	if ck.Failed() {
		return
	}
	ck.rows2("b", b, a.DType(), -1)
	ck.DType("c", c, a.DType())
	ck.Rank("c", c, 3, 3)
	if ck.Failed() {
		return
	}
	m, p, q, g = a.Dim(0), a.Dim(1), b.Dim(1), c.Dim(0)
	if b.Dim(0) != m {
		ck.Failf("b has shape %v, expected %d rows like a %v", b.Shape(), m, a.Shape())
	}
	if !ck.Failed() && g < 1 {
		ck.Failf("c has shape %v, expected at least one group", c.Shape())
	}
	ck.Shape("c", c, tensor.Shape{g, p, q}, "(G, P, Q) for a "+a.Shape().String()+" and b "+b.Shape().String())
	ck.apart("c", c, "a", a)
	ck.apart("c", c, "b", b)
	groupOffsets(ck, offsets, g)
	return g, m, p, q
}

// groupOffsets checks offsets (G+1) int32.
func groupOffsets(ck *Checker, offsets *tensor.Tensor, g int) {
	ck.DType("offsets", offsets, tensor.Int32)
	ck.Shape("offsets", offsets, tensor.Shape{g + 1}, fmt.Sprintf("(G + 1) for G = %d groups", g))
}

// OffsetsError describes the first entry of offsets (G+1) that breaks
// 0 ≤ offsets[0] ≤ … ≤ offsets[G] ≤ m, or returns "" when none does.
func OffsetsError(offsets []int32, m int) string {
	for i, v := range offsets {
		switch {
		case i == 0 && v < 0:
			return fmt.Sprintf("offsets[0] = %d, expected ≥ 0", v)
		case i > 0 && v < offsets[i-1]:
			return fmt.Sprintf("offsets[%d] = %d < offsets[%d] = %d, expected non-decreasing offsets", i, v, i-1, offsets[i-1])
		case int(v) > m:
			return fmt.Sprintf("offsets[%d] = %d, expected ≤ M = %d rows", i, v, m)
		}
	}
	return ""
}
