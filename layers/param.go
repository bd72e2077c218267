package layers

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/asynctp/asynctp/tensor"
)

// InitFunc writes the initial values of a parameter (row-major, one per
// element) using rng, which is seeded for that parameter alone.
type InitFunc func(rng *rand.Rand, vals []float64)

// Normal draws every value from N(0, std²).
func Normal(std float64) InitFunc {
	return func(rng *rand.Rand, vals []float64) {
		for i := range vals {
			vals[i] = std * rng.NormFloat64()
		}
	}
}

// Constant sets every value to v (1 for norm weights, 0 for biases).
func Constant(v float64) InitFunc {
	return func(_ *rand.Rand, vals []float64) {
		for i := range vals {
			vals[i] = v
		}
	}
}

// ShardInit initialises one shard of a larger parameter: it draws the full
// tensor of shape full with init and keeps the slice [lo, hi) of dimension
// dim. Registered under the full parameter's name (which seeds the
// generator), a shard gets exactly the values it has in the unsharded
// model, so a tensor-parallel model starts where the plain one does. A shard
// registered with a shape of another size gets NaNs, which Materialize
// reports.
func ShardInit(init InitFunc, full []int, dim, lo, hi int) (InitFunc, error) {
	shape := tensor.Shape(full).Clone()
	if init == nil || dim < 0 || dim >= len(shape) || lo < 0 || hi <= lo || hi > shape[dim] {
		return nil, fmt.Errorf("layers: ShardInit of [%d, %d) along dimension %d of %v, expected a non-empty range inside it and an init function", lo, hi, dim, shape)
	}
	inner := shape[dim+1:].Numel() // elements per step of dim
	outer := shape[:dim].Numel()   // blocks before dim
	width := (hi - lo) * inner     // elements kept per block
	return func(rng *rand.Rand, vals []float64) {
		if len(vals) != outer*width {
			for i := range vals {
				vals[i] = math.NaN()
			}
			return
		}
		all := make([]float64, shape.Numel())
		init(rng, all)
		for o := range outer {
			src := all[(o*shape[dim]+lo)*inner:]
			copy(vals[o*width:(o+1)*width], src[:width])
		}
	}, nil
}

// Param is one parameter tensor: its weights W and gradient G, both views
// into the flat buffers of the ParamSet that holds it (nil until the set is
// materialized). Decay says whether weight decay applies to it.
type Param struct {
	Name  string         // unique in its set; it seeds the initialisation
	W, G  *tensor.Tensor // views of the set's flat weights and gradients (nil before Materialize)
	Decay bool           // whether weight decay applies

	shape tensor.Shape
	init  InitFunc
	off   int // element offset in the flat buffers, set by Materialize
}

// Shape is the parameter's shape (known from registration on).
func (p *Param) Shape() tensor.Shape { return p.shape }

// Numel is the number of elements of the parameter.
func (p *Param) Numel() int { return p.shape.Numel() }

// Offset is where the parameter starts in the flat buffers (valid after
// Materialize).
func (p *Param) Offset() int { return p.off }

// ParamSet collects the parameters of a model as layers register them, then
// materializes them as views of one flat weight buffer and one flat gradient
// buffer. The flat order is: every parameter with Decay first, then the
// others, each group in registration order; Params returns that order.
// The zero value is an empty set of seed 0 (NewParamSet(0)).
type ParamSet struct {
	seed   uint64
	params []*Param // registration order
	byName map[string]*Param

	b    tensor.Backend
	w, g *tensor.Tensor // (Numel) flat weights and gradients
	ws   *workspace     // the buffers its layers share (workspace.go)

	main    *tensor.Tensor // (Numel) fp32 main gradients of a bf16 set (UseMainGrads); nil: g
	scratch *tensor.Tensor // fp32 staging of AccumulateGrads (a run of g converted)
}

