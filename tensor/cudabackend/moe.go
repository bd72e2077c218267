package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

var _ tensor.MoEOps = (*Backend)(nil)

// rows2 checks a 2-D float tensor t with cols columns (cols < 0: any) and
// dtype dt (Invalid: bf16 or f32).
func (c *checker) rows2(name string, t *tensor.Tensor, dt tensor.DType, cols int) {
	if dt == tensor.Invalid {
		c.float(name, t)
	} else {
		c.dtype(name, t, dt)
	}
	c.rank(name, t, 2, 2)
	if !c.failed() && cols >= 0 && t.Dim(1) != cols {
		c.failf("%s has shape %v, expected %d columns", name, t.Shape(), cols)
	}
}

// apart fails when two tensors share storage.
func (c *checker) apart(nameA string, a *tensor.Tensor, nameB string, b *tensor.Tensor) {
	if c.failed() || a.Buffer() != b.Buffer() {
		return
	}
	if a.Offset() < b.Offset()+b.Numel() && b.Offset() < a.Offset()+a.Numel() {
		c.failf("%s overlaps %s, expected separate storage", nameA, nameB)
	}
}

// badIndex explains a flagged index of op.
func badIndex(op, name string, limit int) func(int32) error {
	return func(v int32) error {
		return fmt.Errorf("cuda: %s: %s contains %d, expected a value < %d (or negative to skip)", op, name, v, limit)
	}
}

