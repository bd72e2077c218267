package cpu

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// Upload copies the host tensor src into dst (also a host tensor on the CPU),
// converting the dtype if they differ. Same numel required.
func (b *Backend) Upload(dst, src *tensor.Tensor) { b.convert("Upload", opcheck.Upload, dst, src) }

// Download copies src into the host tensor dst, converting the dtype if they
// differ. Same numel required.
func (b *Backend) Download(dst, src *tensor.Tensor) {
	b.convert("Download", opcheck.Download, dst, src)
}

// Copy copies src into dst, converting the dtype (to bfloat16: round to
// nearest even; float64 to bfloat16 rounds to float32 first). Float and
// integer dtypes do not mix. dst may be src.
func (b *Backend) Copy(dst, src *tensor.Tensor) { b.convert("Copy", opcheck.Copy, dst, src) }

// convert runs op, whose arguments check validates.
func (b *Backend) convert(op string, check func(c *opcheck.Checker, dst, src *tensor.Tensor), dst, src *tensor.Tensor) {
	c := b.check(op)
	check(c, dst, src)
	if !c.OK() {
		return
	}
	convert(dst, src)
}

// convert copies between host tensors of equal numel and compatible dtypes.
func convert(dst, src *tensor.Tensor) {
	switch dst.DType() {
	case tensor.Int32:
		copy(dst.I32(), src.I32())
	case tensor.Float32:
		d := dst.F32()
		switch src.DType() {
		case tensor.Float32:
			copy(d, src.F32())
		case tensor.Float64:
			for i, v := range src.F64() {
				d[i] = float32(v)
			}
		case tensor.BFloat16:
			for i, v := range src.BF16() {
				d[i] = tensor.BF16ToFloat32(v)
			}
		}
	case tensor.Float64:
		d := dst.F64()
		switch src.DType() {
		case tensor.Float32:
			for i, v := range src.F32() {
				d[i] = float64(v)
			}
		case tensor.Float64:
			copy(d, src.F64())
		case tensor.BFloat16:
			for i, v := range src.BF16() {
				d[i] = float64(tensor.BF16ToFloat32(v))
			}
		}
	case tensor.BFloat16:
		d := dst.BF16()
		switch src.DType() {
		case tensor.Float32:
			for i, v := range src.F32() {
				d[i] = tensor.BF16FromFloat32(v)
			}
		case tensor.Float64:
			for i, v := range src.F64() {
				d[i] = tensor.BF16FromFloat32(float32(v))
			}
		case tensor.BFloat16:
			copy(d, src.BF16())
		}
	}
}

// Fill sets every element of t to v (rounded to t's dtype; for Int32, v must
// be an integer in range).
func (b *Backend) Fill(t *tensor.Tensor, v float64) {
	c := b.check("Fill")
	opcheck.Fill(c, t, v)
	if !c.OK() {
		return
	}
	switch t.DType() {
	case tensor.Float32:
		fill(t.F32(), float32(v))
	case tensor.Float64:
		fill(t.F64(), v)
	case tensor.Int32:
		fill(t.I32(), int32(v))
	case tensor.BFloat16:
		fill(t.BF16(), tensor.BF16FromFloat32(float32(v)))
	}
}

func fill[T any](d []T, v T) {
	for i := range d {
		d[i] = v
	}
}
