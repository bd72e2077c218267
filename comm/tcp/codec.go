package tcp

import (
	"encoding/binary"
	"math"

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
