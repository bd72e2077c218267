package train

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// AdamWConfig holds the hyper-parameters of AdamW that stay fixed over a run
// (the learning rate and the clipping factor change per step).
type AdamWConfig struct {
	Beta1, Beta2, Eps float64
	WeightDecay       float64 // applied to the decayed prefix of the flat buffer only
}

// AdamW is the optimizer over a ParamSet's flat buffers, in two groups: the
// prefix [0, DecayNumel) with weight decay, the rest without. The moments m
// and v are flat buffers laid out like the parameters (fp32; f64 when the
// parameters are f64, the exact-oracle case, since the CPU backend wants one
// float dtype per op). When the parameters are stored in a lower precision
// (bf16 on a GPU) an fp32 master copy holds the weights the update is
// computed on.
type AdamW struct {
	b      tensor.Backend
	ps     *layers.ParamSet
	cfg    AdamWConfig
	w, g   *tensor.Tensor // flat parameters and gradients (Numel)
	m, v   *tensor.Tensor // flat moments (Numel)
	master *tensor.Tensor // fp32 master weights, or nil
	groups []adamGroup
}

type adamGroup struct {
	w, g, m, v, master *tensor.Tensor
	decay              bool
}

// Moment is the pair of moment views of one parameter (for checkpoints).
type Moment struct {
	Name string
	M, V *tensor.Tensor // shaped like the parameter
}

// NewAdamW allocates the moments (zero) for the materialized set ps.
func NewAdamW(b tensor.Backend, ps *layers.ParamSet, cfg AdamWConfig) (*AdamW, error) {
	if b == nil || ps == nil {
		return nil, fmt.Errorf("train: NewAdamW needs a backend and a parameter set")
	}
	w, g := ps.Flat()
	if w == nil || g == nil {
		return nil, fmt.Errorf("train: NewAdamW: the parameter set is not materialized")
	}
	n := w.Numel()
	if g.Numel() != n || ps.Numel() != n {
		return nil, fmt.Errorf("train: NewAdamW: flat weights have %d elements, gradients %d, the set %d", n, g.Numel(), ps.Numel())
	}
	dn := ps.DecayNumel()
	if dn < 0 || dn > n {
		return nil, fmt.Errorf("train: NewAdamW: %d decayed elements out of %d", dn, n)
	}
	if err := checkLayout(ps, w); err != nil {
		return nil, err
	}
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("train: NewAdamW: the backend already holds an error: %w", err)
	}
	o := &AdamW{b: b, ps: ps, cfg: cfg, w: w, g: g}
	mdt := tensor.Float32
	switch w.DType() {
	case tensor.Float64:
		mdt = tensor.Float64
	case tensor.Float32:
	case tensor.BFloat16:
		o.master = b.Zeros(tensor.Float32, n)
		b.Copy(o.master, w)
	default:
		return nil, fmt.Errorf("train: NewAdamW: parameters of dtype %v, want a float dtype", w.DType())
	}
	o.m, o.v = b.Zeros(mdt, n), b.Zeros(mdt, n)
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("train: allocating AdamW state for %d parameters: %w", n, err)
	}
	for _, r := range []struct {
		lo, hi int
		decay  bool
	}{{0, dn, true}, {dn, n, false}} {
		if r.hi == r.lo {
			continue
		}
		var gr adamGroup
		var err error
		gr.decay = r.decay
		views := []struct {
			dst **tensor.Tensor
			src *tensor.Tensor
		}{{&gr.w, w}, {&gr.g, g}, {&gr.m, o.m}, {&gr.v, o.v}, {&gr.master, o.master}}
		for _, vw := range views {
			if vw.src == nil {
				continue
			}
			if *vw.dst, err = vw.src.View(r.lo, r.hi-r.lo); err != nil {
				return nil, fmt.Errorf("train: AdamW group view: %w", err)
			}
		}
		o.groups = append(o.groups, gr)
	}
	return o, nil
}

// checkLayout makes sure every parameter view lies in the flat buffer at
// its offset, so per-parameter moment views line up with it.
func checkLayout(ps *layers.ParamSet, w *tensor.Tensor) error {
	n := w.Numel()
	for _, p := range ps.Params() {
		if p.W == nil || p.G == nil {
			return fmt.Errorf("train: parameter %q has no weight or gradient view", p.Name)
		}
		off := p.Offset()
		if off < 0 || off+p.W.Numel() > n || p.W.Offset()-w.Offset() != off {
			return fmt.Errorf("train: parameter %q at offset %d (view offset %d) does not lie in the flat buffer of %d elements", p.Name, off, p.W.Offset()-w.Offset(), n)
		}
	}
	return nil
}

// Params is the parameter set the optimizer updates.
func (o *AdamW) Params() *layers.ParamSet { return o.ps }

// Config returns the fixed hyper-parameters.
func (o *AdamW) Config() AdamWConfig { return o.cfg }

// MomentDType is the dtype of m and v.
func (o *AdamW) MomentDType() tensor.DType { return o.m.DType() }

