package tcp

import (
	"encoding/binary"
	"math"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Tensor elements on the wire: little-endian, in the tensor's dtype (bf16
// as its 16 raw bits). The tensors are host tensors whose shapes the
// comm.Check functions and the headers have already matched.

// encode returns elements [off, off+n) of t as bytes.
func encode(t *tensor.Tensor, off, n int) []byte {
	le := binary.LittleEndian
	out := make([]byte, 0, n*t.DType().Size())
	switch t.DType() {
	case tensor.Float32:
		for _, v := range t.F32()[off : off+n] {
			out = le.AppendUint32(out, math.Float32bits(v))
		}
	case tensor.Float64:
		for _, v := range t.F64()[off : off+n] {
			out = le.AppendUint64(out, math.Float64bits(v))
		}
	case tensor.Int32:
		for _, v := range t.I32()[off : off+n] {
			out = le.AppendUint32(out, uint32(v))
		}
	case tensor.BFloat16:
		for _, v := range t.BF16()[off : off+n] {
			out = le.AppendUint16(out, v)
		}
	}
	return out
}

// decodeInto writes the elements in b into dst from element off on.
func decodeInto(dst *tensor.Tensor, off int, b []byte) {
	le := binary.LittleEndian
	switch dst.DType() {
	case tensor.Float32:
		d := dst.F32()[off:]
		for i := range len(b) / 4 {
			d[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
	case tensor.Float64:
		d := dst.F64()[off:]
		for i := range len(b) / 8 {
			d[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		}
	case tensor.Int32:
		d := dst.I32()[off:]
		for i := range len(b) / 4 {
			d[i] = int32(le.Uint32(b[4*i:]))
		}
	case tensor.BFloat16:
		d := dst.BF16()[off:]
		for i := range len(b) / 2 {
			d[i] = le.Uint16(b[2*i:])
		}
	}
}

// copyElems copies n elements of src from sOff to dst at dOff.
func copyElems(dst *tensor.Tensor, dOff int, src *tensor.Tensor, sOff, n int) {
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

// widen returns elements [off, off+n) of t as float64.
func widen(t *tensor.Tensor, off, n int) []float64 {
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

// widenBytes returns the elements of dtype dt in b as float64.
func widenBytes(dt tensor.DType, b []byte) []float64 {
	le := binary.LittleEndian
	n := len(b) / dt.Size()
	out := make([]float64, n)
	for i := range out {
		switch dt {
		case tensor.Float32:
			out[i] = float64(math.Float32frombits(le.Uint32(b[4*i:])))
		case tensor.Float64:
			out[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		case tensor.Int32:
			out[i] = float64(int32(le.Uint32(b[4*i:])))
		case tensor.BFloat16:
			out[i] = float64(tensor.BF16ToFloat32(le.Uint16(b[2*i:])))
		}
	}
	return out
}

// accumulate folds v into acc (first: acc = v).
func accumulate(acc, v []float64, first bool, op comm.ReduceOp) {
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

// finish divides by the number of ranks for Avg.
func finish(acc []float64, op comm.ReduceOp, ranks int) {
	if op == comm.Avg {
		for i := range acc {
			acc[i] /= float64(ranks)
		}
	}
}

// narrow rounds acc to t's dtype (bf16 through float32) into t.
func narrow(t *tensor.Tensor, acc []float64) {
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
