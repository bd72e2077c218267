package tensor

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor.
type DType uint8

const (
	Invalid  DType = iota // the zero value: no dtype
	Float32               // IEEE float32: the CPU reference type, fp32 master weights and optimizer state
	BFloat16              // bfloat16: GPU parameters and activations
	Int32                 // token ids, targets, counts
	Float64               // exact oracle in tests
)

// String returns the usual short name ("f32", "bf16", ...).
func (d DType) String() string {
	switch d {
	case Float32:
		return "f32"
	case BFloat16:
		return "bf16"
	case Int32:
		return "i32"
	case Float64:
		return "f64"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Size is the size of one element in bytes (0 for an invalid dtype).
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case BFloat16:
		return 2
	case Float64:
		return 8
	}
	return 0
}

// Round is v rounded to the nearest value of the float dtype d (as
// SetFloat64s stores it), for references that must see exactly what a
// tensor of d holds; other dtypes return v.
func (d DType) Round(v float64) float64 {
	switch d {
	case Float32:
		return float64(float32(v))
	case BFloat16:
		return float64(BF16ToFloat32(BF16FromFloat32(float32(v))))
	}
	return v
}

// Tolerance is the bound on ‖out − ref‖ / ‖ref‖ that a result computed in
// d is held to against its reference (a strategy against collective, an
// op against the CPU's float64): float64 1e-12, float32 1e-5, bf16 (and
// any other dtype) 1e-2. The conformance suites, the shadow comparisons
// and the ablation's cells share it.
func (d DType) Tolerance() float64 {
	switch d {
	case Float64:
		return 1e-12
	case Float32:
		return 1e-5
	}
	return 1e-2
}

// IsFloat reports whether d holds floating-point values.
func (d DType) IsFloat() bool { return d == Float32 || d == BFloat16 || d == Float64 }