// NewParamSet returns an empty set whose initial values derive from seed.
func NewParamSet(seed uint64) *ParamSet {
	return &ParamSet{seed: seed, byName: map[string]*Param{}}
}

// Seed is the seed the set was created with.
func (s *ParamSet) Seed() uint64 { return s.seed }

// Add registers a parameter. The name must be unique in the set (it also
// seeds the parameter's initialisation), every dimension positive; init nil
// means zeros. It fails once the set is materialized.
func (s *ParamSet) Add(name string, shape []int, decay bool, init InitFunc) (*Param, error) {
	if s.w != nil {
		return nil, fmt.Errorf("layers: cannot add parameter %q: the parameter set is already materialized", name)
	}
	if name == "" {
		return nil, errors.New("layers: parameter with an empty name")
	}
	if _, dup := s.byName[name]; dup {
		return nil, fmt.Errorf("layers: parameter %q registered twice", name)
	}
	if s.byName == nil {
		s.byName = map[string]*Param{}
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("layers: parameter %q has no dimensions", name)
	}
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("layers: parameter %q has shape %v, expected positive dimensions", name, tensor.Shape(shape))
		}
	}
	if init == nil {
		init = Constant(0)
	}
	p := &Param{Name: name, Decay: decay, shape: tensor.Shape(shape).Clone(), init: init}
	s.params = append(s.params, p)
	s.byName[name] = p
	return p, nil
}

// Lookup returns the parameter called name, or nil.
func (s *ParamSet) Lookup(name string) *Param { return s.byName[name] }

// Params returns the parameters in flat-buffer order: decayed ones first,
// then the others, each group in registration order.
func (s *ParamSet) Params() []*Param {
	out := make([]*Param, 0, len(s.params))
	for _, decay := range []bool{true, false} {
		for _, p := range s.params {
			if p.Decay == decay {
				out = append(out, p)
			}
		}
	}
	return out
}

// Numel is the total number of parameter elements.
func (s *ParamSet) Numel() int {
	n := 0
	for _, p := range s.params {
		n += p.Numel()
	}
	return n
}

// DecayNumel is the number of elements with weight decay: they form the
// prefix [0, DecayNumel) of the flat buffers.
func (s *ParamSet) DecayNumel() int {
	n := 0
	for _, p := range s.params {
		if p.Decay {
			n += p.Numel()
		}
	}
	return n
}

// Materialized reports whether Materialize has succeeded.
func (s *ParamSet) Materialized() bool { return s.w != nil }

// Flat returns the flat weight and gradient buffers, both (Numel), or nils
// before Materialize.
func (s *ParamSet) Flat() (w, g *tensor.Tensor) { return s.w, s.g }

// Backend is the backend the set was materialized on, or nil.
func (s *ParamSet) Backend() tensor.Backend { return s.b }

// paramSeed is the PCG seed pair a parameter's initialisation uses: the set's
// seed and the FNV-1a hash of the name.
func paramSeed(seed uint64, name string) (uint64, uint64) {
	h := fnv.New64a()
	h.Write([]byte(name))
	return seed, h.Sum64()
}

// HostInit returns the initial values of p as the set computes them, in
// float64, independently of any backend.
func (s *ParamSet) HostInit(p *Param) []float64 {
	vals := make([]float64, p.Numel())
	p.init(rand.New(rand.NewPCG(paramSeed(s.seed, p.Name))), vals)
	return vals
}

