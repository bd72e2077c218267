package optim

import (
	"errors"
	"fmt"
	"math"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// AdamWConfig holds the hyper-parameters of AdamW that stay fixed over a run
// (the learning rate and the clipping factor are given per step). Every
// field is used as given: zero is a real setting of Beta1 (no momentum) and
// of WeightDecay, and Validate refuses the values that make NaNs.
type AdamWConfig struct {
	// Beta1 is the decay of the first moment m, in [0, 1).
	Beta1 float64
	// Beta2 is the decay of the second moment v, in [0, 1): the bias
	// correction divides by 1 − Beta2^step.
	Beta2 float64
	// Eps is added to sqrt(v̂) in the update's denominator: finite and > 0
	// (with 0 a parameter whose gradient is 0 gets 0/0).
	Eps float64
	// WeightDecay is the decoupled decay p −= lr·WeightDecay·p, finite and
	// ≥ 0, applied to the parameters with Decay only.
	WeightDecay float64
}

// DefaultAdamWConfig is PyTorch's and Megatron-LM's AdamW default: betas
// (0.9, 0.999), eps 1e-8, weight decay 0.01.
func DefaultAdamWConfig() AdamWConfig {
	return AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}
}

// Validate reports the first field that would turn the weights into NaN or
// make no sense, naming it, the value found and what is allowed.
func (c AdamWConfig) Validate() error {
	bad := func(field string, v float64, want string) error {
		return fmt.Errorf("optim: AdamWConfig.%s = %v, expected %s", field, v, want)
	}
	switch {
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return bad("Beta1", c.Beta1, "a value in [0, 1) (the bias correction divides by 1 − Beta1^step)")
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return bad("Beta2", c.Beta2, "a value in [0, 1) (the bias correction divides by 1 − Beta2^step)")
	case !(c.Eps > 0) || math.IsInf(c.Eps, 0):
		return bad("Eps", c.Eps, "a finite value > 0 (it keeps the update's denominator sqrt(v̂) + Eps above 0)")
	case !(c.WeightDecay >= 0) || math.IsInf(c.WeightDecay, 0):
		return bad("WeightDecay", c.WeightDecay, "a finite value ≥ 0 (0 turns weight decay off)")
	}
	return nil
}

// checkLR refuses a learning rate that would corrupt the weights.
func checkLR(step int, lr float64) error {
	if !(lr >= 0) || math.IsInf(lr, 0) {
		return fmt.Errorf("optim: AdamW step %d: learning rate %v, expected a finite value ≥ 0", step, lr)
	}
	return nil
}

// AdamW is the optimizer over a ParamSet's flat buffers: its weights and
// its main gradients (layers.ParamSet.MainGrads: the fp32 main gradients
// of a bf16 set that has them, else the gradients). Its state is kept
// per segment of the flat buffers, a range [lo, hi) of parameters that
// share their weight decay: the prefix with weight decay and the rest
// (layers.ParamSet lays the decayed parameters out first). The moments m
// and v are flat buffers laid out like the parameters (fp32; f64 when the
// parameters are f64, the exact-oracle case, since the CPU backend wants
// one float dtype per op). When the parameters are stored in a lower
// precision (bf16 on a GPU) an fp32 master copy holds the weights the
// update is computed on.
//
// Every element's update depends on that element's weight, gradient and
// moments only, so the state of a range of the flat buffers can live on
// one rank of a data-parallel group and be updated there alone (a sharded
// optimizer).
type AdamW struct {
	b      tensor.Backend
	ps     *layers.ParamSet
	cfg    AdamWConfig
	w, g   *tensor.Tensor // flat parameters and gradients (Numel)
	m, v   *tensor.Tensor // flat moments (Numel)
	master *tensor.Tensor // fp32 master weights, or nil
	segs   []segment
	normSq *tensor.Tensor // ClipStep's Σ g², kept across steps
	// sharded: a rank of a distributed optimizer (NewShardedAdamW): g, m,
	// v and master are packed runs of sharded.Ranges.
	sharded *Sharding
}

// segment is the state of the range [lo, hi) of the flat buffers, whose
// parameters all have weight decay or all have none: views of the
// parameters, gradients, moments and master weights.
type segment struct {
	lo, hi             int
	decay              bool
	w, g, m, v, master *tensor.Tensor
}

// Moment is the pair of moment views of one parameter (for checkpoints).
type Moment struct {
	Name string         // the parameter's name
	M, V *tensor.Tensor // views of the flat moments, shaped like the parameter
}

