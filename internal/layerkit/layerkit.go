// Package layerkit holds what the layers (layers, parallel/tp,
// parallel/ep, parallel/model) share to check their arguments and manage
// their activations: the same checks, so every layer reports its
// arguments alike, and the dtypes of their side outputs. It is internal:
// a program builds on the layers, not on these helpers. layer names the
// layer in errors with its package, as in "layers: attention
// blocks.0.attn" or "tp: mlp blocks.0.mlp"; what names the argument
// ("input x").
package layerkit

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// CheckMaterialized fails when the weights w of the parameter name are not
// allocated yet (nil: its ParamSet is not materialized).
func CheckMaterialized(layer, name string, w *tensor.Tensor) error {
	if w == nil {
		return fmt.Errorf("%s: parameter %q is not materialized (call ParamSet.Materialize first)", layer, name)
	}
	return nil
}

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
		panic("layerkit: internal error: " + err.Error())
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

// RouterDType is the dtype a router of a model in dt routes in: fp32 for
// bf16 (and f32) models, f64 for f64 ones.
func RouterDType(dt tensor.DType) tensor.DType { return StatDType(dt) }

// CheckIDs checks that a host int32 tensor holds values in [0, n); tensors
// not in host memory are not checked. what names the tensor in the error.
func CheckIDs(what string, ids *tensor.Tensor, n int) error {
	v := ids.I32()
	if v == nil {
		return nil
	}
	for i, id := range v {
		if id < 0 || int(id) >= n {
			return fmt.Errorf("%s[%d] = %d, expected a value in [0, %d)", what, i, id, n)
		}
	}
	return nil
}

// CheckTokens checks a host int32 (B, T) tensor of token ids or targets
// for a model of sequence length seq (T ≤ seq). layer begins the errors
// ("layers: gpt"); what names the tensor.
func CheckTokens(layer, what string, t *tensor.Tensor, seq int) error {
	if t == nil {
		return fmt.Errorf("%s: %s is nil", layer, what)
	}
	if _, host := t.Buffer().(*tensor.HostBuffer); !host || t.DType() != tensor.Int32 {
		return fmt.Errorf("%s: %s is %v, expected a host int32 tensor (B, T)", layer, what, t)
	}
	s := t.Shape()
	if len(s) != 2 || s[0] <= 0 || s[1] <= 0 {
		return fmt.Errorf("%s: %s has shape %v, expected (B, T) with B, T > 0", layer, what, s)
	}
	if s[1] > seq {
		return fmt.Errorf("%s: %s has shape %v: T = %d exceeds the model's Seq = %d", layer, what, s, s[1], seq)
	}
	return nil
}

// CountTargets checks host int32 targets against the ids they go with
// (the same shape) and a vocabulary of vocab tokens, negative targets
// being ignored, and returns how many are not ignored. layer begins the
// errors ("layers: gpt").
func CountTargets(layer string, targets, ids *tensor.Tensor, vocab int) (int, error) {
	if !targets.Shape().Equal(ids.Shape()) {
		return 0, fmt.Errorf("%s: targets have shape %v, expected %v like ids", layer, targets.Shape(), ids.Shape())
	}
	n := 0
	for i, t := range targets.I32() {
		if int(t) >= vocab {
			return 0, fmt.Errorf("%s: targets[%d] = %d, expected a value < Vocab = %d (or negative to ignore it)", layer, i, t, vocab)
		}
		if t >= 0 {
			n++
		}
	}
	return n, nil
}

// Capacity is the number of token-slots each expert keeps in a step of
// tokens tokens: ceil(factor·tokens·topK/experts), or 0 (dropless) when
// factor is 0.
func Capacity(factor float64, tokens, topK, experts int) int {
	if factor <= 0 || experts <= 0 {
		return 0
	}
	return int(math.Ceil(factor * float64(tokens) * float64(topK) / float64(experts)))
}
