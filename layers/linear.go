package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// LinearConfig describes a Linear layer.
type LinearConfig struct {
	In, Out int  // input and output features (the weight is (Out, In))
	Bias    bool // add a bias (initialised to 0, no weight decay)
	// Std is the standard deviation of the weight's initial values, drawn
	// from N(0, Std²): finite and > 0 (0 is refused rather than read as
	// zero weights).
	Std float64
	// Init, when set, initialises the weight instead (Std must then be 0):
	// Constant(0) for zero weights, or any InitFunc.
	Init InitFunc
}

// WeightInit is the initialisation of a weight described by std and
// init, as LinearConfig describes it (what prefixes the fields' names in
// errors: "layers: linear "fc": LinearConfig."): init when set (std must then be 0), else N(0, std²) with std
// finite and > 0.
func WeightInit(what string, std float64, init InitFunc) (InitFunc, error) {
	switch {
	case init != nil && std != 0:
		return nil, fmt.Errorf("%sStd = %v and %sInit are both set, expected one of them", what, std, what)
	case init != nil:
		return init, nil
	case !(std > 0) || math.IsInf(std, 0):
		return nil, fmt.Errorf("%sStd = %v, expected a finite value > 0 (the weight is drawn from N(0, Std²); for zero weights set Init to layers.Constant(0))", what, std)
	}
	return Normal(std), nil
}

// Linear is y = x·Wᵀ (+ bias) over the last dimension of x.
type Linear struct {
	Name    string // the layer's name, its parameters' prefix
	In, Out int    // input and output features
	W       *Param // (Out, In), weight decay
	Bias    *Param // (Out), or nil

	b tensor.Backend
	x *tensor.Tensor // (N, In): the input of the last Forward (the caller's, viewed as rows)
}

// checkStds checks the Std and OutStd of a layer's config (what names it):
// the standard deviations of its input and output projections' initial
// weights, both finite and > 0 (0 would give all-zero weights).
func checkStds(what string, std, outStd float64) error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"Std", std}, {"OutStd", outStd}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%s.%s = %v, expected a finite value > 0 (the standard deviation of the initial weights; 0 would make them all zero)", what, f.name, f.v)
		}
	}
	return nil
}

// NewLinear registers name+".weight" (and name+".bias") in ps.
func NewLinear(b tensor.Backend, ps *ParamSet, name string, cfg LinearConfig) (*Linear, error) {
	if b == nil || ps == nil {
		return nil, fmt.Errorf("layers: linear %q: nil backend or parameter set", name)
	}
	if cfg.In <= 0 || cfg.Out <= 0 {
		return nil, fmt.Errorf("layers: linear %q: In = %d, Out = %d, expected positive sizes", name, cfg.In, cfg.Out)
	}
	init, err := WeightInit(fmt.Sprintf("layers: linear %q: LinearConfig.", name), cfg.Std, cfg.Init)
	if err != nil {
		return nil, err
	}
	w, err := ps.Add(name+".weight", []int{cfg.Out, cfg.In}, true, init)
	if err != nil {
		return nil, err
	}
	var bias *Param
	if cfg.Bias {
		if bias, err = ps.Add(name+".bias", []int{cfg.Out}, false, Constant(0)); err != nil {
			return nil, err
		}
	}
	return NewLinearFromParams(b, name, w, bias)
}

// NewLinearFromParams makes a Linear over existing parameters: w (Out, In)
// and an optional bias (Out). It is how an LM head shares the token
// embedding: gradients from both uses add into the same G.
func NewLinearFromParams(b tensor.Backend, name string, w, bias *Param) (*Linear, error) {
	if b == nil || w == nil {
		return nil, fmt.Errorf("layers: linear %q: nil backend or weight", name)
	}
	s := w.Shape()
	if len(s) != 2 {
		return nil, fmt.Errorf("layers: linear %q: weight %q has shape %v, expected (Out, In)", name, w.Name, s)
	}
	if bias != nil && !bias.Shape().Equal(tensor.Shape{s[0]}) {
		return nil, fmt.Errorf("layers: linear %q: bias %q has shape %v, expected (%d)", name, bias.Name, bias.Shape(), s[0])
	}
	return &Linear{Name: name, In: s[1], Out: s[0], W: w, Bias: bias, b: b}, nil
}

// Params returns the layer's parameters (weight, then bias if any).
func (l *Linear) Params() []*Param {
	if l.Bias != nil {
		return []*Param{l.W, l.Bias}
	}
	return []*Param{l.W}
}

func (l *Linear) what() string { return "layers: linear " + l.Name }

// Forward computes y (..., Out) = x (..., In)·Wᵀ + bias and keeps x for the
// backward.
func (l *Linear) Forward(y, x *tensor.Tensor) error {
	l.x = nil
	if err := checkParams(l.what(), l.W, l.Bias); err != nil {
		return err
	}
	dt := l.W.W.DType()
	n, err := layerkit.CheckRows(l.b, l.what(), "input x", x, dt, l.In)
	if err != nil {
		return err
	}
	ny, err := layerkit.CheckRows(l.b, l.what(), "output y", y, dt, l.Out)
	if err != nil {
		return err
	}
	if ny != n {
		return fmt.Errorf("%s: output y has shape %v, expected %d rows like input x %v", l.what(), y.Shape(), n, x.Shape())
	}
	if err := layerkit.CheckApart(l.what(), "output y", y, "input x", x); err != nil {
		return err
	}
	x2, y2 := layerkit.Reshape(x, n, l.In), layerkit.Reshape(y, n, l.Out)
	l.b.MatMul(y2, x2, l.W.W, false, true, 1, 0)
	if l.Bias != nil {
		l.b.AddBias(y2, l.Bias.W)
	}
	l.x = x2
	return layerkit.Sticky(l.b, l.what(), "forward")
}

// Backward overwrites dx (..., In) with ∂L/∂x (dx nil skips it) and adds
// ∂L/∂W (and ∂L/∂bias) into the gradients, from dy (..., Out).
func (l *Linear) Backward(dx, dy *tensor.Tensor) error { return l.backward(dx, dy, 0) }

// BackwardAccumulate is Backward but adds ∂L/∂x into dx, for an input that
// feeds several layers (q, k and v projections of one activation).
func (l *Linear) BackwardAccumulate(dx, dy *tensor.Tensor) error { return l.backward(dx, dy, 1) }

func (l *Linear) backward(dx, dy *tensor.Tensor, beta float32) error {
	if l.x == nil {
		return errors.New(l.what() + ": Backward without a successful Forward")
	}
	dt, n := l.W.W.DType(), l.x.Dim(0)
	if err := layerkit.CheckRowsN(l.b, l.what(), "output gradient dy", dy, dt, l.Out, n, "like the forward's input"); err != nil {
		return err
	}
	if dx != nil {
		if err := layerkit.CheckRowsN(l.b, l.what(), "input gradient dx", dx, dt, l.In, n, "like the forward's input"); err != nil {
			return err
		}
		if err := layerkit.CheckApart(l.what(), "input gradient dx", dx, "output gradient dy", dy); err != nil {
			return err
		}
		l.b.MatMul(layerkit.Reshape(dx, n, l.In), layerkit.Reshape(dy, n, l.Out), l.W.W, false, false, 1, beta) // dx = dy·W (+ dx)
	}
	dy2 := layerkit.Reshape(dy, n, l.Out)
	l.b.MatMul(l.W.G, dy2, l.x, true, false, 1, 1) // dW += dyᵀ·x
	if l.Bias != nil {
		l.b.SumRows(l.Bias.G, dy2)
	}
	return layerkit.Sticky(l.b, l.what(), "backward")
}
