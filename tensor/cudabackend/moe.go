package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

var _ tensor.MoEOps = (*Backend)(nil)

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
	n, e, k := opcheck.TopK(c, vals, idx, x)
	fits(c, "N", n)
	fits(c, "E", e)
	if !c.OK() || n == 0 {
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
	n, e, k := opcheck.TopKBackward(c, dx, dvals, vals, idx, x)
	fits(c, "N", n)
	fits(c, "E", e)
	if !c.OK() || n == 0 {
		return
	}
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
	m, r, cols := opcheck.GatherRows(c, dst, src, idx, scale)
	fits(c, "M", m)
	fits(c, "R", r)
	fits(c, "C", cols)
	if !c.OK() || m == 0 {
		return
	}
	b.do("GatherRows", func(d gpu.Device) error {
		flag := b.flagPtr(flagGatherRows, badIndex("GatherRows", "idx", r))
		return d.Launch("gather_rows"+sfx(src.DType()), rowGrid(m), gpu.D1(threads256), 0,
			ptr(dst), ptr(src), ptr(idx), ptr(scale), int32(m), int32(r), int32(cols), flag)
	})
}

// combineFits checks N·K, M and C against the kernels' sizes.
func combineFits(c *opcheck.Checker, n, k, m, cols int) {
	fits(c, "N·K", n*k)
	fits(c, "M", m)
	fits(c, "C", cols)
}

// CombineRows sets out[n, :] = Σ_j weights[n, j]·src[pos[n, j], :]
// (overwritten; weights nil means 1), skipping negative positions; a
// position ≥ M is found by the kernel and reported at the next Sync. One
// warp per token, the K slots summed in order in fp32.
func (b *Backend) CombineRows(out, src, pos, weights *tensor.Tensor) {
	c := b.check("CombineRows")
	n, k, m, cols := opcheck.CombineRows(c, out, src, pos, weights)
	combineFits(c, n, k, m, cols)
	if !c.OK() || n == 0 {
		return
	}
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
	n, k, m, cols := opcheck.CombineRowsBackward(c, dsrc, dweights, dout, src, pos, weights)
	combineFits(c, n, k, m, cols)
	if !c.OK() {
		return
	}
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

// LogSumExp writes lse[n] = log Σ_e exp(x[n, e]) (fp32, max-subtracted) for
// x (N, E), lse (N) Float32. One warp per row.
func (b *Backend) LogSumExp(lse, x *tensor.Tensor) {
	c := b.check("LogSumExp")
	n, e := opcheck.LogSumExp(c, lse, x)
	rowsFit(c, n, e)
	if !c.OK() || n == 0 {
		return
	}
	b.launch("LogSumExp", "logsumexp"+sfx(x.DType()), rowGrid(n), gpu.D1(threads256), 0,
		ptr(lse), ptr(x), int32(n), int32(e))
}

// LogSumExpBackward writes dx (N, E), overwritten, as
// dx[n, e] = dlse[n]·exp(x[n, e] − lse[n]); dlse and lse are Float32.
func (b *Backend) LogSumExpBackward(dx, dlse, x, lse *tensor.Tensor) {
	c := b.check("LogSumExpBackward")
	n, e := opcheck.LogSumExpBackward(c, dx, dlse, x, lse)
	rowsFit(c, n, e)
	if !c.OK() || n == 0 {
		return
	}
	b.launch("LogSumExpBackward", "logsumexp_bwd"+sfx(x.DType()), rowGrid(n), gpu.D1(threads256), 0,
		ptr(dx), ptr(dlse), ptr(x), ptr(lse), int32(n), int32(e))
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
	c.DType("idx", idx, tensor.Int32)
	c.Rank("idx", idx, 2, 2)
	if !c.Failed() {
		c.DType("pos", pos, tensor.Int32)
		c.Shape("pos", pos, idx.Shape(), "like idx")
		c.DType("tok", tok, tensor.Int32)
		c.Shape("tok", tok, tensor.Shape{idx.Numel()}, "(N·K) for idx "+idx.Shape().String())
		c.DType("routed", routed, tensor.Int32)
		c.Shape("routed", routed, tensor.Shape{experts}, "(E)")
		c.DType("offsets", offsets, tensor.Int32)
		c.Shape("offsets", offsets, tensor.Shape{experts + 1}, "(E + 1)")
		fits(c, "N·K", idx.Numel())
	}
	if !c.Failed() && (experts < 1 || capacity < 0) {
		c.Failf("%d experts, capacity %d: expected E ≥ 1 and capacity ≥ 0", experts, capacity)
	}
	if !c.OK() {
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
