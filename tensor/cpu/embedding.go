package cpu

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// checkIDs checks that every id is in [0, V), the rows of table.
func checkIDs(c *opcheck.Checker, tableName string, table, ids *tensor.Tensor) {
	if c.Failed() {
		return
	}
	v := table.Dim(0)
	for i, id := range ids.I32() {
		if id < 0 || int(id) >= v {
			c.Failf("ids[%d] = %d is outside [0, %d), the rows of %s %v", i, id, v, tableName, table.Shape())
			return
		}
	}
}

// Embedding sets out[n, :] = table[ids[n], :]. ids (N) int32, table (V, C),
// out (N, C); ids may have more dimensions, out has ids' shape and then C.
func (bk *Backend) Embedding(out, table, ids *tensor.Tensor) {
	c := bk.check("Embedding")
	_, _, cols := opcheck.Embedding(c, out, table, ids)
	checkIDs(c, "table", table, ids)
	if !c.OK() {
		return
	}
	switch table.DType() {
	case tensor.Float32:
		embedding(bk, out.F32(), table.F32(), ids.I32(), cols)
	case tensor.Float64:
		embedding(bk, out.F64(), table.F64(), ids.I32(), cols)
	}
}

func embedding[T float](bk *Backend, out, table []T, ids []int32, cols int) {
	bk.parallelFor(len(ids), cols, func(lo, hi int) {
		for n := lo; n < hi; n++ {
			id := int(ids[n])
			copy(out[n*cols:(n+1)*cols], table[id*cols:(id+1)*cols])
		}
	})
}

// EmbeddingBackward accumulates dtable[ids[n], :] += dout[n, :]. Repeated ids
// add up in the order of n.
func (bk *Backend) EmbeddingBackward(dtable, dout, ids *tensor.Tensor) {
	c := bk.check("EmbeddingBackward")
	_, _, cols := opcheck.EmbeddingBackward(c, dtable, dout, ids)
	checkIDs(c, "dtable", dtable, ids)
	if !c.OK() {
		return
	}
	switch dtable.DType() {
	case tensor.Float32:
		embeddingBackward(bk, dtable.F32(), dout.F32(), ids.I32(), cols)
	case tensor.Float64:
		embeddingBackward(bk, dtable.F64(), dout.F64(), ids.I32(), cols)
	}
}

// embeddingBackward splits the columns between goroutines, so repeated ids
// never race and each column adds up in the order of n.
func embeddingBackward[T float](bk *Backend, dtable, dout []T, ids []int32, cols int) {
	bk.parallelFor(cols, len(ids), func(lo, hi int) {
		for n, id := range ids {
			dst := dtable[int(id)*cols+lo : int(id)*cols+hi]
			for j, v := range dout[n*cols+lo : n*cols+hi] {
				dst[j] += v
			}
		}
	})
}