func b2i(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// TopK writes the K largest values of each row of x (N, E) into vals (N, K),
// largest first, and their columns into idx (N, K) int32; ties go to the
// lower column. With normalize each row of vals is divided by its sum. One
// warp per row.
func (b *Backend) TopK(vals, idx, x *tensor.Tensor, normalize bool) {
	c := b.check("TopK")
	c.float("x", x)
	c.rank("x", x, 2, 2)
	if !c.failed() {
		c.dtype("vals", vals, x.DType())
	}
	c.rank("vals", vals, 2, 2)
	var n, e, k int
	if !c.failed() {
		n, e, k = x.Dim(0), x.Dim(1), vals.Dim(1)
		c.shape("vals", vals, tensor.Shape{n, k}, "(N, K) for x "+x.Shape().String())
		if !c.failed() && (k < 1 || k > e) {
			c.failf("vals has shape %v: K = %d, expected 1 ≤ K ≤ E = %d", vals.Shape(), k, e)
		}
		c.dtype("idx", idx, tensor.Int32)
		c.shape("idx", idx, vals.Shape(), "like vals")
		c.fits("N", n)
		c.fits("E", e)
	}
	if !c.ok() || n == 0 {
		return
	}
	b.launch("TopK", "topk"+sfx(x.DType()), rowGrid(n), gpu.D1(threads256), 0,
		ptr(vals), ptr(idx), ptr(x), int32(n), int32(e), int32(k), b2i(normalize))
}

// TopKBackward writes dx (N, E), overwritten: zero except at the selected
// columns, which receive dvals (N, K), through the renormalisation when
// normalize. An idx ≥ E is found by the kernel and reported at the next Sync.
func (b *Backend) TopKBackward(dx, dvals, vals, idx, x *tensor.Tensor, normalize bool) {
	c := b.check("TopKBackward")
	c.float("x", x)
	c.rank("x", x, 2, 2)
	c.like("dx", dx, "x", x)
	c.float("vals", vals)
	c.rank("vals", vals, 2, 2)
	if !c.failed() {
		c.shape("vals", vals, tensor.Shape{x.Dim(0), vals.Dim(1)}, "(N, K) for x "+x.Shape().String())
	}
	c.like("dvals", dvals, "vals", vals)
	if !c.failed() && vals.DType() != x.DType() {
		c.failf("vals is %v, expected dtype %v like x", vals, x.DType())
	}
	c.dtype("idx", idx, tensor.Int32)
	if !c.failed() {
		c.shape("idx", idx, vals.Shape(), "like vals")
		c.fits("N", x.Dim(0))
		c.fits("E", x.Dim(1))
	}
	if !c.ok() || x.Dim(0) == 0 {
		return
	}
	n, e, k := x.Dim(0), x.Dim(1), vals.Dim(1)
	b.do("TopKBackward", func(d gpu.Device) error {
		flag := b.flagPtr(flagTopKBackward, badIndex("TopKBackward", "idx", e))
		return d.Launch("topk_bwd"+sfx(x.DType()), rowGrid(n), gpu.D1(threads256), 0,
			ptr(dx), ptr(dvals), ptr(vals), ptr(idx), ptr(x), int32(n), int32(e), int32(k), b2i(normalize), flag)
	})
}

// GatherRows sets dst[i, :] = scale[i]·src[idx[i], :] for dst (M, C), src
// (R, C), idx (M) int32, scale (M) or nil; a negative idx gives a zero row,
// an idx ≥ R is found by the kernel and reported at the next Sync. One warp
// per row.
func (b *Backend) GatherRows(dst, src, idx, scale *tensor.Tensor) {
	c := b.check("GatherRows")
	c.rows2("src", src, tensor.Invalid, -1)
	if !c.failed() {
		c.rows2("dst", dst, src.DType(), src.Dim(1))
		c.apart("dst", dst, "src", src)
	}
	c.dtype("idx", idx, tensor.Int32)
	if !c.failed() {
		c.shape("idx", idx, tensor.Shape{dst.Dim(0)}, "(M) for dst "+dst.Shape().String())
	}
	if scale != nil && !c.failed() {
		c.dtype("scale", scale, src.DType())
		c.shape("scale", scale, tensor.Shape{dst.Dim(0)}, "(M) for dst "+dst.Shape().String())
	}
	if !c.failed() {
		c.fits("M", dst.Dim(0))
		c.fits("R", src.Dim(0))
		c.fits("C", src.Dim(1))
	}
	if !c.ok() || dst.Dim(0) == 0 {
		return
	}
	m, r, cols := dst.Dim(0), src.Dim(0), src.Dim(1)
	b.do("GatherRows", func(d gpu.Device) error {
		flag := b.flagPtr(flagGatherRows, badIndex("GatherRows", "idx", r))
		return d.Launch("gather_rows"+sfx(src.DType()), rowGrid(m), gpu.D1(threads256), 0,
			ptr(dst), ptr(src), ptr(idx), ptr(scale), int32(m), int32(r), int32(cols), flag)
	})
}

// checkCombine validates out-like (N, C), src-like (M, C), pos (N, K) and
// weights (N, K) or nil.
func checkCombine(c *checker, outName string, out *tensor.Tensor, srcName string, src, pos, weights *tensor.Tensor) {
	c.rows2(srcName, src, tensor.Invalid, -1)
	if c.failed() {
		return
	}
	c.rows2(outName, out, src.DType(), src.Dim(1))
	c.dtype("pos", pos, tensor.Int32)
	c.rank("pos", pos, 2, 2)
	if c.failed() {
		return
	}
	c.shape("pos", pos, tensor.Shape{out.Dim(0), pos.Dim(1)}, "(N, K) for "+outName+" "+out.Shape().String())
	if weights != nil {
		c.dtype("weights", weights, src.DType())
		c.shape("weights", weights, pos.Shape(), "like pos")
	}
	c.fits("N·K", pos.Numel())
	c.fits("M", src.Dim(0))
	c.fits("C", src.Dim(1))
}

// CombineRows sets out[n, :] = Σ_j weights[n, j]·src[pos[n, j], :]
// (overwritten; weights nil means 1), skipping negative positions; a
// position ≥ M is found by the kernel and reported at the next Sync. One
// warp per token, the K slots summed in order in fp32.
func (b *Backend) CombineRows(out, src, pos, weights *tensor.Tensor) {
	c := b.check("CombineRows")
	checkCombine(c, "out", out, "src", src, pos, weights)
	if !c.failed() {
		c.apart("out", out, "src", src)
	}
	if !c.ok() || out.Dim(0) == 0 {
		return
	}
	n, k, m, cols := out.Dim(0), pos.Dim(1), src.Dim(0), src.Dim(1)
	b.do("CombineRows", func(d gpu.Device) error {
		flag := b.flagPtr(flagCombineRows, badIndex("CombineRows", "pos", m))
		return d.Launch("combine_rows"+sfx(src.DType()), rowGrid(n), gpu.D1(threads256), 0,
			ptr(out), ptr(src), ptr(pos), ptr(weights), int32(n), int32(k), int32(m), int32(cols), flag)
	})
}

// CombineRowsBackward sets dsrc (M, C), overwritten, to dsrc[pos[n, j], :] =
// weights[n, j]·dout[n, :] (rows no slot refers to are zero), and dweights
// (N, K), if not nil, to ⟨dout[n, :], src[pos[n, j], :]⟩ (0 for skipped
// slots). The non-negative positions must be distinct: a repeated one (or
// one ≥ M) is found by the kernel and reported at the next Sync.
func (b *Backend) CombineRowsBackward(dsrc, dweights, dout, src, pos, weights *tensor.Tensor) {
	c := b.check("CombineRowsBackward")
	checkCombine(c, "dout", dout, "src", src, pos, weights)
	if !c.failed() {
		c.like("dsrc", dsrc, "src", src)
		c.apart("dsrc", dsrc, "dout", dout)
		c.apart("dsrc", dsrc, "src", src)
	}
	if dweights != nil && !c.failed() {
		c.dtype("dweights", dweights, src.DType())
		c.shape("dweights", dweights, pos.Shape(), "like pos")
	}
	if !c.ok() {
		return
	}
	n, k, m, cols := dout.Dim(0), pos.Dim(1), src.Dim(0), src.Dim(1)
	b.do("CombineRowsBackward", func(d gpu.Device) error {
		if err := d.Memset8(ptr(dsrc), 0, dsrc.Bytes()); err != nil {
			return err
		}
		if n*k == 0 {
			return nil
		}
		claim, size, err := b.scratch(tensor.Int32, m)
		if err != nil {
			return err
		}
		defer b.putScratch(claim, size)
		if err := d.Memset32(claim, 0, max(m, 1)); err != nil {
			return err
		}
		flag := b.flagPtr(flagCombineRowsBackward, func(p int32) error {
			return fmt.Errorf("cuda: CombineRowsBackward: pos contains %d: a row ≥ M = %d, or one that another slot uses too (positions must be distinct)", p, m)
		})
		return d.Launch("combine_rows_bwd"+sfx(src.DType()), rowGrid(n*k), gpu.D1(threads256), 0,
			ptr(dsrc), ptr(dweights), ptr(dout), ptr(src), ptr(pos), ptr(weights),
			int32(n), int32(k), int32(m), int32(cols), claim, flag)
	})
}

// checkLSE validates x (N, E) and a side vector (N) Float32.
func checkLSE(c *checker, x *tensor.Tensor, name string, v *tensor.Tensor) {
	c.rows2("x", x, tensor.Invalid, -1)
	if c.failed() {
		return
	}
	c.dtype(name, v, tensor.Float32)
	c.shape(name, v, tensor.Shape{x.Dim(0)}, "(N) for x "+x.Shape().String())
	c.fits("N", x.Dim(0))
	c.fits("E", x.Dim(1))
}

// LogSumExp writes lse[n] = log Σ_e exp(x[n, e]) (fp32, max-subtracted) for
// x (N, E), lse (N) Float32. One warp per row.
func (b *Backend) LogSumExp(lse, x *tensor.Tensor) {
	c := b.check("LogSumExp")
	checkLSE(c, x, "lse", lse)
	if !c.ok() || x.Dim(0) == 0 {
		return
	}
	b.launch("LogSumExp", "logsumexp"+sfx(x.DType()), rowGrid(x.Dim(0)), gpu.D1(threads256), 0,
		ptr(lse), ptr(x), int32(x.Dim(0)), int32(x.Dim(1)))
}

// LogSumExpBackward writes dx (N, E), overwritten, as
// dx[n, e] = dlse[n]·exp(x[n, e] − lse[n]); dlse and lse are Float32.
func (b *Backend) LogSumExpBackward(dx, dlse, x, lse *tensor.Tensor) {
	c := b.check("LogSumExpBackward")
	checkLSE(c, x, "lse", lse)
	if !c.failed() {
		c.like("dx", dx, "x", x)
		c.like("dlse", dlse, "lse", lse)
	}
	if !c.ok() || x.Dim(0) == 0 {
		return
	}
	b.launch("LogSumExpBackward", "logsumexp_bwd"+sfx(x.DType()), rowGrid(x.Dim(0)), gpu.D1(threads256), 0,
		ptr(dx), ptr(dlse), ptr(x), ptr(lse), int32(x.Dim(0)), int32(x.Dim(1)))
}

// RoutingPlan computes an MoE routing plan on the GPU, without a round trip
// to the host: the device version of layers.NewRoutingPlan (without the
// capacity used by earlier ranks). From idx (N, K) int32, each token's K
// distinct experts in [0, E), it writes
//
//	routed (E) int32   slots routed to each expert
//	offsets (E+1) int32 the rows of expert e are [offsets[e], offsets[e+1]);
//	                    offsets[E] = M, the kept slots
//	pos (N, K) int32   the row of each slot, −1 when dropped
//	tok (N·K) int32    the token of each row (the GatherRows index), −1 past M
//
// Rows of one expert keep the slots' order (s = n·K + j). capacity > 0 keeps
// the first capacity slots of each expert; 0 keeps all. A choice outside
// [0, E), or an expert chosen twice by a token, is found by the kernel and
// reported at the next Sync.
func (b *Backend) RoutingPlan(tok, pos, routed, offsets, idx *tensor.Tensor, experts, capacity int) {
	c := b.check("RoutingPlan")
	c.dtype("idx", idx, tensor.Int32)
	c.rank("idx", idx, 2, 2)
	if !c.failed() {
		c.dtype("pos", pos, tensor.Int32)
		c.shape("pos", pos, idx.Shape(), "like idx")
		c.dtype("tok", tok, tensor.Int32)
		c.shape("tok", tok, tensor.Shape{idx.Numel()}, "(N·K) for idx "+idx.Shape().String())
		c.dtype("routed", routed, tensor.Int32)
		c.shape("routed", routed, tensor.Shape{experts}, "(E)")
		c.dtype("offsets", offsets, tensor.Int32)
		c.shape("offsets", offsets, tensor.Shape{experts + 1}, "(E + 1)")
		c.fits("N·K", idx.Numel())
	}
	if !c.failed() && (experts < 1 || capacity < 0) {
		c.failf("%d experts, capacity %d: expected E ≥ 1 and capacity ≥ 0", experts, capacity)
	}
	if !c.ok() {
		return
	}
	n, k := idx.Dim(0), idx.Dim(1)
	b.do("RoutingPlan", func(d gpu.Device) error {
		kept, size, err := b.scratch(tensor.Int32, experts)
		if err != nil {
			return err
		}
		defer b.putScratch(kept, size)
		if err := d.Launch("moe_count", gpu.D1(experts), gpu.D1(threads256), 0,
			ptr(routed), kept, ptr(idx), int32(n*k), int32(experts), int32(capacity)); err != nil {
			return err
		}
		flag := b.flagPtr(flagRouting, func(v int32) error {
			return fmt.Errorf("cuda: RoutingPlan: idx contains expert %d outside [0, %d), or one chosen twice by a token", v, experts)
		})
		return d.Launch("moe_index", gpu.D1(experts), gpu.D1(threads256), 0,
			ptr(tok), ptr(pos), ptr(offsets), kept, ptr(idx), int32(n), int32(k), int32(experts), int32(capacity), flag)
	})
}
