// Package hostops is the host-side data movement and reduction that the
// transports of host tensors (comm/local, comm/tcp) share: copying elements
// between tensors, and reductions that accumulate in float64 in a fixed
// order (rank 0 first) and round once to the dtype, so that every rank gets
// bit-identical results.
//
// The tensors are host tensors whose dtypes and shapes the comm.Check
// functions have already matched.
package hostops

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// CopyElems copies n elements of src from sOff to dst at dOff (same dtype).
func CopyElems(dst *tensor.Tensor, dOff int, src *tensor.Tensor, sOff, n int) {
	if n == 0 {
		return
	}
	switch dst.DType() {
	case tensor.Float32:
		copy(dst.F32()[dOff:dOff+n], src.F32()[sOff:sOff+n])
	case tensor.Float64:
		copy(dst.F64()[dOff:dOff+n], src.F64()[sOff:sOff+n])
	case tensor.Int32:
		copy(dst.I32()[dOff:dOff+n], src.I32()[sOff:sOff+n])
	case tensor.BFloat16:
		copy(dst.BF16()[dOff:dOff+n], src.BF16()[sOff:sOff+n])
	}
}

// Widen returns elements [off, off+n) of t as float64.
func Widen(t *tensor.Tensor, off, n int) []float64 {
	out := make([]float64, n)
	switch t.DType() {
	case tensor.Float32:
		for i, v := range t.F32()[off : off+n] {
			out[i] = float64(v)
		}
	case tensor.Float64:
		copy(out, t.F64()[off:off+n])
	case tensor.Int32:
		for i, v := range t.I32()[off : off+n] {
			out[i] = float64(v)
		}
	case tensor.BFloat16:
		for i, v := range t.BF16()[off : off+n] {
			out[i] = float64(tensor.BF16ToFloat32(v))
		}
	}
	return out
}

// Accumulate folds v into acc (first: acc = v).
func Accumulate(acc, v []float64, first bool, op comm.ReduceOp) {
	if first {
		copy(acc, v)
		return
	}
	for i := range acc {
		if op == comm.Max {
			acc[i] = math.Max(acc[i], v[i])
		} else {
			acc[i] += v[i]
		}
	}
}

// Finish divides by the number of ranks for Avg.
func Finish(acc []float64, op comm.ReduceOp, ranks int) {
	if op == comm.Avg {
		for i := range acc {
			acc[i] /= float64(ranks)
		}
	}
}

// Reduce returns the reduction of elements [off, off+n) of every tensor, in
// order, in float64 (Avg already divided).
func Reduce(ts []*tensor.Tensor, off, n int, op comm.ReduceOp) []float64 {
	acc := make([]float64, n)
	for k, t := range ts {
		Accumulate(acc, Widen(t, off, n), k == 0, op)
	}
	Finish(acc, op, len(ts))
	return acc
}

// Narrow rounds acc to t's dtype (bf16 through float32) into t.
func Narrow(t *tensor.Tensor, acc []float64) {
	switch t.DType() {
	case tensor.Float32:
		d := t.F32()
		for i, v := range acc {
			d[i] = float32(v)
		}
	case tensor.Float64:
		copy(t.F64(), acc)
	case tensor.Int32:
		d := t.I32()
		for i, v := range acc {
			d[i] = int32(int64(v)) // wraps like int32 arithmetic
		}
	case tensor.BFloat16:
		d := t.BF16()
		for i, v := range acc {
			d[i] = tensor.BF16FromFloat32(float32(v))
		}
	}
}

// HostOnly checks that every tensor (nil ones skipped) is in host memory;
// the error, a *comm.Error of op on c, says that transport (comm/local,
// comm/tcp) moves host tensors.
func HostOnly(c comm.Comm, op, transport string, ts ...*tensor.Tensor) error {
	for _, t := range ts {
		if t == nil {
			continue
		}
		if _, ok := t.Buffer().(*tensor.HostBuffer); !ok {
			return comm.Errorf(c, op, "%v: expected a tensor in host memory (%s moves host tensors)", t, transport)
		}
	}
	return nil
}

// FirstErr returns the first non-nil error, or nil.
func FirstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// ShapeOf prints dtype and shape: "f32(2, 3)".
func ShapeOf(t *tensor.Tensor) string { return fmt.Sprintf("%v%v", t.DType(), t.Shape()) }
