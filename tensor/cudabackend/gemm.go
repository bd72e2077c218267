package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
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
// beta = 0 ignores C's old contents (even NaN). With
// WithGEMMEngine(GEMMAsyncTP) the 2-D bf16 calls the GEMM engine applies to
// run on it instead (gemm_engine.go).
func (b *Backend) MatMul(c, a, bm *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	ck := b.check("MatMul")
	batch, m, n, k := opcheck.MatMul(ck, c, a, bm, transA, transB)
	if !ck.OK() {
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
	if b.useEngine(c, a, bm, transA, transB, batch) {
		b.engineLaunch("MatMul", engineCall{c: c, a: a, b: bm, transA: transA, transB: transB, m: m, n: n, k: k, alpha: alpha, beta: beta})
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