// NewAdamW is NewAdamWWithConfig with DefaultAdamWConfig.
func NewAdamW(b tensor.Backend, ps *layers.ParamSet) (*AdamW, error) {
	return NewAdamWWithConfig(b, ps, DefaultAdamWConfig())
}

// NewAdamWWithConfig allocates the moments (zero), and the fp32 master
// weights when the parameters are bf16, for the materialized set ps. A
// config that fails Validate is refused.
func NewAdamWWithConfig(b tensor.Backend, ps *layers.ParamSet, cfg AdamWConfig) (*AdamW, error) {
	if b == nil || ps == nil {
		return nil, errors.New("optim: NewAdamW needs a backend and a parameter set")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w, _ := ps.Flat()
	g := ps.MainGrads() // the fp32 main gradients of a bf16 set that has them
	if w == nil || g == nil {
		return nil, errors.New("optim: NewAdamW: the parameter set is not materialized (ParamSet.Materialize)")
	}
	n := w.Numel()
	if g.Numel() != n || ps.Numel() != n {
		return nil, fmt.Errorf("optim: NewAdamW: flat weights have %d elements, gradients %d, the set %d", n, g.Numel(), ps.Numel())
	}
	dn := ps.DecayNumel()
	if dn < 0 || dn > n {
		return nil, fmt.Errorf("optim: NewAdamW: %d decayed elements out of %d", dn, n)
	}
	if err := checkLayout(ps, w); err != nil {
		return nil, err
	}
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("optim: NewAdamW: the backend already holds an error: %w", err)
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
		return nil, fmt.Errorf("optim: NewAdamW: parameters of dtype %v, expected a float dtype", w.DType())
	}
	o.m, o.v = b.Zeros(mdt, n), b.Zeros(mdt, n)
	if err := b.Err(); err != nil {
		return nil, fmt.Errorf("optim: allocating AdamW state for %d parameters: %w", n, err)
	}
	for _, s := range []segment{{lo: 0, hi: dn, decay: true}, {lo: dn, hi: n}} {
		if s.hi == s.lo {
			continue
		}
		for _, vw := range []struct {
			dst **tensor.Tensor
			src *tensor.Tensor
		}{{&s.w, w}, {&s.g, g}, {&s.m, o.m}, {&s.v, o.v}, {&s.master, o.master}} {
			if vw.src == nil {
				continue
			}
			var err error
			if *vw.dst, err = vw.src.View(s.lo, s.hi-s.lo); err != nil {
				return nil, fmt.Errorf("optim: AdamW segment [%d, %d): %w", s.lo, s.hi, err)
			}
		}
		o.segs = append(o.segs, s)
	}
	return o, nil
}

// checkLayout makes sure every parameter view lies in the flat buffer at
// its offset, so per-parameter moment views line up with it.
func checkLayout(ps *layers.ParamSet, w *tensor.Tensor) error {
	n := w.Numel()
	for _, p := range ps.Params() {
		if p.W == nil || p.G == nil {
			return fmt.Errorf("optim: parameter %q has no weight or gradient view", p.Name)
		}
		off := p.Offset()
		if off < 0 || off+p.W.Numel() > n || p.W.Offset()-w.Offset() != off {
			return fmt.Errorf("optim: parameter %q at offset %d (view offset %d) does not lie in the flat buffer of %d elements", p.Name, off, p.W.Offset()-w.Offset(), n)
		}
	}
	return nil
}

// Params is the parameter set the optimizer updates.
func (o *AdamW) Params() *layers.ParamSet { return o.ps }

// Config returns the fixed hyper-parameters.
func (o *AdamW) Config() AdamWConfig { return o.cfg }

// ParamDType is the dtype of the parameters.
func (o *AdamW) ParamDType() tensor.DType { return o.w.DType() }

// MomentDType is the dtype of m and v (and of the one-element Σ g² tensors
// StepClipped and GradSumSquaresTo take).
func (o *AdamW) MomentDType() tensor.DType { return o.m.DType() }

// Master returns the flat fp32 master weights, or nil when the parameters
// are themselves fp32 or f64.
func (o *AdamW) Master() *tensor.Tensor { return o.master }

// MasterView returns p's view of the master weights, shaped like p, or nil
// when there are none.
func (o *AdamW) MasterView(p *layers.Param) (*tensor.Tensor, error) {
	if o.sharded != nil {
		return nil, errSharded("MasterView")
	}
	if o.master == nil {
		return nil, nil
	}
	v, err := o.master.View(p.Offset(), p.W.Shape()...)
	if err != nil {
		return nil, fmt.Errorf("optim: master view of %q: %w", p.Name, err)
	}
	return v, nil
}

