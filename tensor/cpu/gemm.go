package cpu

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// MatMul computes C = alpha·op(A)·op(B) + beta·C with gonum's Sgemm or Dgemm,
// for 2-D operands or 3-D ones with a shared leading batch dimension.
//
//	a (m, k), or (k, m) with transA
//	b (k, n), or (n, k) with transB
//	c (m, n)
//
// beta = 0 zeroes C first, so its old contents (even NaN) are ignored.
func (bk *Backend) MatMul(c, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	ck := bk.check("MatMul")
	batch, m, n, k := opcheck.MatMul(ck, c, a, b, transA, transB)
	if !ck.OK() {
		return
	}
	g := gemm{transA: transA, transB: transB, m: m, n: n, k: k, alpha: alpha, beta: beta}
	switch a.DType() {
	case tensor.Float32:
		runGemm(bk, g, batch, c.F32(), a.F32(), b.F32(), gonum.Implementation{}.Sgemm)
	case tensor.Float64:
		runGemm(bk, g, batch, c.F64(), a.F64(), b.F64(), gonum.Implementation{}.Dgemm)
	}
}

// gemm describes one (unbatched) product.
type gemm struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
}

type gemmFunc[T float] func(tA, tB blas.Transpose, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)

func runGemm[T float](bk *Backend, g gemm, batch int, c, a, b []T, f gemmFunc[T]) {
	tA, lda := blas.NoTrans, g.k
	if g.transA {
		tA, lda = blas.Trans, g.m
	}
	tB, ldb := blas.NoTrans, g.n
	if g.transB {
		tB, ldb = blas.Trans, g.k
	}
	sa, sb, sc := g.m*g.k, g.k*g.n, g.m*g.n
	one := func(i int) {
		ci := c[i*sc : (i+1)*sc]
		if g.beta == 0 {
			clear(ci)
		}
		if g.m == 0 || g.n == 0 {
			return
		}
		if g.k == 0 { // op(A)·op(B) is zero: C = beta·C
			for j := range ci {
				ci[j] *= T(g.beta)
			}
			return
		}
		f(tA, tB, g.m, g.n, g.k, T(g.alpha), a[i*sa:(i+1)*sa], lda, b[i*sb:(i+1)*sb], ldb, T(g.beta), ci, g.n)
	}
	// gonum parallelises a product whose C has several 64×64 blocks; smaller
	// products of a batch run side by side, one product per goroutine.
	if batch > 1 && g.m*g.n <= 128*128 {
		bk.parallelFor(batch, g.m*g.n*g.k, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				one(i)
			}
		})
		return
	}
	for i := range batch {
		one(i)
	}
}
