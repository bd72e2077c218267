package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"

	"github.com/asynctp/asynctp/tensor"
)

// RMSNorm is out = x / rms(x) · w over the last dimension, with
// rms(x) = sqrt(mean(x²) + Eps).
type RMSNorm struct {
	Name string  // the layer's name, its parameter's prefix
	Dim  int     // the features normalised
	Eps  float32 // added to mean(x²)
	W    *Param  // (Dim), initialised to 1, no weight decay

	b    tensor.Backend
	x    *tensor.Tensor // (N, Dim): the input of the last Forward (the caller's)
	rstd *tensor.Tensor // (N): 1/rms(x) per row (f32, or f64 for f64 models), owned
}

// NewRMSNorm registers name+".weight".
func NewRMSNorm(b tensor.Backend, ps *ParamSet, name string, dim int, eps float32) (*RMSNorm, error) {
	if b == nil || ps == nil {
		return nil, fmt.Errorf("layers: rmsnorm %q: nil backend or parameter set", name)
	}
	if dim <= 0 || !(eps >= 0) {
		return nil, fmt.Errorf("layers: rmsnorm %q: dim = %d, eps = %v, expected dim > 0 and eps >= 0", name, dim, eps)
	}
	w, err := ps.Add(name+".weight", []int{dim}, false, Constant(1))
	if err != nil {
		return nil, err
	}
	return &RMSNorm{Name: name, Dim: dim, Eps: eps, W: w, b: b}, nil
}

// Params returns the weight.
func (r *RMSNorm) Params() []*Param { return []*Param{r.W} }

func (r *RMSNorm) what() string { return "layers: rmsnorm " + r.Name }

// Forward writes out (..., Dim) = RMSNorm(x (..., Dim)) and keeps x and the
// per-row 1/rms.
func (r *RMSNorm) Forward(out, x *tensor.Tensor) error {
	r.x = nil
	if err := checkParams(r.what(), r.W); err != nil {
		return err
	}
	dt := r.W.W.DType()
	n, err := layerkit.CheckRows(r.b, r.what(), "input x", x, dt, r.Dim)
	if err != nil {
		return err
	}
	if err := layerkit.CheckShape(r.b, r.what(), "output", out, dt, x.Shape()...); err != nil {
		return err
	}
	if err := layerkit.CheckApart(r.what(), "output", out, "input x", x); err != nil {
		return err
	}
	x2 := layerkit.Reshape(x, n, r.Dim)
	r.rstd = layerkit.Ensure(r.b, r.rstd, layerkit.StatDType(dt), n)
	r.b.RMSNorm(layerkit.Reshape(out, n, r.Dim), r.rstd, x2, r.W.W, r.Eps)
	r.x = x2
	return layerkit.Sticky(r.b, r.what(), "forward")
}

// Backward overwrites dx (..., Dim) with ∂L/∂x and adds ∂L/∂w, from dout.
func (r *RMSNorm) Backward(dx, dout *tensor.Tensor) error {
	if r.x == nil {
		return errors.New(r.what() + ": Backward without a successful Forward")
	}
	dt, n := r.W.W.DType(), r.x.Dim(0)
	if err := layerkit.CheckRowsN(r.b, r.what(), "output gradient", dout, dt, r.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(r.b, r.what(), "input gradient dx", dx, dt, r.Dim, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(r.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	r.b.RMSNormBackward(layerkit.Reshape(dx, n, r.Dim), r.W.G, layerkit.Reshape(dout, n, r.Dim), r.x, r.W.W, r.rstd)
	return layerkit.Sticky(r.b, r.what(), "backward")
}

// ForwardAdd is the residual add fused with the norm: h = x + res and out =
// RMSNorm(h) (..., Dim), in one op (tensor.Backend.AddRMSNorm); it keeps h
// for the backward, as Forward keeps x. h must not alias out.
func (r *RMSNorm) ForwardAdd(h, out, x, res *tensor.Tensor) error {
	r.x = nil
	if err := checkParams(r.what(), r.W); err != nil {
		return err
	}
	dt := r.W.W.DType()
	n, err := layerkit.CheckRows(r.b, r.what(), "input x", x, dt, r.Dim)
	if err != nil {
		return err
	}
	for _, t := range []struct {
		what string
		t    *tensor.Tensor
	}{{"residual", res}, {"sum h", h}, {"output", out}} {
		if err := layerkit.CheckShape(r.b, r.what(), t.what, t.t, dt, x.Shape()...); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		what string
		t    *tensor.Tensor
	}{{"input x", x}, {"residual", res}, {"sum h", h}} {
		if err := layerkit.CheckApart(r.what(), "output", out, t.what, t.t); err != nil {
			return err
		}
	}
	h2 := layerkit.Reshape(h, n, r.Dim)
	r.rstd = layerkit.Ensure(r.b, r.rstd, layerkit.StatDType(dt), n)
	r.b.AddRMSNorm(h2, layerkit.Reshape(out, n, r.Dim), r.rstd, layerkit.Reshape(x, n, r.Dim), layerkit.Reshape(res, n, r.Dim), r.W.W, r.Eps)
	r.x = h2
	return layerkit.Sticky(r.b, r.what(), "forward")
}

// BackwardAdd is Backward with the residual stream's gradient added: dx =
// ∂L/∂x through the norm + dres (one op, tensor.Backend.RMSNormBackwardAdd;
// dx may alias dres), and ∂L/∂w added.
func (r *RMSNorm) BackwardAdd(dx, dout, dres *tensor.Tensor) error {
	if r.x == nil {
		return errors.New(r.what() + ": Backward without a successful Forward")
	}
	dt, n := r.W.W.DType(), r.x.Dim(0)
	for _, t := range []struct {
		what string
		t    *tensor.Tensor
	}{{"output gradient", dout}, {"input gradient dx", dx}, {"residual gradient", dres}} {
		if err := layerkit.CheckRowsN(r.b, r.what(), t.what, t.t, dt, r.Dim, n, "like the forward's input"); err != nil {
			return err
		}
	}
	if err := layerkit.CheckApart(r.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	r.b.RMSNormBackwardAdd(layerkit.Reshape(dx, n, r.Dim), r.W.G, layerkit.Reshape(dout, n, r.Dim), r.x, r.W.W, r.rstd, layerkit.Reshape(dres, n, r.Dim))
	return layerkit.Sticky(r.b, r.what(), "backward")
}