// Master returns the flat fp32 master weights, or nil when the parameters
// are themselves fp32 or f64.
func (o *AdamW) Master() *tensor.Tensor { return o.master }

// Flat returns the flat moment buffers.
func (o *AdamW) Flat() (m, v *tensor.Tensor) { return o.m, o.v }

// Moments returns per-parameter views of m and v, in the order of
// Params().Params().
func (o *AdamW) Moments() ([]Moment, error) {
	var out []Moment
	for _, p := range o.ps.Params() {
		m, err := o.m.View(p.Offset(), p.W.Shape()...)
		if err != nil {
			return nil, fmt.Errorf("train: moment view of %q: %w", p.Name, err)
		}
		v, err := o.v.View(p.Offset(), p.W.Shape()...)
		if err != nil {
			return nil, fmt.Errorf("train: moment view of %q: %w", p.Name, err)
		}
		out = append(out, Moment{Name: p.Name, M: m, V: v})
	}
	return out, nil
}

// masterView is the fp32 master view of p, or nil.
func (o *AdamW) masterView(p *layers.Param) (*tensor.Tensor, error) {
	if o.master == nil {
		return nil, nil
	}
	return o.master.View(p.Offset(), p.W.Shape()...)
}

// GradNorm is the global L2 norm of the flat gradient: sqrt(Σ g²), one pass.
func (o *AdamW) GradNorm() (float64, error) {
	ss := o.b.SumSquares(o.g)
	if err := o.b.Err(); err != nil {
		return 0, fmt.Errorf("train: gradient norm: %w", err)
	}
	return math.Sqrt(ss), nil
}

// GradSumSquaresTo adds Σ g² of the flat gradient to dst (one element of
// MomentDType) on the device, without waiting (tensor.Backend.SumSquaresTo).
func (o *AdamW) GradSumSquaresTo(dst *tensor.Tensor) error {
	o.b.SumSquaresTo(dst, o.g)
	if err := o.b.Err(); err != nil {
		return fmt.Errorf("train: gradient norm: %w", err)
	}
	return nil
}

// StepClipped is Step with the clipping factor computed on the device from
// normSq (one element holding Σ g² of the whole gradient, of MomentDType):
// min(1, clip/(sqrt(normSq)+1e-6)), as ClipScale computes it from the norm;
// a non-finite normSq leaves the weights and moments as they are (the
// update is skipped on the device). Nothing is read back to the host.
func (o *AdamW) StepClipped(step int, lr float64, normSq *tensor.Tensor, clip float64) error {
	if step < 1 {
		return fmt.Errorf("train: AdamW step %d, want >= 1", step)
	}
	if normSq == nil {
		return fmt.Errorf("train: AdamW step %d: no gradient norm tensor", step)
	}
	for _, gr := range o.groups {
		hp := tensor.AdamW{
			LR:     float32(lr),
			Beta1:  float32(o.cfg.Beta1),
			Beta2:  float32(o.cfg.Beta2),
			Eps:    float32(o.cfg.Eps),
			Step:   step,
			NormSq: normSq,
			Clip:   float32(clip),
		}
		if gr.decay {
			hp.WeightDecay = float32(o.cfg.WeightDecay)
		}
		o.b.AdamW(gr.w, gr.g, gr.m, gr.v, gr.master, hp)
	}
	if err := o.b.Err(); err != nil {
		return fmt.Errorf("train: AdamW step %d: %w", step, err)
	}
	return nil
}

// ClipScale is the factor that brings a gradient of global norm norm down to
// at most clip: min(1, clip/(norm+1e-6)). clip <= 0 means no clipping (1).
func ClipScale(norm, clip float64) float64 {
	if clip <= 0 {
		return 1
	}
	return math.Min(1, clip/(norm+1e-6))
}

// Step applies one AdamW update, number step (1-based, for bias
// correction), with learning rate lr, the gradients multiplied by gradScale
// inside the op (clipping without an extra pass).
func (o *AdamW) Step(step int, lr, gradScale float64) error {
	if step < 1 {
		return fmt.Errorf("train: AdamW step %d, want >= 1", step)
	}
	if !(gradScale > 0) || math.IsInf(gradScale, 0) {
		return fmt.Errorf("train: AdamW step %d: gradient scale %v, want a finite value > 0", step, gradScale)
	}
	for _, gr := range o.groups {
		hp := tensor.AdamW{
			LR:        float32(lr),
			Beta1:     float32(o.cfg.Beta1),
			Beta2:     float32(o.cfg.Beta2),
			Eps:       float32(o.cfg.Eps),
			Step:      step,
			GradScale: float32(gradScale),
		}
		if gr.decay {
			hp.WeightDecay = float32(o.cfg.WeightDecay)
		}
		o.b.AdamW(gr.w, gr.g, gr.m, gr.v, gr.master, hp)
	}
	if err := o.b.Err(); err != nil {
		return fmt.Errorf("train: AdamW step %d: %w", step, err)
	}
	return nil
}
