package cudabackend

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// Upload copies the host tensor src into dst, converting src's dtype (f32,
// f64, bf16, i32) to dst's on the host first (to bfloat16: round to nearest
// even; float64 rounds to float32 first). The copy is queued on the stream;
// src may be reused when Upload returns.
func (b *Backend) Upload(dst, src *tensor.Tensor) {
	c := b.check("Upload")
	opcheck.Upload(c, dst, src)
	if !c.OK() {
		return
	}
	data := hostAs(src, dst.DType())
	if len(data) == 0 {
		return
	}
	b.do("Upload", func(d gpu.Device) error {
		return d.CopyHtoD(ptr(dst), unsafe.Pointer(&data[0]), len(data))
	})
}

// Download copies src into the host tensor dst after the work queued before
// it, converting the dtype (f32, f64, bf16 or i32 on the host). It also
// reads back the kernels' data checks.
func (b *Backend) Download(dst, src *tensor.Tensor) {
	c := b.check("Download")
	opcheck.Download(c, dst, src)
	if !c.OK() {
		return
	}
	n := src.Numel()
	if n == 0 {
		return
	}
	raw := make([]byte, n*src.DType().Size())
	b.do("Download", func(d gpu.Device) error {
		if err := d.CopyDtoH(unsafe.Pointer(&raw[0]), ptr(src), len(raw)); err != nil {
			return err
		}
		b.readFlags()
		return nil
	})
	if !b.failed() {
		storeHost(dst, raw, src.DType())
	}
}

// Copy copies src into dst on the device, converting between bf16 and f32
// (to bf16: round to nearest even); i32 copies only to i32. dst may be src.
func (b *Backend) Copy(dst, src *tensor.Tensor) {
	c := b.check("Copy")
	opcheck.Copy(c, dst, src)
	if !c.OK() {
		return
	}
	n := src.Numel()
	if n == 0 {
		return
	}
	switch sd, dd := src.DType(), dst.DType(); {
	case sd == dd:
		if ptr(dst) == ptr(src) {
			return
		}
		b.do("Copy", func(d gpu.Device) error { return d.CopyDtoD(ptr(dst), ptr(src), n*sd.Size()) })
	case sd == tensor.BFloat16 && dd == tensor.Float32:
		b.launch("Copy", "cast_bf16_f32", b.gridStride(n, 4), gpu.D1(threads256), 0, ptr(dst), ptr(src), int64(n))
	case sd == tensor.Float32 && dd == tensor.BFloat16:
		b.launch("Copy", "cast_f32_bf16", b.gridStride(n, 4), gpu.D1(threads256), 0, ptr(dst), ptr(src), int64(n))
	default:
		b.fail(fmt.Errorf("cuda: Copy: cannot convert %v to %v", src, dst))
	}
}

// Fill sets every element of t to v, rounded to t's dtype (for Int32, v
// must be an integer in range).
func (b *Backend) Fill(t *tensor.Tensor, v float64) {
	c := b.check("Fill")
	opcheck.Fill(c, t, v)
	if !c.OK() {
		return
	}
	n := t.Numel()
	b.do("Fill", func(d gpu.Device) error {
		switch t.DType() {
		case tensor.BFloat16:
			return d.Memset16(ptr(t), tensor.BF16FromFloat32(float32(v)), n)
		case tensor.Float32:
			return d.Memset32(ptr(t), math.Float32bits(float32(v)), n)
		default: // Int32
			return d.Memset32(ptr(t), uint32(int32(v)), n)
		}
	})
}

// hostAs returns the elements of the host tensor src in dtype dt, as bytes
// (src's own storage when the dtypes match).
func hostAs(src *tensor.Tensor, dt tensor.DType) []byte {
	n := src.Numel()
	if n == 0 {
		return nil
	}
	if src.DType() == dt {
		switch dt {
		case tensor.Float32:
			return asBytes(src.F32())
		case tensor.BFloat16:
			return asBytes(src.BF16())
		case tensor.Int32:
			return asBytes(src.I32())
		}
	}
	switch {
	case dt == tensor.Float32 && src.DType() == tensor.BFloat16:
		out := make([]float32, n)
		for i, h := range src.BF16() {
			out[i] = tensor.BF16ToFloat32(h)
		}
		return asBytes(out)
	case dt == tensor.Float32: // from Float64
		out := make([]float32, n)
		for i, v := range src.F64() {
			out[i] = float32(v)
		}
		return asBytes(out)
	case src.DType() == tensor.Float32: // to BFloat16
		out := make([]uint16, n)
		for i, v := range src.F32() {
			out[i] = tensor.BF16FromFloat32(v)
		}
		return asBytes(out)
	default: // Float64 to BFloat16, through float32
		out := make([]uint16, n)
		for i, v := range src.F64() {
			out[i] = tensor.BF16FromFloat32(float32(v))
		}
		return asBytes(out)
	}
}

// storeHost converts raw device elements of dtype dt into the host tensor
// dst.
func storeHost(dst *tensor.Tensor, raw []byte, dt tensor.DType) {
	n := dst.Numel()
	if dst.DType() == dt {
		switch dt {
		case tensor.Float32:
			copy(asBytes(dst.F32()), raw)
		case tensor.BFloat16:
			copy(asBytes(dst.BF16()), raw)
		case tensor.Int32:
			copy(asBytes(dst.I32()), raw)
		}
		return
	}
	vals := make([]float64, n)
	switch dt {
	case tensor.Float32:
		f := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n)
		for i, v := range f {
			vals[i] = float64(v)
		}
	case tensor.BFloat16:
		h := unsafe.Slice((*uint16)(unsafe.Pointer(&raw[0])), n)
		for i, v := range h {
			vals[i] = float64(tensor.BF16ToFloat32(v))
		}
	}
	if dst.DType() == tensor.BFloat16 && dt == tensor.Float32 {
		f := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), n)
		d := dst.BF16()
		for i, v := range f {
			d[i] = tensor.BF16FromFloat32(v)
		}
		return
	}
	_ = dst.SetFloat64s(vals) // a host tensor of n elements: cannot fail
}

// asBytes views a slice's elements as bytes.
func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}
