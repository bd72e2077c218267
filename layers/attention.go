package layers

import (
	"errors"
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// AttentionConfig describes a causal self-attention layer.
type AttentionConfig struct {
	Dim, Heads int
	RopeTheta  float64 // base of the rotary embedding (10000 is usual)
	Std        float64 // init std of wq, wk, wv
	OutStd     float64 // init std of wo (the residual branch's output)
}

// Attention is causal multi-head self-attention with rotary position
// embedding. The heads split the width: Dim = Heads·HeadDim. q, k and v are
// the (B*T, Dim) projections viewed as (B, T, Heads, HeadDim); RoPE turns q
// and k; the scores are scaled by 1/sqrt(HeadDim).
type Attention struct {
	Name                string
	Dim, Heads, HeadDim int
	Theta               float64
	Wq, Wk, Wv, Wo      *Linear // Dim → Dim each

	b        tensor.Backend
	bt       [2]int         // B, T of the last Forward; zeros before a successful one
	q, k, v  *tensor.Tensor // (B*T, Dim) projections (v is read as (B, T, H, D))
	qr, kr   *tensor.Tensor // (B, T, H, D) q and k after RoPE
	att      *tensor.Tensor // (B, T, H, D) attention output, the input of wo
	lse      *tensor.Tensor // (B, H, T) log-sum-exp of each row of scores
	datt     *tensor.Tensor // (B*T, Dim) backward scratch: ∂L/∂att
	dqr, dkr *tensor.Tensor // (B, T, H, D) backward scratch: ∂L/∂qr, ∂L/∂kr
	dq, dk   *tensor.Tensor // (B*T, Dim) backward scratch: ∂L/∂q, ∂L/∂k
	dv       *tensor.Tensor // (B*T, Dim) backward scratch: ∂L/∂v
}

// NewAttention registers name+".wq", ".wk", ".wv" and ".wo".
func NewAttention(b tensor.Backend, ps *ParamSet, name string, cfg AttentionConfig) (*Attention, error) {
	if cfg.Dim <= 0 || cfg.Heads <= 0 || cfg.Dim%cfg.Heads != 0 {
		return nil, fmt.Errorf("layers: attention %q: Dim = %d, Heads = %d, expected positive sizes with Heads dividing Dim", name, cfg.Dim, cfg.Heads)
	}
	hd := cfg.Dim / cfg.Heads
	if hd%2 != 0 {
		return nil, fmt.Errorf("layers: attention %q: head dim %d = Dim/Heads is odd, expected it even (RoPE turns pairs)", name, hd)
	}
	if !(cfg.RopeTheta > 0) {
		return nil, fmt.Errorf("layers: attention %q: RopeTheta = %v, expected > 0", name, cfg.RopeTheta)
	}
	a := &Attention{Name: name, Dim: cfg.Dim, Heads: cfg.Heads, HeadDim: hd, Theta: cfg.RopeTheta, b: b}
	lin := func(suffix string, std float64) (*Linear, error) {
		return NewLinear(b, ps, name+"."+suffix, LinearConfig{In: cfg.Dim, Out: cfg.Dim, Std: std})
	}
	var err error
	if a.Wq, err = lin("wq", cfg.Std); err != nil {
		return nil, err
	}
	if a.Wk, err = lin("wk", cfg.Std); err != nil {
		return nil, err
	}
	if a.Wv, err = lin("wv", cfg.Std); err != nil {
		return nil, err
	}
	if a.Wo, err = lin("wo", cfg.OutStd); err != nil {
		return nil, err
	}
	return a, nil
}

// Params returns wq, wk, wv, wo.
func (a *Attention) Params() []*Param {
	return []*Param{a.Wq.W, a.Wk.W, a.Wv.W, a.Wo.W}
}

// Scale is the factor of the scores, 1/sqrt(HeadDim).
func (a *Attention) Scale() float32 { return float32(1 / math.Sqrt(float64(a.HeadDim))) }

func (a *Attention) what() string { return "attention " + a.Name }

// Forward writes out (B, T, Dim) from x (B, T, Dim); position t attends to
// positions [0, t] of its own sequence.
func (a *Attention) Forward(out, x *tensor.Tensor) error {
	a.bt = [2]int{}
	if err := checkParams(a.what(), a.Params()...); err != nil {
		return err
	}
	dt := a.Wq.W.W.DType()
	if err := checkOn(a.b, a.what(), "input x", x, dt); err != nil {
		return err
	}
	if s := x.Shape(); len(s) != 3 || s[2] != a.Dim || s[0] <= 0 || s[1] <= 0 {
		return fmt.Errorf("layers: %s: input x has shape %v, expected (B, T, %d)", a.what(), s, a.Dim)
	}
	B, T, C, H, D := x.Dim(0), x.Dim(1), a.Dim, a.Heads, a.HeadDim
	if err := checkShape(a.b, a.what(), "output", out, dt, B, T, C); err != nil {
		return err
	}
	if err := checkApart(a.what(), "output", out, "input x", x); err != nil {
		return err
	}
	N := B * T
	a.q = ensure(a.b, a.q, dt, N, C)
	a.k = ensure(a.b, a.k, dt, N, C)
	a.v = ensure(a.b, a.v, dt, N, C)
	a.qr = ensure(a.b, a.qr, dt, B, T, H, D)
	a.kr = ensure(a.b, a.kr, dt, B, T, H, D)
	a.att = ensure(a.b, a.att, dt, B, T, H, D)
	a.lse = ensure(a.b, a.lse, statDType(dt), B, H, T)

	x2 := reshape(x, N, C)
	for _, p := range []struct {
		l   *Linear
		out *tensor.Tensor
	}{{a.Wq, a.q}, {a.Wk, a.k}, {a.Wv, a.v}} {
		if err := p.l.Forward(p.out, x2); err != nil {
			return err
		}
	}
	a.b.RoPE(a.qr, reshape(a.q, B, T, H, D), a.Theta)
	a.b.RoPE(a.kr, reshape(a.k, B, T, H, D), a.Theta)
	a.b.Attention(a.att, a.lse, a.qr, a.kr, reshape(a.v, B, T, H, D), a.Scale())
	if err := a.Wo.Forward(reshape(out, N, C), reshape(a.att, N, C)); err != nil {
		return err
	}
	a.bt = [2]int{B, T}
	return sticky(a.b, a.what(), "forward")
}

// Backward overwrites dx (B, T, Dim) with ∂L/∂x and adds the weight
// gradients, from dout (B, T, Dim).
func (a *Attention) Backward(dx, dout *tensor.Tensor) error {
	if a.bt[0] == 0 {
		return errors.New("layers: " + a.what() + ": Backward without a successful Forward")
	}
	dt := a.Wq.W.W.DType()
	B, T, C, H, D := a.bt[0], a.bt[1], a.Dim, a.Heads, a.HeadDim
	N := B * T
	if err := checkShape(a.b, a.what(), "output gradient", dout, dt, B, T, C); err != nil {
		return err
	}
	if err := checkShape(a.b, a.what(), "input gradient dx", dx, dt, B, T, C); err != nil {
		return err
	}
	if err := checkApart(a.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	a.datt = ensure(a.b, a.datt, dt, N, C)
	a.dqr = ensure(a.b, a.dqr, dt, B, T, H, D)
	a.dkr = ensure(a.b, a.dkr, dt, B, T, H, D)
	a.dq = ensure(a.b, a.dq, dt, N, C)
	a.dk = ensure(a.b, a.dk, dt, N, C)
	a.dv = ensure(a.b, a.dv, dt, N, C)

	if err := a.Wo.Backward(a.datt, reshape(dout, N, C)); err != nil {
		return err
	}
	a.b.AttentionBackward(a.dqr, a.dkr, reshape(a.dv, B, T, H, D), reshape(a.datt, B, T, H, D),
		a.qr, a.kr, reshape(a.v, B, T, H, D), a.att, a.lse, a.Scale())
	a.b.RoPEBackward(reshape(a.dq, B, T, H, D), a.dqr, a.Theta)
	a.b.RoPEBackward(reshape(a.dk, B, T, H, D), a.dkr, a.Theta)
	dx2 := reshape(dx, N, C)
	if err := a.Wq.Backward(dx2, a.dq); err != nil {
		return err
	}
	if err := a.Wk.BackwardAccumulate(dx2, a.dk); err != nil {
		return err
	}
	if err := a.Wv.BackwardAccumulate(dx2, a.dv); err != nil {
		return err
	}
	return sticky(a.b, a.what(), "backward")
}
