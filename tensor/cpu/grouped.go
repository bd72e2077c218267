package cpu

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

var _ tensor.GroupedGEMM = (*Backend)(nil)

// GroupedMatMul computes c[R_g] = alpha·a[R_g]·op(w[g]) + beta·c[R_g] for
// each group g of rows R_g = [offsets[g], offsets[g+1]) (see
// tensor.GroupedGEMM): one gonum GEMM per non-empty group, in one call.
func (bk *Backend) GroupedMatMul(c, a, w, offsets *tensor.Tensor, transW bool, alpha, beta float32) {
	ck := bk.check("GroupedMatMul")
	_, m, n, k := opcheck.GroupedMatMul(ck, c, a, w, offsets, transW)
	groupOffsets(ck, offsets, m)
	if !ck.OK() {
		return
	}
	off := offsets.I32()
	switch a.DType() {
	case tensor.Float32:
		groupedNN(off, c.F32(), a.F32(), w.F32(), n, k, transW, alpha, beta, gonum.Implementation{}.Sgemm)
	case tensor.Float64:
		groupedNN(off, c.F64(), a.F64(), w.F64(), n, k, transW, alpha, beta, gonum.Implementation{}.Dgemm)
	}
}

func groupedNN[T float](off []int32, c, a, w []T, n, k int, transW bool, alpha, beta float32, f gemmFunc[T]) {
	tB, ldb := blas.NoTrans, n
	if transW {
		tB, ldb = blas.Trans, k
	}
	for g := 0; g+1 < len(off); g++ {
		lo, hi := int(off[g]), int(off[g+1])
		if lo == hi {
			continue
		}
		cg := c[lo*n : hi*n]
		scaleInto(cg, beta)
		if n == 0 || k == 0 {
			continue
		}
		f(blas.NoTrans, tB, hi-lo, n, k, T(alpha), a[lo*k:hi*k], k, w[g*n*k:(g+1)*n*k], ldb, 1, cg, n)
	}
}

// GroupedMatMulTN computes c[g] = alpha·a[R_g]ᵀ·b[R_g] + beta·c[g] for each
// group g (see tensor.GroupedGEMM): one gonum GEMM per group, in one call.
func (bk *Backend) GroupedMatMulTN(c, a, b, offsets *tensor.Tensor, alpha, beta float32) {
	ck := bk.check("GroupedMatMulTN")
	_, m, p, q := opcheck.GroupedMatMulTN(ck, c, a, b, offsets)
	groupOffsets(ck, offsets, m)
	if !ck.OK() {
		return
	}
	off := offsets.I32()
	switch a.DType() {
	case tensor.Float32:
		groupedTN(off, c.F32(), a.F32(), b.F32(), p, q, alpha, beta, gonum.Implementation{}.Sgemm)
	case tensor.Float64:
		groupedTN(off, c.F64(), a.F64(), b.F64(), p, q, alpha, beta, gonum.Implementation{}.Dgemm)
	}
}

func groupedTN[T float](off []int32, c, a, b []T, p, q int, alpha, beta float32, f gemmFunc[T]) {
	for g := 0; g+1 < len(off); g++ {
		lo, hi := int(off[g]), int(off[g+1])
		cg := c[g*p*q : (g+1)*p*q]
		scaleInto(cg, beta)
		if lo == hi || p == 0 || q == 0 {
			continue
		}
		f(blas.Trans, blas.NoTrans, p, q, hi-lo, T(alpha), a[lo*p:hi*p], p, b[lo*q:hi*q], q, 1, cg, q)
	}
}

// scaleInto sets c = beta·c; beta = 0 clears c (NaN included).
func scaleInto[T float](c []T, beta float32) {
	switch beta {
	case 0:
		clear(c)
	case 1:
	default:
		for i := range c {
			c[i] *= T(beta)
		}
	}
}

// groupOffsets checks the values of a grouped GEMM's offsets against its m
// rows.
func groupOffsets(c *opcheck.Checker, offsets *tensor.Tensor, m int) {
	if c.Failed() {
		return
	}
	if msg := opcheck.OffsetsError(offsets.I32(), m); msg != "" {
		c.Failf("%s", msg)
	}
}
