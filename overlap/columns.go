package overlap

import (
	"fmt"
	"github.com/asynctp/asynctp/comm"

	"github.com/asynctp/asynctp/tensor"
)

// ColumnCopier is an optional capability of a tensor.Backend, found by type
// assertion: a strided copy of a block of columns, one call for all rows (a
// GPU backend implements it with cudaMemcpy2DAsync or a small kernel).
// Splitting and gathering along the last dim use it when the backend has it.
type ColumnCopier interface {
	// CopyColumns copies columns [srcCol, srcCol+n) of src, viewed as
	// (R, Cs) with Cs its last dim, into columns [dstCol, dstCol+n) of dst,
	// viewed as (R, Cd). Same dtype; errors are sticky, as for every op.
	CopyColumns(dst *tensor.Tensor, dstCol int, src *tensor.Tensor, srcCol, n int)
}

// copyColumns copies columns [srcCol, srcCol+n) of src into columns
// [dstCol, dstCol+n) of dst, both seen as 2-D (rows, last dim). Three paths,
// fastest first:
//   - b is a ColumnCopier: one strided copy on the backend's stream;
//   - both tensors are in host memory with the same dtype: direct slice
//     copies, row by row;
//   - otherwise one b.Copy per row, on 1-row views (correct on any backend,
//     but R small copies: a GPU backend should implement ColumnCopier):
//     for i := range R { b.Copy(dst[i, dstCol:dstCol+n], src[i, srcCol:srcCol+n]) }
func copyColumns(b tensor.Backend, dst *tensor.Tensor, dstCol int, src *tensor.Tensor, srcCol, n int) error {
	rows, cd, err := as2D(dst)
	if err != nil {
		return err
	}
	srows, cs, err := as2D(src)
	if err != nil {
		return err
	}
	if rows != srows || dstCol < 0 || srcCol < 0 || n < 0 || dstCol+n > cd || srcCol+n > cs {
		return fmt.Errorf("copy columns [%d, %d) of %v into columns [%d, %d) of %v: expected the same rows and columns inside both",
			srcCol, srcCol+n, src, dstCol, dstCol+n, dst)
	}
	if n == 0 || rows == 0 {
		return nil
	}
	if cc, ok := b.(ColumnCopier); ok {
		cc.CopyColumns(dst, dstCol, src, srcCol, n)
		return nil
	}
	if dst.DType() == src.DType() {
		switch dst.DType() {
		case tensor.Float32:
			if d, s := dst.F32(), src.F32(); d != nil && s != nil {
				hostColumns(d, cd, dstCol, s, cs, srcCol, n, rows)
				return nil
			}
		case tensor.Float64:
			if d, s := dst.F64(), src.F64(); d != nil && s != nil {
				hostColumns(d, cd, dstCol, s, cs, srcCol, n, rows)
				return nil
			}
		case tensor.BFloat16:
			if d, s := dst.BF16(), src.BF16(); d != nil && s != nil {
				hostColumns(d, cd, dstCol, s, cs, srcCol, n, rows)
				return nil
			}
		case tensor.Int32:
			if d, s := dst.I32(), src.I32(); d != nil && s != nil {
				hostColumns(d, cd, dstCol, s, cs, srcCol, n, rows)
				return nil
			}
		}
	}
	for i := 0; i < rows; i++ {
		dv, err := dst.View(i*cd+dstCol, n)
		if err != nil {
			return err
		}
		sv, err := src.View(i*cs+srcCol, n)
		if err != nil {
			return err
		}
		b.Copy(dv, sv)
	}
	return nil
}

// hostColumns is the host path of copyColumns.
func hostColumns[T any](d []T, cd, dstCol int, s []T, cs, srcCol, n, rows int) {
	for i := 0; i < rows; i++ {
		copy(d[i*cd+dstCol:i*cd+dstCol+n], s[i*cs+srcCol:i*cs+srcCol+n])
	}
}

// as2D returns (rows, last dim) of t; a scalar is (1, 1).
func as2D(t *tensor.Tensor) (rows, cols int, err error) {
	if len(t.Shape()) == 0 {
		return 1, 1, nil
	}
	cols = t.Dim(-1)
	if cols == 0 {
		return 0, 0, nil
	}
	return t.Numel() / cols, cols, nil
}

// lastDimPart checks that part has the shape of whole with the last dim
// divided by p, and returns the width of a part.
func lastDimPart(c comm.Comm, op string, part, whole *tensor.Tensor) (int, error) {
	if part == nil || whole == nil {
		return 0, comm.Errorf(c, op, "expected two tensors, found %v and %v", part, whole)
	}
	p := c.Size()
	ws := whole.Shape()
	if len(ws) == 0 || ws[len(ws)-1]%p != 0 {
		return 0, comm.Errorf(c, op, "%v: expected a last dim divisible by the %d ranks", whole, p)
	}
	want := ws.Clone()
	want[len(want)-1] /= p
	if !part.Shape().Equal(want) || part.DType() != whole.DType() {
		return 0, comm.Errorf(c, op, "part %v of %v: expected %v%v (last dim / %d ranks)", part, whole, whole.DType(), want, p)
	}
	return want[len(want)-1], nil
}

// splitLastDim copies this rank's part of whole's last dim into part.
func splitLastDim(b tensor.Backend, c comm.Comm, op string, part, whole *tensor.Tensor) error {
	w, err := lastDimPart(c, op, part, whole)
	if err != nil {
		return err
	}
	if err := copyColumns(b, part, 0, whole, c.Rank()*w, w); err != nil {
		return comm.Errorf(c, op, "%w", err)
	}
	return nil
}

// allGatherLastDim gathers every rank's part into whole along the last dim:
// an all-gather along dim 0 into a scratch (P·R, w), then one column copy per
// rank. The scratch comes from b and is freed after the copies are queued.
func allGatherLastDim(b tensor.Backend, c comm.Comm, op string, whole, part *tensor.Tensor, s comm.Stream) error {
	w, err := lastDimPart(c, op, part, whole)
	if err != nil {
		return err
	}
	rows, _, _ := as2D(part)
	p := c.Size()
	part2, err := part.Reshape(rows, w)
	if err != nil {
		return comm.Errorf(c, op, "%w", err)
	}
	tmp := b.Zeros(part.DType(), p*rows, w)
	defer b.Free(tmp)
	wk, err := c.AllGather(tmp, part2, s)
	if err == nil {
		err = wk.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	for r := 0; r < p; r++ {
		src, err := tmp.Rows(r*rows, (r+1)*rows)
		if err != nil {
			return comm.Errorf(c, op, "%w", err)
		}
		if err := copyColumns(b, whole, r*w, src, 0, w); err != nil {
			return comm.Errorf(c, op, "%w", err)
		}
	}
	return nil
}