// SyncParams copies the master weights, rounded, into the parameters,
// after the master weights were written (a checkpoint load); a no-op when
// there are none.
// For a rank of a distributed optimizer: the master weights of its
// ranges, then Gather.
func (o *AdamW) SyncParams() error {
	if o.master != nil {
		if o.sharded == nil {
			o.b.Copy(o.w, o.master)
		} else {
			for _, s := range o.segs {
				o.b.Copy(s.w, s.master)
			}
		}
		if err := o.b.Err(); err != nil {
			return fmt.Errorf("optim: rounding the master weights into the parameters: %w", err)
		}
	}
	return o.gather()
}

// gather calls a distributed optimizer's Gather.
func (o *AdamW) gather() error {
	if o.sharded == nil || o.sharded.Gather == nil {
		return nil
	}
	if err := o.sharded.Gather(); err != nil {
		return fmt.Errorf("optim: gathering the updated parameters: %w", err)
	}
	return nil
}

// errSharded refuses a whole-parameter view of a distributed optimizer.
func errSharded(what string) error {
	return fmt.Errorf("optim: %s of a rank of a distributed optimizer, which holds runs of the parameters' state: use StatePieces", what)
}

// Flat returns the flat moment buffers.
func (o *AdamW) Flat() (m, v *tensor.Tensor) { return o.m, o.v }

// Moments returns per-parameter views of m and v, in the order of
// Params().Params().
func (o *AdamW) Moments() ([]Moment, error) {
	if o.sharded != nil {
		return nil, errSharded("Moments")
	}
	var out []Moment
	for _, p := range o.ps.Params() {
		m, err := o.m.View(p.Offset(), p.W.Shape()...)
		if err != nil {
			return nil, fmt.Errorf("optim: moment view of %q: %w", p.Name, err)
		}
		v, err := o.v.View(p.Offset(), p.W.Shape()...)
		if err != nil {
			return nil, fmt.Errorf("optim: moment view of %q: %w", p.Name, err)
		}
		out = append(out, Moment{Name: p.Name, M: m, V: v})
	}
	return out, nil
}

// GradNorm is the L2 norm of this rank's flat gradient, sqrt(Σ g²), read
// back to the host: the global gradient norm of a model of one rank (a
// sharded model's is grads.Reducer's).
func (o *AdamW) GradNorm() (float64, error) {
	if o.sharded != nil {
		return 0, fmt.Errorf("optim: the gradient norm of a rank of a distributed optimizer is the model's (over every rank's runs: grads.Reducer)")
	}
	ss := o.b.SumSquares(o.g)
	if err := o.b.Err(); err != nil {
		return 0, fmt.Errorf("optim: gradient norm: %w", err)
	}
	return math.Sqrt(ss), nil
}