// ParseDType reads the names printed by String.
func ParseDType(s string) (DType, error) {
	for _, d := range []DType{Float32, BFloat16, Int32, Float64} {
		if d.String() == s {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("tensor: unknown dtype %q, expected one of f32, bf16, i32, f64", s)
}

// DeviceKind says where a tensor's storage lives.
type DeviceKind uint8

const (
	CPU  DeviceKind = iota // host memory
	CUDA                   // the memory of a CUDA device
)

// Device is a kind and an ordinal (the GPU index for CUDA, 0 for the CPU).
type Device struct {
	Kind  DeviceKind // CPU or CUDA
	Index int        // the GPU's ordinal (0 for the CPU)
}

// HostDevice is the CPU.
var HostDevice = Device{Kind: CPU}

// String is "cpu" or "cuda:N".
func (d Device) String() string {
	if d.Kind == CUDA {
		return fmt.Sprintf("cuda:%d", d.Index)
	}
	return "cpu"
}

// Shape is a list of dimensions, outermost first.
type Shape []int

// Numel is the number of elements (1 for a scalar shape).
func (s Shape) Numel() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// Equal reports whether two shapes have the same dimensions.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy that does not alias s.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

// String is the shape in parentheses: "(2, 3)".
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func (s Shape) validate() error {
	for _, d := range s {
		if d < 0 {
			return fmt.Errorf("tensor: negative dimension in shape %v", s)
		}
	}
	return nil
}

// Buffer is the storage behind one or more tensors, on one device. A buffer is
// typed: its length is counted in elements of its dtype.
type Buffer interface {
	Device() Device // where the storage lives
	DType() DType   // the dtype of its elements
	Len() int       // its length in elements
}

// HostBuffer is storage in host memory. Exactly the slice that matches its
// dtype is set.
type HostBuffer struct {
	dtype DType
	F32   []float32 // the elements of a Float32 buffer
	F64   []float64 // the elements of a Float64 buffer
	I32   []int32   // the elements of an Int32 buffer
	BF16  []uint16  // the raw bfloat16 bits of a BFloat16 buffer
}

// NewHostBuffer allocates n zeroed elements of dt.
func NewHostBuffer(dt DType, n int) (*HostBuffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("tensor: host buffer of %d elements", n)
	}
	b := &HostBuffer{dtype: dt}
	switch dt {
	case Float32:
		b.F32 = make([]float32, n)
	case Float64:
		b.F64 = make([]float64, n)
	case Int32:
		b.I32 = make([]int32, n)
	case BFloat16:
		b.BF16 = make([]uint16, n)
	default:
		return nil, fmt.Errorf("tensor: host buffer of invalid dtype %v", dt)
	}
	return b, nil
}

// Device is HostDevice.
func (b *HostBuffer) Device() Device { return HostDevice }

// DType is the dtype of the buffer's elements.
func (b *HostBuffer) DType() DType { return b.dtype }

// Len is the number of elements.
func (b *HostBuffer) Len() int {
	switch b.dtype {
	case Float32:
		return len(b.F32)
	case Float64:
		return len(b.F64)
	case Int32:
		return len(b.I32)
	case BFloat16:
		return len(b.BF16)
	}
	return 0
}

// Tensor is a contiguous, row-major view of part of a Buffer: shape, dtype and
// an element offset. Tensors are cheap handles; several can share one buffer
// (a model keeps all its parameters in one flat buffer and hands out views).
type Tensor struct {
	shape Shape
	buf   Buffer
	off   int
}

// New makes a tensor of the given shape over buf starting at element off.
func New(buf Buffer, off int, shape ...int) (*Tensor, error) {
	s := Shape(shape).Clone()
	if err := s.validate(); err != nil {
		return nil, err
	}
	if buf == nil {
		return nil, fmt.Errorf("tensor: nil buffer for shape %v", s)
	}
	if off < 0 || off+s.Numel() > buf.Len() {
		return nil, fmt.Errorf("tensor: view of %d elements at offset %d does not fit a buffer of %d", s.Numel(), off, buf.Len())
	}
	return &Tensor{shape: s, buf: buf, off: off}, nil
}

// Host allocates a zeroed host tensor.
func Host(dt DType, shape ...int) (*Tensor, error) {
	s := Shape(shape)
	if err := s.validate(); err != nil {
		return nil, err
	}
	b, err := NewHostBuffer(dt, s.Numel())
	if err != nil {
		return nil, err
	}
	return New(b, 0, shape...)
}

// MustHost is Host for shapes known to be valid (tests, constants); it panics
// on a negative dimension or an invalid dtype, which are programming errors.
func MustHost(dt DType, shape ...int) *Tensor {
	t, err := Host(dt, shape...)
	if err != nil {
		panic(err)
	}
	return t
}

// FromFloat32 wraps data (not copied) as a host float32 tensor.
func FromFloat32(data []float32, shape ...int) (*Tensor, error) {
	return New(&HostBuffer{dtype: Float32, F32: data}, 0, shape...)
}

// ToFloat32 is host tensor t as float32: t itself when it is float32, a
// new tensor of its values otherwise (bf16 exactly, wider dtypes rounded to
// the nearest float32).
func ToFloat32(t *Tensor) (*Tensor, error) {
	switch t.DType() {
	case Float32:
		return t, nil
	case BFloat16:
		v := make([]float32, t.Numel())
		for i, h := range t.BF16() {
			v[i] = BF16ToFloat32(h)
		}
		return FromFloat32(v, t.Shape()...)
	}
	f, err := t.Float64s()
	if err != nil {
		return nil, err
	}
	v := make([]float32, len(f))
	for i, x := range f {
		v[i] = float32(x)
	}
	return FromFloat32(v, t.Shape()...)
}

// FromFloat64 wraps data (not copied) as a host float64 tensor.
func FromFloat64(data []float64, shape ...int) (*Tensor, error) {
	return New(&HostBuffer{dtype: Float64, F64: data}, 0, shape...)
}

// FromInt32 wraps data (not copied) as a host int32 tensor.
func FromInt32(data []int32, shape ...int) (*Tensor, error) {
	return New(&HostBuffer{dtype: Int32, I32: data}, 0, shape...)
}

// Shape is the tensor's shape (do not modify it: Clone it).
func (t *Tensor) Shape() Shape { return t.shape }

// DType is the dtype of the tensor's elements (its buffer's).
func (t *Tensor) DType() DType { return t.buf.DType() }

// Device is where the tensor's storage lives.
func (t *Tensor) Device() Device { return t.buf.Device() }

// Buffer is the storage the tensor is a view of.
func (t *Tensor) Buffer() Buffer { return t.buf }

// Offset is where the tensor starts in its buffer, in elements.
func (t *Tensor) Offset() int { return t.off }

// Numel is the number of elements, the product of the shape.
func (t *Tensor) Numel() int { return t.shape.Numel() }

// Dim returns dimension i; negative i counts from the end.
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// Bytes is the size of the tensor's elements in bytes.
func (t *Tensor) Bytes() int { return t.Numel() * t.DType().Size() }

// String is the dtype, shape and device: "f32(2, 3)@cpu".
func (t *Tensor) String() string {
	return fmt.Sprintf("%v%v@%v", t.DType(), t.shape, t.Device())
}

// View returns a tensor over the same buffer, starting off elements after t's
// start, with the given shape; it must lie inside t.
func (t *Tensor) View(off int, shape ...int) (*Tensor, error) {
	n := Shape(shape).Numel()
	if off < 0 || off+n > t.Numel() {
		return nil, fmt.Errorf("tensor: view of %d elements at offset %d outside %v", n, off, t)
	}
	return New(t.buf, t.off+off, shape...)
}

// Reshape returns a view of all of t with another shape of the same size.
func (t *Tensor) Reshape(shape ...int) (*Tensor, error) {
	if Shape(shape).Numel() != t.Numel() {
		return nil, fmt.Errorf("tensor: cannot reshape %v to %v", t, Shape(shape))
	}
	return New(t.buf, t.off, shape...)
}

// Rows returns the view of rows [from, to) along the first dimension.
func (t *Tensor) Rows(from, to int) (*Tensor, error) {
	if len(t.shape) == 0 || from < 0 || to < from || to > t.shape[0] {
		return nil, fmt.Errorf("tensor: rows [%d, %d) of %v", from, to, t)
	}
	inner := t.Numel()
	if t.shape[0] > 0 {
		inner /= t.shape[0]
	} else {
		inner = Shape(t.shape[1:]).Numel()
	}
	s := append(Shape{to - from}, t.shape[1:]...)
	return New(t.buf, t.off+from*inner, s...)
}

func (t *Tensor) host() *HostBuffer {
	hb, _ := t.buf.(*HostBuffer)
	return hb
}

// F32 returns the elements of a host float32 tensor (aliasing its storage), or
// nil if t is not one.
func (t *Tensor) F32() []float32 {
	if hb := t.host(); hb != nil && hb.dtype == Float32 {
		return hb.F32[t.off : t.off+t.Numel()]
	}
	return nil
}

// F64 returns the elements of a host float64 tensor, or nil.
func (t *Tensor) F64() []float64 {
	if hb := t.host(); hb != nil && hb.dtype == Float64 {
		return hb.F64[t.off : t.off+t.Numel()]
	}
	return nil
}

// I32 returns the elements of a host int32 tensor, or nil.
func (t *Tensor) I32() []int32 {
	if hb := t.host(); hb != nil && hb.dtype == Int32 {
		return hb.I32[t.off : t.off+t.Numel()]
	}
	return nil
}

// BF16 returns the raw bits of a host bfloat16 tensor, or nil.
func (t *Tensor) BF16() []uint16 {
	if hb := t.host(); hb != nil && hb.dtype == BFloat16 {
		return hb.BF16[t.off : t.off+t.Numel()]
	}
	return nil
}

// Float64s copies the elements of a host tensor of any dtype into a new
// float64 slice.
func (t *Tensor) Float64s() ([]float64, error) {
	hb := t.host()
	if hb == nil {
		return nil, fmt.Errorf("tensor: Float64s of %v: not in host memory", t)
	}
	out := make([]float64, t.Numel())
	switch hb.dtype {
	case Float32:
		for i, v := range t.F32() {
			out[i] = float64(v)
		}
	case Float64:
		copy(out, t.F64())
	case Int32:
		for i, v := range t.I32() {
			out[i] = float64(v)
		}
	case BFloat16:
		for i, v := range t.BF16() {
			out[i] = float64(BF16ToFloat32(v))
		}
	}
	return out, nil
}

// SetFloat64s stores vals (rounded to t's dtype) into a host tensor.
func (t *Tensor) SetFloat64s(vals []float64) error {
	hb := t.host()
	if hb == nil {
		return fmt.Errorf("tensor: SetFloat64s of %v: not in host memory", t)
	}
	if len(vals) != t.Numel() {
		return fmt.Errorf("tensor: SetFloat64s: %d values for %v", len(vals), t)
	}
	switch hb.dtype {
	case Float32:
		d := t.F32()
		for i, v := range vals {
			d[i] = float32(v)
		}
	case Float64:
		copy(t.F64(), vals)
	case Int32:
		d := t.I32()
		for i, v := range vals {
			d[i] = int32(v)
		}
	case BFloat16:
		d := t.BF16()
		for i, v := range vals {
			d[i] = BF16FromFloat32(float32(v))
		}
	}
	return nil
}