// Materialize allocates the flat weight and gradient buffers of dtype dt on
// b, makes every parameter's W and G views into them, uploads the initial
// weights and zeroes the gradients. It may run once.
func (s *ParamSet) Materialize(b tensor.Backend, dt tensor.DType) error {
	if s.w != nil {
		return errors.New("layers: the parameter set is already materialized")
	}
	if b == nil {
		return errors.New("layers: Materialize with a nil backend")
	}
	if !dt.IsFloat() {
		return fmt.Errorf("layers: parameters of dtype %v, expected a float dtype", dt)
	}
	if err := b.Err(); err != nil {
		return fmt.Errorf("layers: the backend already holds an error: %w", err)
	}
	n := s.Numel()
	if n == 0 {
		return errors.New("layers: Materialize of an empty parameter set")
	}
	host := tensor.MustHost(tensor.Float64, n)
	vals := host.F64()
	order := s.Params()
	off := 0
	for _, p := range order {
		p.off = off
		copy(vals[off:off+p.Numel()], s.HostInit(p))
		for _, v := range vals[off : off+p.Numel()] {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("layers: initial value %v in parameter %q of shape %v, expected finite values (does its InitFunc fit the shape?)", v, p.Name, p.shape)
			}
		}
		off += p.Numel()
	}
	w, g := b.Zeros(dt, n), b.Zeros(dt, n)
	b.Upload(w, host)
	if err := b.Err(); err != nil {
		return fmt.Errorf("layers: materializing %d parameters: %w", n, err)
	}
	for _, p := range order {
		var err error
		if p.W, err = w.View(p.off, p.shape...); err != nil {
			return fmt.Errorf("layers: parameter %q: %w", p.Name, err)
		}
		if p.G, err = g.View(p.off, p.shape...); err != nil {
			return fmt.Errorf("layers: parameter %q: %w", p.Name, err)
		}
	}
	s.b, s.w, s.g = b, w, g
	return nil
}

// ZeroGrad sets every gradient to zero, the main gradients too (a no-op
// before Materialize).
func (s *ParamSet) ZeroGrad() {
	if s.g != nil {
		s.b.Fill(s.g, 0)
	}
	if s.main != nil {
		s.b.Fill(s.main, 0)
	}
}

// Stacked returns one (ΣOut, In) view of the weights and one of the
// gradients of params, 2-D parameters (Out_i, In) of one In that lie one
// after another in their flat buffers, in the order given: [W_0; W_1; ...]
// row by row. A ParamSet lays out parameters registered one after another
// with the same Decay that way, so the q, k and v projections of a layer
// (or gate and up) can run as one GEMM x·[Wq;Wk;Wv]ᵀ while they stay
// separate named parameters (checkpoints, export, TP shards). It fails,
// saying why, for parameters that are not materialized or not adjacent.
func Stacked(params ...*Param) (w, g *tensor.Tensor, err error) {
	if len(params) == 0 {
		return nil, nil, errors.New("layers: Stacked of no parameters")
	}
	first := params[0]
	if first.W == nil || first.G == nil || len(first.shape) != 2 {
		return nil, nil, fmt.Errorf("layers: Stacked: parameter %q is not a materialized (Out, In) weight", first.Name)
	}
	in, rows := first.shape[1], 0
	for i, p := range params {
		if p.W == nil || p.G == nil || len(p.shape) != 2 || p.shape[1] != in {
			return nil, nil, fmt.Errorf("layers: Stacked: parameter %q (shape %v) is not a materialized (Out, %d) weight like %q", p.Name, p.shape, in, first.Name)
		}
		for _, t := range []struct{ v, f *tensor.Tensor }{{p.W, first.W}, {p.G, first.G}} {
			if t.v.Buffer() != t.f.Buffer() || t.v.Offset() != t.f.Offset()+rows*in {
				return nil, nil, fmt.Errorf("layers: Stacked: parameter %q (#%d) does not follow %q in its flat buffer", p.Name, i, params[max(i-1, 0)].Name)
			}
		}
		rows += p.shape[0]
	}
	if w, err = tensor.New(first.W.Buffer(), first.W.Offset(), rows, in); err != nil {
		return nil, nil, fmt.Errorf("layers: Stacked: %w", err)
	}
	if g, err = tensor.New(first.G.Buffer(), first.G.Offset(), rows, in); err != nil {
		return nil, nil, fmt.Errorf("layers: Stacked: %w", err)
	}
	return w, g, nil
}