// GradSumSquaresTo adds Σ g² of this rank's flat gradient to dst (one
// element of MomentDType) on the device, without waiting
// (tensor.Backend.SumSquaresTo). It makes the optimizer a
// DeviceGradSumSquarer for a model of one rank.
func (o *AdamW) GradSumSquaresTo(dst *tensor.Tensor) error {
	if o.sharded != nil {
		return fmt.Errorf("optim: the gradient norm of a rank of a distributed optimizer is the model's (over every rank's runs: grads.Reducer)")
	}
	o.b.SumSquaresTo(dst, o.g)
	if err := o.b.Err(); err != nil {
		return fmt.Errorf("optim: gradient norm: %w", err)
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

// checkClip refuses a clipping threshold that is NaN, infinite or negative.
func checkClip(step int, clip float64) error {
	if !(clip >= 0) || math.IsInf(clip, 0) {
		return fmt.Errorf("optim: AdamW step %d: clipping threshold %v, expected a finite value ≥ 0 (0 turns clipping off)", step, clip)
	}
	return nil
}

// Step applies one AdamW update, number step (1-based, for bias
// correction), with learning rate lr (finite, ≥ 0), the gradients
// multiplied by gradScale (finite, > 0) inside the op: clipping by a norm
// known on the host, ClipScale(norm, clip), without an extra pass.
func (o *AdamW) Step(step int, lr, gradScale float64) error {
	if step < 1 {
		return fmt.Errorf("optim: AdamW step %d, expected a step ≥ 1", step)
	}
	if err := checkLR(step, lr); err != nil {
		return err
	}
	if !(gradScale > 0) || math.IsInf(gradScale, 0) {
		return fmt.Errorf("optim: AdamW step %d: gradient scale %v, expected a finite value > 0", step, gradScale)
	}
	return o.update(step, tensor.AdamW{LR: float32(lr), GradScale: float32(gradScale)})
}

// StepClipped is Step with the clipping factor computed on the device from
// normSq (one element of MomentDType holding Σ g² of the whole gradient):
// min(1, clip/(sqrt(normSq)+1e-6)), as ClipScale computes it from the norm,
// clip = 0 meaning none; a non-finite normSq leaves the weights and moments
// as they are (the update is skipped on the device). Nothing is read back
// to the host.
func (o *AdamW) StepClipped(step int, lr float64, normSq *tensor.Tensor, clip float64) error {
	if step < 1 {
		return fmt.Errorf("optim: AdamW step %d, expected a step ≥ 1", step)
	}
	if err := checkLR(step, lr); err != nil {
		return err
	}
	if err := checkClip(step, clip); err != nil {
		return err
	}
	if normSq == nil || normSq.Numel() != 1 {
		return fmt.Errorf("optim: AdamW step %d: gradient norm tensor %v, expected one element", step, normSq)
	}
	return o.update(step, tensor.AdamW{LR: float32(lr), NormSq: normSq, Clip: float32(clip)})
}

// update runs the backend's AdamW on every segment with hp's per-step
// fields and the config's.
func (o *AdamW) update(step int, hp tensor.AdamW) error {
	if g := o.ps.MainGrads(); g != o.g && o.sharded == nil {
		return fmt.Errorf("optim: AdamW step %d: the parameter set's main gradients changed after the optimizer was made (%v, made with %v): call UseMainGrads before NewAdamW", step, g, o.g)
	}
	hp.Beta1, hp.Beta2, hp.Eps, hp.Step = float32(o.cfg.Beta1), float32(o.cfg.Beta2), float32(o.cfg.Eps), step
	for _, s := range o.segs {
		h := hp
		if s.decay {
			h.WeightDecay = float32(o.cfg.WeightDecay)
		}
		o.b.AdamW(s.w, s.g, s.m, s.v, s.master, h)
	}
	if err := o.b.Err(); err != nil {
		return fmt.Errorf("optim: AdamW step %d: %w", step, err)
	}
	return o.gather()
}

// DeviceGradSumSquarer adds Σ g² of a whole model's gradient to a
// one-element device tensor, each parameter counted once, without reading
// anything back. Over a model sharded over ranks it is collective and gives
// the same sum on every rank (grads.Reducer, parallel/model.Model have it);
// the optimizer itself has it for a model of one rank.
type DeviceGradSumSquarer interface {
	// GradSumSquaresTo adds Σ g² to dst (one element, the optimizer's
	// MomentDType) on the device.
	GradSumSquaresTo(dst *tensor.Tensor) error
}

// ClipStep is a training step's update after the backward, with nothing
// read back to the host: Σ g² of the whole gradient into a device scalar
// (from ss, or from this rank's flat gradient when ss is nil), then
// StepClipped by it (an update skipped on the device when Σ g² is not
// finite, so a NaN gradient never reaches the weights). It returns the
// queued read of Σ g² (tensor.ReadAsync): its Wait gives the value, to
// report the norm and to stop a run whose norm is not finite.
func (o *AdamW) ClipStep(step int, lr, clip float64, ss DeviceGradSumSquarer) (tensor.HostRead, error) {
	if err := checkLR(step, lr); err != nil {
		return nil, err
	}
	if err := checkClip(step, clip); err != nil {
		return nil, err
	}
	if o.normSq == nil {
		o.normSq = o.b.Zeros(o.MomentDType(), 1)
	}
	o.b.Fill(o.normSq, 0)
	if ss == nil {
		ss = o
	}
	if err := ss.GradSumSquaresTo(o.normSq); err != nil {
		return nil, fmt.Errorf("optim: AdamW step %d: %w", step, err)
	}
	if err := o.StepClipped(step, lr, o.normSq, clip); err != nil {
		return nil, err
	}
	read := tensor.ReadAsync(o.b, o.normSq)
	if err := o.b.Err(); err != nil {
		return nil, fmt.Errorf("optim: AdamW step %d: %w", step, err)
	}
	return read, nil
}
