package cpu

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// Add sets dst = a + b; all three have the same shape and dtype. dst may
// alias a or b.
func (bk *Backend) Add(dst, a, b *tensor.Tensor) {
	if !bk.elementwise("Add", []string{"a", "b", "dst"}, a, b, dst) {
		return
	}
	switch a.DType() {
	case tensor.Float32:
		add(bk, dst.F32(), a.F32(), b.F32())
	case tensor.Float64:
		add(bk, dst.F64(), a.F64(), b.F64())
	}
}

func add[T float](bk *Backend, dst, a, b []T) {
	bk.parallelFor(len(dst), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst[i] = a[i] + b[i]
		}
	})
}

// Scale sets dst = s·a. dst may alias a.
func (bk *Backend) Scale(dst, a *tensor.Tensor, s float32) {
	if !bk.elementwise("Scale", []string{"a", "dst"}, a, dst) {
		return
	}
	switch a.DType() {
	case tensor.Float32:
		scale(bk, dst.F32(), a.F32(), s)
	case tensor.Float64:
		scale(bk, dst.F64(), a.F64(), float64(s))
	}
}

func scale[T float](bk *Backend, dst, a []T, s T) {
	bk.parallelFor(len(dst), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			dst[i] = s * a[i]
		}
	})
}

// Axpy sets y += alpha·x. y may alias x.
func (bk *Backend) Axpy(y *tensor.Tensor, alpha float32, x *tensor.Tensor) {
	if !bk.elementwise("Axpy", []string{"x", "y"}, x, y) {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		axpy(bk, y.F32(), alpha, x.F32())
	case tensor.Float64:
		axpy(bk, y.F64(), float64(alpha), x.F64())
	}
}

func axpy[T float](bk *Backend, y []T, alpha T, x []T) {
	bk.parallelFor(len(y), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y[i] += alpha * x[i]
		}
	})
}

// AddBias adds bias (C) to every row of x (N, C) (x may have more leading
// dimensions).
func (bk *Backend) AddBias(x, bias *tensor.Tensor) {
	c := bk.check("AddBias")
	n, cols := opcheck.RowsVec(c, x, "bias", bias)
	if !c.OK() {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		addBias(bk, x.F32(), bias.F32(), n, cols)
	case tensor.Float64:
		addBias(bk, x.F64(), bias.F64(), n, cols)
	}
}

func addBias[T float](bk *Backend, x, bias []T, n, cols int) {
	bk.parallelFor(n, cols, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := x[r*cols : (r+1)*cols]
			for j, v := range bias {
				row[j] += v
			}
		}
	})
}

// SumRows adds the sum of the rows of x (N, C) to dst (C): the bias gradient.
func (bk *Backend) SumRows(dst, x *tensor.Tensor) {
	c := bk.check("SumRows")
	n, cols := opcheck.RowsVec(c, x, "dst", dst)
	if !c.OK() {
		return
	}
	switch x.DType() {
	case tensor.Float32:
		sumRows(bk, dst.F32(), x.F32(), n, cols)
	case tensor.Float64:
		sumRows(bk, dst.F64(), x.F64(), n, cols)
	}
}

// sumRows splits the columns between goroutines; each column is summed over
// the rows in order, so the result does not depend on the split.
func sumRows[T float](bk *Backend, dst, x []T, n, cols int) {
	bk.parallelFor(cols, n, func(lo, hi int) {
		acc := make([]T, hi-lo)
		for r := range n {
			row := x[r*cols+lo : r*cols+hi]
			for j, v := range row {
				acc[j] += v
			}
		}
		for j, v := range acc {
			dst[lo+j] += v
		}
	})
}
