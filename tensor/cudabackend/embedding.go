package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// embeddingFits checks N, V + 1 (the counts of the backward) and C against
// the kernels' sizes.
func embeddingFits(c *opcheck.Checker, n, v, cols int) {
	fits(c, "N", n)
	fits(c, "V", v+1)
	fits(c, "C", cols)
}

// badID explains a flagged id of op.
func badID(op string, table *tensor.Tensor) func(int32) error {
	shape := table.Shape().String()
	v := table.Dim(0)
	return func(id int32) error {
		return fmt.Errorf("cuda: %s: ids contain %d, outside [0, %d), the rows of table %s", op, id, v, shape)
	}
}

// Embedding sets out[n, :] = table[ids[n], :]. ids (N) int32, table (V, C),
// out (N, C) (ids may have more dimensions). An id outside [0, V) is found
// by the kernel and reported at the next Sync (its row is zeroed).
func (b *Backend) Embedding(out, table, ids *tensor.Tensor) {
	c := b.check("Embedding")
	n, v, cols := opcheck.Embedding(c, out, table, ids)
	embeddingFits(c, n, v, cols)
	if !c.OK() || n == 0 {
		return
	}
	b.do("Embedding", func(d gpu.Device) error {
		flag := b.flagPtr(flagEmbedding, badID("Embedding", table))
		return d.Launch("embedding_fwd"+sfx(table.DType()), rowGrid(n), gpu.D1(threads256), 0,
			ptr(out), ptr(table), ptr(ids), int32(n), int32(cols), int32(v), flag)
	})
}

// embeddingChunk is the rows of one id that one block of the backward sums
// (cuda/kernels/embedding.cu): long buckets are split so every block has
// about the same work.
const embeddingChunk = 64

// EmbeddingBackward adds dout's rows into dtable: dtable[ids[n], :] +=
// dout[n, :]. Deterministic: the tokens are grouped by id with a counting
// sort whose buckets are put in token order, and each id's rows are summed
// in fp32 in a fixed order: chunks of 64 in token order, then the
// chunks' sums in order (see cuda/kernels/embedding.cu).
func (b *Backend) EmbeddingBackward(dtable, dout, ids *tensor.Tensor) {
	c := b.check("EmbeddingBackward")
	n, v, cols := opcheck.EmbeddingBackward(c, dtable, dout, ids)
	embeddingFits(c, n, v, cols)
	if !c.OK() || n == 0 || cols == 0 {
		return
	}
	b.do("EmbeddingBackward", func(d gpu.Device) error {
		// One scratch block: counts (V+1), offsets (V+1), bucket (N), sorted (N).
		total := 2*(v+1) + 2*n
		s, size, err := b.scratch(tensor.Int32, total)
		if err != nil {
			return err
		}
		defer b.putScratch(s, size)
		counts := s
		offsets := s.Offset(4 * (v + 1))
		bucket := offsets.Offset(4 * (v + 1))
		sorted := bucket.Offset(4 * n)
		if err := d.Memset32(counts, 0, v+1); err != nil {
			return err
		}
		flag := b.flagPtr(flagEmbeddingBackward, badID("EmbeddingBackward", dtable))
		grid := b.gridStride(n, 1)
		block := gpu.D1(threads256)
		if err := d.Launch("emb_count", grid, block, 0, counts, ptr(ids), int32(n), int32(v), flag); err != nil {
			return err
		}
		if err := d.Launch("emb_scan", gpu.D1(1), gpu.D1(1024), 0, offsets, counts, int32(v)); err != nil {
			return err
		}
		if err := d.Launch("emb_scatter", grid, block, 0, bucket, counts, ptr(ids), offsets, int32(n), int32(v)); err != nil {
			return err
		}
		if err := d.Launch("emb_rank", grid, block, 0, sorted, bucket, ptr(ids), offsets, int32(n), int32(v)); err != nil {
			return err
		}
		partial, psize, err := b.scratch(tensor.Float32, n*cols)
		if err != nil {
			return err
		}
		defer b.putScratch(partial, psize)
		g2 := gpu.D2(n, ceilDiv(cols, 4*threads256))
		if err := d.Launch("embedding_bwd"+sfx(dtable.DType()), g2, block, 0,
			ptr(dtable), partial, ptr(dout), sorted, ptr(ids), offsets, int32(n), int32(cols), int32(v), int32(embeddingChunk)); err != nil {
			return err
		}
		return d.Launch("embedding_bwd_merge"+sfx(dtable.DType()), g2, block, 0,
			ptr(dtable), partial, sorted, ptr(ids), offsets, int32(n), int32(cols), int32(v), int32(embeddingChunk))
	})
}
