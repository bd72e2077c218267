package layers

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// The helpers below check a layer's arguments and manage its activations.
// They are exported for the parallel versions of the layers (parallel/tp,
// parallel/model), so that those check and report their arguments as these
// do. layer names the layer in errors with its package, as in
// "layers: attention blocks.0.attn" or "tp: mlp blocks.0.mlp"; what names
// the argument ("input x").

// StatDType is the dtype of the side outputs the backend keeps for a
// backward (rstd, lse, per-row losses): float64 when the model computes in
// float64 (so gradient checks stay exact), float32 otherwise.
func StatDType(dt tensor.DType) tensor.DType {
	if dt == tensor.Float64 {
		return tensor.Float64
	}
	return tensor.Float32
}

// Ensure returns t when it already has dtype dt and the given shape, and
// otherwise frees it and returns a fresh zeroed tensor: layers keep their
// activations across steps and reallocate only when the shapes change.
func Ensure(b tensor.Backend, t *tensor.Tensor, dt tensor.DType, shape ...int) *tensor.Tensor {
	if t != nil && t.DType() == dt && t.Shape().Equal(shape) {
		return t
	}
	if t != nil {
		b.Free(t)
	}
	return b.Zeros(dt, shape...)
}

// Reshape is Tensor.Reshape for shapes already checked to have t's numel.
func Reshape(t *tensor.Tensor, shape ...int) *tensor.Tensor {
	r, err := t.Reshape(shape...)
	if err != nil {
		panic("layers: internal error: " + err.Error())
	}
	return r
}

// CheckOn checks that t is a tensor of dtype dt on b's device.
func CheckOn(b tensor.Backend, layer, what string, t *tensor.Tensor, dt tensor.DType) error {
	if t == nil {
		return fmt.Errorf("%s: %s is nil", layer, what)
	}
	if t.Device() != b.Device() {
		return fmt.Errorf("%s: %s is %v, expected a tensor on %v", layer, what, t, b.Device())
	}
	if t.DType() != dt {
		return fmt.Errorf("%s: %s is %v, expected dtype %v", layer, what, t, dt)
	}
	return nil
}

// CheckRows checks that t (dtype dt, on b's device) has shape (..., c) with
// at least one leading dimension and returns the number of rows, the product
// of the leading dimensions.
func CheckRows(b tensor.Backend, layer, what string, t *tensor.Tensor, dt tensor.DType, c int) (int, error) {
	if err := CheckOn(b, layer, what, t, dt); err != nil {
		return 0, err
	}
	s := t.Shape()
	if len(s) < 2 || s[len(s)-1] != c {
		return 0, fmt.Errorf("%s: %s has shape %v, expected (..., %d)", layer, what, s, c)
	}
	return s[:len(s)-1].Numel(), nil
}

// CheckRowsN is CheckRows that also wants exactly n rows; why says which
// rows ("like the forward's input").
func CheckRowsN(b tensor.Backend, layer, what string, t *tensor.Tensor, dt tensor.DType, c, n int, why string) error {
	m, err := CheckRows(b, layer, what, t, dt, c)
	if err != nil {
		return err
	}
	if m != n {
		return fmt.Errorf("%s: %s has shape %v, expected %d rows of %d (%s)", layer, what, t.Shape(), n, c, why)
	}
	return nil
}

// CheckShape checks that t (dtype dt, on b's device) has exactly shape want.
func CheckShape(b tensor.Backend, layer, what string, t *tensor.Tensor, dt tensor.DType, want ...int) error {
	if err := CheckOn(b, layer, what, t, dt); err != nil {
		return err
	}
	if !t.Shape().Equal(want) {
		return fmt.Errorf("%s: %s has shape %v, expected %v", layer, what, t.Shape(), tensor.Shape(want))
	}
	return nil
}

// CheckParams fails when a layer's parameters are not materialized yet.
func CheckParams(layer string, ps ...*Param) error {
	for _, p := range ps {
		if p != nil && p.W == nil {
			return fmt.Errorf("%s: parameter %q is not materialized (call ParamSet.Materialize first)", layer, p.Name)
		}
	}
	return nil
}

// Sticky wraps the backend's sticky error, if any, with the layer's name
// and the pass ("forward", "backward").
func Sticky(b tensor.Backend, layer, pass string) error {
	if err := b.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", layer, pass, err)
	}
	return nil
}

// overlaps reports whether two tensors share any element of storage.
func overlaps(a, b *tensor.Tensor) bool {
	if a == nil || b == nil || a.Buffer() != b.Buffer() {
		return false
	}
	return a.Offset() < b.Offset()+b.Numel() && b.Offset() < a.Offset()+a.Numel()
}

// CheckApart fails when two tensors a layer reads and writes share storage:
// the ops behind a layer are not elementwise, and the layers keep their
// inputs for the backward.
func CheckApart(layer, whatA string, a *tensor.Tensor, whatB string, b *tensor.Tensor) error {
	if overlaps(a, b) {
		return fmt.Errorf("%s: %s overlaps %s, expected separate storage", layer, whatA, whatB)
	}
	return nil
}
