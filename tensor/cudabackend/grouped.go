package cudabackend

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

var _ tensor.GroupedGEMM = (*Backend)(nil)

// groupedTile is the square output tile of the grouped GEMM kernels
// (grouped.cu): 64×64 per block of 256 threads.
const groupedTile = 64

// badOffsets explains a flagged offsets entry of op.
func badOffsets(op string, groups, m int) func(int32) error {
	return func(i int32) error {
		return fmt.Errorf("cuda: %s: offsets[%d] breaks 0 ≤ offsets[0] ≤ … ≤ offsets[%d] ≤ M = %d (offsets must be non-decreasing row offsets inside the %d rows)", op, i, groups, m, m)
	}
}

// gridFits checks a grid dimension against CUDA's limit for y and z.
func gridFits(c *opcheck.Checker, what string, n int) {
	if !c.Failed() && n > math.MaxUint16 {
		c.Failf("%s = %d blocks exceeds the grid's limit of %d", what, n, math.MaxUint16)
	}
}

// GroupedMatMul computes c[R_g] = alpha·a[R_g]·op(w[g]) + beta·c[R_g] for
// each group g of rows R_g = [offsets[g], offsets[g+1]) (see
// tensor.GroupedGEMM), in one launch. On the GEMM engine where it applies
// (groupedEngineFor: bf16, N and K multiples of 8, M ≥ 1, at most 1024
// groups, aligned tensors; see grouped_engine.go), else on the SIMT kernel:
// grid (ceil(M/64) + G, ceil(N/64)), each block finding its group's tile
// from the offsets on the device. Bad offsets are found by the kernel and
// reported at the next Sync.
func (b *Backend) GroupedMatMul(c, a, w, offsets *tensor.Tensor, transW bool, alpha, beta float32) {
	ck := b.check("GroupedMatMul")
	g, m, n, k := opcheck.GroupedMatMul(ck, c, a, w, offsets, transW)
	fits(ck, "M", m)
	fits(ck, "N", n)
	fits(ck, "K", k)
	fits(ck, "row tiles", ceilDiv(m, groupedTile)+g)
	gridFits(ck, "column tiles ceil(N/64)", ceilDiv(n, groupedTile))
	if !ck.OK() || n == 0 {
		return
	}
	if b.groupedEngineFor(c, a, w, offsets, false, transW) == nil {
		b.groupedLaunch("GroupedMatMul", groupedCall{c: c, a: a, b: w, offsets: offsets, transW: transW, g: g, m: m, n: n, k: k, alpha: alpha, beta: beta})
		return
	}
	b.do("GroupedMatMul", func(d gpu.Device) error {
		flag := b.flagPtr(flagGrouped, badOffsets("GroupedMatMul", g, m))
		return d.Launch("grouped_mm"+sfx(a.DType()), gpu.D2(ceilDiv(m, groupedTile)+g, ceilDiv(n, groupedTile)), gpu.D1(threads256), 0,
			ptr(c), ptr(a), ptr(w), ptr(offsets), int32(g), int32(m), int32(n), int32(k), b2i(transW), alpha, beta, flag)
	})
}

// GroupedMatMulTN computes c[g] = alpha·a[R_g]ᵀ·b[R_g] + beta·c[g] for each
// group g (see tensor.GroupedGEMM), in one launch. On the GEMM engine where
// it applies (bf16, P and Q multiples of 8, M ≥ 1, at most 1024 groups,
// aligned tensors), else on the SIMT kernel: grid (ceil(Q/64), ceil(P/64),
// G), each block summing its group's rows in order. Bad offsets are found
// by the kernel and reported at the next Sync.
func (b *Backend) GroupedMatMulTN(c, a, bm, offsets *tensor.Tensor, alpha, beta float32) {
	ck := b.check("GroupedMatMulTN")
	g, m, p, q := opcheck.GroupedMatMulTN(ck, c, a, bm, offsets)
	fits(ck, "M", m)
	fits(ck, "P·Q", p*q)
	fits(ck, "column tiles ceil(Q/64)", ceilDiv(q, groupedTile))
	gridFits(ck, "row tiles ceil(P/64)", ceilDiv(p, groupedTile))
	gridFits(ck, "groups G", g)
	if !ck.OK() || p == 0 || q == 0 {
		return
	}
	if b.groupedEngineFor(c, a, bm, offsets, true, false) == nil {
		b.groupedLaunch("GroupedMatMulTN", groupedCall{c: c, a: a, b: bm, offsets: offsets, tn: true, g: g, m: m, n: p, k: q, alpha: alpha, beta: beta})
		return
	}
	b.do("GroupedMatMulTN", func(d gpu.Device) error {
		flag := b.flagPtr(flagGrouped, badOffsets("GroupedMatMulTN", g, m))
		grid := gpu.Dim3{uint32(ceilDiv(q, groupedTile)), uint32(ceilDiv(p, groupedTile)), uint32(g)}
		return d.Launch("grouped_mm_tn"+sfx(a.DType()), grid, gpu.D1(threads256), 0,
			ptr(c), ptr(a), ptr(bm), ptr(offsets), int32(g), int32(m), int32(p), int32(q), alpha, beta, flag)
	})
}
