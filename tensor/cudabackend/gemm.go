package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// MatMul computes C = alpha·op(A)·op(B) + beta·C with cuBLASLt, for 2-D
// operands or 3-D ones with a shared leading batch dimension (strided
// batched GEMM). A, B and C share one dtype: BFloat16 (fp32 accumulation,
// bf16 output) or Float32 (exact fp32, no TF32).
//
//	a (m, k), or (k, m) with transA
//	b (k, n), or (n, k) with transB
//	c (m, n)
//
// beta = 0 ignores C's old contents (even NaN).
func (b *Backend) MatMul(c, a, bm *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	ck := b.check("MatMul")
	ck.float("a", a)
	ck.rank("a", a, 2, 3)
	if !ck.ok() {
		return
	}
	ck.dtype("b", bm, a.DType())
	ck.dtype("c", c, a.DType())
	ck.rank("b", bm, len(a.Shape()), len(a.Shape()))
	ck.rank("c", c, len(a.Shape()), len(a.Shape()))
	if !ck.ok() {
		return
	}
	sa, sb := a.Shape(), bm.Shape()
	batch := 1
	if len(sa) == 3 {
		batch = sa[0]
		if sb[0] != batch || c.Dim(0) != batch {
			ck.failf("batch dimensions of a %v, b %v and c %v differ", sa, sb, c.Shape())
		}
		sa, sb = sa[1:], sb[1:]
	}
	m, k := sa[0], sa[1]
	if transA {
		m, k = k, m
	}
	kb, n := sb[0], sb[1]
	if transB {
		kb, n = n, kb
	}
	if kb != k {
		ck.failf("b has shape %v, expected inner dimension %d (transB %v) to match a %v (transA %v)", bm.Shape(), k, transB, a.Shape(), transA)
	}
	want := tensor.Shape{m, n}
	if len(a.Shape()) == 3 {
		want = tensor.Shape{batch, m, n}
	}
	ck.shape("c", c, want, "for a "+a.Shape().String()+" and b "+bm.Shape().String())
	if !ck.ok() {
		return
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	if k == 0 { // C = beta·C (cuBLASLt refuses K = 0)
		if beta == 0 {
			b.Fill(c, 0)
		} else {
			b.Scale(c, c, beta)
		}
		return
	}
	typ := gpu.BF16
	if a.DType() == tensor.Float32 {
		typ = gpu.F32
	}
	g := gpu.Gemm{
		TransA: transA, TransB: transB,
		M: m, N: n, K: k, Batch: batch,
		Alpha: alpha, Beta: beta,
		A: ptr(a), B: ptr(bm), C: ptr(c),
		Type: typ,
	}
	b.do("MatMul", func(d gpu.Device) error { return d.Gemm(g) })
}
