package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// AttentionConfig describes a causal self-attention layer.
type AttentionConfig struct {
	Dim, Heads int // the model's width and its query heads (Heads divides Dim)
	// KVHeads is the number of key/value heads (grouped-query attention:
	// each serves Heads/KVHeads query heads); 0 means Heads (multi-head
	// attention).
	KVHeads   int
	RopeTheta float64 // base of the rotary embedding (10000 is usual)
	Std       float64 // init std of wq, wk, wv
	OutStd    float64 // init std of wo (the residual branch's output)
}

// kvHeads is c's KVHeads with the default filled in.
func (c AttentionConfig) kvHeads() int {
	if c.KVHeads == 0 {
		return c.Heads
	}
	return c.KVHeads
}

// Attention is causal self-attention with rotary position embedding and
// grouped-query heads. The query heads split the width: Dim =
// Heads·HeadDim; q is the (B*T, Dim) projection viewed as (B, T, Heads,
// HeadDim), k and v the (B*T, KVHeads·HeadDim) projections viewed as (B, T,
// KVHeads, HeadDim), query head h reading key/value head h/(Heads/KVHeads)
// (KVHeads = Heads: multi-head attention); RoPE turns q and k; the scores
// are scaled by 1/sqrt(HeadDim).
type Attention struct {
	Name                         string  // the layer's name, its parameters' prefix
	Dim, Heads, KVHeads, HeadDim int     // width, query heads, key/value heads, Dim/Heads
	Theta                        float64 // base of the rotary embedding
	Wq, Wo                       *Linear // Dim → Dim each
	Wk, Wv                       *Linear // Dim → KVHeads·HeadDim each

	b    tensor.Backend
	bt   [2]int // B, T of the last Forward; zeros before a successful one
	rows bool   // the last Forward was ForwardSeq: its tensors are (B·T, Dim) rows
	core *AttentionCore

	x          *tensor.Tensor // (B·T, Dim): the last forward's input (the stacked path)
	wqkv, gqkv *tensor.Tensor // (Dim + 2·KVHeads·HeadDim, Dim) views of wq, wk, wv and their gradients, or nil
	stacked    bool           // the last forward ran the stacked path
}

// unstacked turns the one-GEMM q, k, v (and gate, up) projections off, for
// the tests that compare the stacked assembly with the three linears.
var unstacked = false

// stackedQKV returns the (Dim + 2·KVHeads·HeadDim, Dim) views of wq, wk, wv and of their
// gradients when the three lie one after another in the flat buffers (as
// NewAttention registers them), else nils: the three linears then run
// apart, as they always did.
func (a *Attention) stackedQKV() (w, g *tensor.Tensor) {
	if unstacked {
		return nil, nil
	}
	if a.wqkv == nil || a.wqkv.Buffer() != a.Wq.W.W.Buffer() {
		var err error
		if a.wqkv, a.gqkv, err = Stacked(a.Wq.W, a.Wk.W, a.Wv.W); err != nil {
			a.wqkv, a.gqkv = nil, nil
		}
	}
	return a.wqkv, a.gqkv
}

// AttentionCore is the per-head part of attention, between the input
// projections and the output projection: RoPE on q and k, causal attention
// of each head, and their backward. Attention runs it on all the heads,
// tp.Attention on the heads of its rank. It owns its buffers: the caller
// writes the projections into Inputs before Forward, and ∂L/∂att into
// OutputGrad before Backward. With H query heads and Hkv key/value heads
// (grouped-query attention; Hkv divides H), q's projection has H·D
// columns, k's and v's Hkv·D.
type AttentionCore struct {
	Heads, KVHeads, HeadDim int     // query heads, key/value heads, the head width
	Theta                   float64 // base of the rotary embedding

	b        tensor.Backend
	bt       [2]int         // B, T of the last Inputs
	q        *tensor.Tensor // (B*T, H*D) projection
	k, v     *tensor.Tensor // (B*T, Hkv*D) projections (v is read as (B, T, Hkv, D))
	qr       *tensor.Tensor // (B, T, H, D) q after RoPE
	kr       *tensor.Tensor // (B, T, Hkv, D) k after RoPE
	att      *tensor.Tensor // (B, T, H, D) attention output, the input of wo
	lse      *tensor.Tensor // (B, H, T) log-sum-exp of each row of scores
	datt     *tensor.Tensor // (B*T, H*D) backward scratch: ∂L/∂att
	dqr, dkr *tensor.Tensor // (B, T, H, D), (B, T, Hkv, D) backward scratch: ∂L/∂qr, ∂L/∂kr
	dq       *tensor.Tensor // (B*T, H*D) backward scratch: ∂L/∂q
	dk, dv   *tensor.Tensor // (B*T, Hkv*D) backward scratch: ∂L/∂k, ∂L/∂v

	// The packed form (InputsPacked): one GEMM's output [q | k | v] per
	// token goes into qkv; RoPEQKV writes qr, kr and v from it, and the
	// backward writes dqkv, the one GEMM's input back.
	packed    bool
	qkv, dqkv *tensor.Tensor // (B*T, (H + 2*Hkv)*D); qkv is read by Forward only

	ws   *workspace // shared buffers (NewAttention); nil: the core's own
	kept *workspace // where the kept activations go under recompute (NewAttention, ShareKept); nil: the core's own
}

// ShareKept makes the core keep the activations an activation recompute
// drops (Decoder.SetRecompute) in ps's shared buffers, as the cores of
// NewAttention do: under RecomputeAttention att and lse, which OutputGrad
// then recomputes; under RecomputeBlock q, k, v and their rotations too,
// which the block's forward run again recomputes. For the cores of other
// packages' layers (parallel/tp), which keep their backward buffers
// their own.
func (c *AttentionCore) ShareKept(ps *ParamSet) { c.kept = ps.workspace(c.b) }

// NewAttentionCore returns the core of heads query heads and kvHeads
// key/value heads (dividing heads; kvHeads = heads for multi-head
// attention) of headDim features (even: RoPE turns pairs) with RoPE base
// theta.
func NewAttentionCore(b tensor.Backend, heads, kvHeads, headDim int, theta float64) *AttentionCore {
	return &AttentionCore{Heads: heads, KVHeads: kvHeads, HeadDim: headDim, Theta: theta, b: b}
}

// Scale is the factor of the scores, 1/sqrt(HeadDim).
func (c *AttentionCore) Scale() float32 { return float32(1 / math.Sqrt(float64(c.HeadDim))) }

// Inputs returns the buffers the projections of a batch of B sequences of
// T tokens go into, before Forward: q (B·T, Heads·HeadDim), k and v
// (B·T, KVHeads·HeadDim).
func (c *AttentionCore) Inputs(dt tensor.DType, B, T int) (q, k, v *tensor.Tensor) {
	N, H, Hkv, D := B*T, c.Heads, c.KVHeads, c.HeadDim
	c.bt = [2]int{B, T}
	c.q = c.kept.keep(wsKeepQ, RecomputeBlock, c.b, c.q, dt, N, H*D)
	c.k = c.kept.keep(wsKeepK, RecomputeBlock, c.b, c.k, dt, N, Hkv*D)
	c.keepOutputs(dt, B, T)
	c.packed = false
	return c.q, c.k, c.v
}

// keepOutputs ensures v, the rotations, att and lse: shared where the
// recompute mode drops them.
func (c *AttentionCore) keepOutputs(dt tensor.DType, B, T int) {
	N, H, Hkv, D := B*T, c.Heads, c.KVHeads, c.HeadDim
	c.v = c.kept.keep(wsKeepV, RecomputeBlock, c.b, c.v, dt, N, Hkv*D)
	c.qr = c.kept.keep(wsKeepQR, RecomputeBlock, c.b, c.qr, dt, B, T, H, D)
	c.kr = c.kept.keep(wsKeepKR, RecomputeBlock, c.b, c.kr, dt, B, T, Hkv, D)
	c.att = c.kept.keep(wsKeepAtt, RecomputeAttention, c.b, c.att, dt, B, T, H, D)
	c.lse = c.kept.keep(wsKeepLSE, RecomputeAttention, c.b, c.lse, layerkit.StatDType(dt), B, H, T)
}

// InputsPacked returns the (B·T, (Heads + 2·KVHeads)·HeadDim) buffer the
// packed projections [q | k | v] of each token go into (one GEMM
// x·[Wq;Wk;Wv]ᵀ), before Forward; Backward then fills BackwardPacked's dqkv
// instead of separate dq, dk, dv. It costs one more (B·T, KVHeads·HeadDim)
// buffer than Inputs: v is copied out of the packed rows (by the RoPE
// launch itself) because the attention kernels read contiguous heads.
func (c *AttentionCore) InputsPacked(dt tensor.DType, B, T int) (qkv *tensor.Tensor) {
	N, H, Hkv, D := B*T, c.Heads, c.KVHeads, c.HeadDim
	c.bt = [2]int{B, T}
	c.qkv = c.ws.ensure(wsAttnQKV, c.b, c.qkv, dt, N, (H+2*Hkv)*D) // dead after RoPEQKV: shared
	c.keepOutputs(dt, B, T)
	c.packed = true
	return c.qkv
}

// Forward turns q and k by RoPE and returns the heads' attention output
// att (B·T, Heads·HeadDim), the input of the output projection; position t
// attends to positions [0, t] of its own sequence.
func (c *AttentionCore) Forward() (att *tensor.Tensor) {
	B, T, H, Hkv, D := c.bt[0], c.bt[1], c.Heads, c.KVHeads, c.HeadDim
	if c.packed {
		c.b.RoPEQKV(c.qr, c.kr, layerkit.Reshape(c.v, B, T, Hkv, D), layerkit.Reshape(c.qkv, B, T, (H+2*Hkv)*D), c.Theta)
	} else {
		c.b.RoPE(c.qr, layerkit.Reshape(c.q, B, T, H, D), c.Theta)
		c.b.RoPE(c.kr, layerkit.Reshape(c.k, B, T, Hkv, D), c.Theta)
	}
	c.b.Attention(c.att, c.lse, c.qr, c.kr, layerkit.Reshape(c.v, B, T, Hkv, D), c.Scale())
	return layerkit.Reshape(c.att, B*T, H*D)
}

// OutputGrad returns the (B·T, Heads·HeadDim) buffer ∂L/∂att goes into,
// before Backward. Under RecomputeAttention it first recomputes att (which
// the output projection's backward reads) and lse: the attention of the
// kept rotations, as the forward computed it.
func (c *AttentionCore) OutputGrad() (datt *tensor.Tensor) {
	dt, B, T, H, Hkv, D := c.v.DType(), c.bt[0], c.bt[1], c.Heads, c.KVHeads, c.HeadDim
	if c.kept != nil && c.kept.mode == RecomputeAttention {
		c.att = c.kept.keep(wsKeepAtt, RecomputeAttention, c.b, c.att, dt, B, T, H, D)
		c.lse = c.kept.keep(wsKeepLSE, RecomputeAttention, c.b, c.lse, layerkit.StatDType(dt), B, H, T)
		c.b.Attention(c.att, c.lse, c.qr, c.kr, layerkit.Reshape(c.v, B, T, Hkv, D), c.Scale())
	}
	c.datt = c.ws.ensure(wsAttnDAtt, c.b, c.datt, dt, B*T, H*D)
	c.dqr = c.ws.ensure(wsAttnDQR, c.b, c.dqr, dt, B, T, H, D)
	c.dkr = c.ws.ensure(wsAttnDKR, c.b, c.dkr, dt, B, T, Hkv, D)
	c.dv = c.ws.ensure(wsAttnDV, c.b, c.dv, dt, B*T, Hkv*D)
	if c.packed {
		c.dqkv = c.ws.ensure(wsAttnDQKV, c.b, c.dqkv, dt, B*T, (H+2*Hkv)*D)
	} else {
		c.dq = c.ws.ensure(wsAttnDQ, c.b, c.dq, dt, B*T, H*D)
		c.dk = c.ws.ensure(wsAttnDK, c.b, c.dk, dt, B*T, Hkv*D)
	}
	return c.datt
}

// Backward returns ∂L/∂q (B·T, Heads·HeadDim), ∂L/∂k and ∂L/∂v
// (B·T, KVHeads·HeadDim) from the ∂L/∂att in OutputGrad: the attention's
// backward, then RoPE's. After InputsPacked, use BackwardPacked.
func (c *AttentionCore) Backward() (dq, dk, dv *tensor.Tensor) {
	B, T, H, Hkv, D := c.bt[0], c.bt[1], c.Heads, c.KVHeads, c.HeadDim
	c.attentionBackward()
	c.b.RoPEBackward(layerkit.Reshape(c.dq, B, T, H, D), c.dqr, c.Theta)
	c.b.RoPEBackward(layerkit.Reshape(c.dk, B, T, Hkv, D), c.dkr, c.Theta)
	return c.dq, c.dk, c.dv
}

// BackwardPacked returns ∂L/∂qkv (B·T, (Heads + 2·KVHeads)·HeadDim), the
// packed [dq | dk | dv] of each token, from the ∂L/∂att in OutputGrad,
// after InputsPacked: the attention's backward, then RoPEQKVBackward.
func (c *AttentionCore) BackwardPacked() (dqkv *tensor.Tensor) {
	B, T, H, Hkv, D := c.bt[0], c.bt[1], c.Heads, c.KVHeads, c.HeadDim
	c.attentionBackward()
	c.b.RoPEQKVBackward(layerkit.Reshape(c.dqkv, B, T, (H+2*Hkv)*D), c.dqr, c.dkr, layerkit.Reshape(c.dv, B, T, Hkv, D), c.Theta)
	return c.dqkv
}

func (c *AttentionCore) attentionBackward() {
	B, T, H, Hkv, D := c.bt[0], c.bt[1], c.Heads, c.KVHeads, c.HeadDim
	c.b.AttentionBackward(c.dqr, c.dkr, layerkit.Reshape(c.dv, B, T, Hkv, D), layerkit.Reshape(c.datt, B, T, H, D),
		c.qr, c.kr, layerkit.Reshape(c.v, B, T, Hkv, D), c.att, c.lse, c.Scale())
}

// CheckHeads checks an attention layer's head counts: Heads dividing Dim,
// KVHeads (0 for Heads) dividing Heads, an even head dim (RoPE turns
// pairs). what starts the error.
func CheckHeads(what string, cfg AttentionConfig) error {
	if cfg.Dim <= 0 || cfg.Heads <= 0 || cfg.Dim%cfg.Heads != 0 {
		return fmt.Errorf("%s: Dim = %d, Heads = %d, expected positive sizes with Heads dividing Dim", what, cfg.Dim, cfg.Heads)
	}
	if kv := cfg.KVHeads; kv < 0 || kv > 0 && cfg.Heads%kv != 0 {
		return fmt.Errorf("%s: KVHeads = %d, expected a divisor of Heads = %d (or 0 for Heads)", what, kv, cfg.Heads)
	}
	if hd := cfg.Dim / cfg.Heads; hd%2 != 0 {
		return fmt.Errorf("%s: head dim %d = Dim/Heads is odd, expected it even (RoPE turns pairs)", what, hd)
	}
	return nil
}

// NewAttention registers name+".wq" (Dim, Dim), ".wk" and ".wv"
// (KVHeads·HeadDim, Dim) and ".wo" (Dim, Dim).
func NewAttention(b tensor.Backend, ps *ParamSet, name string, cfg AttentionConfig) (*Attention, error) {
	if err := CheckHeads(fmt.Sprintf("layers: attention %q", name), cfg); err != nil {
		return nil, err
	}
	hd, hkv := cfg.Dim/cfg.Heads, cfg.kvHeads()
	if !(cfg.RopeTheta > 0) {
		return nil, fmt.Errorf("layers: attention %q: RopeTheta = %v, expected > 0", name, cfg.RopeTheta)
	}
	if err := checkStds(fmt.Sprintf("layers: attention %q: AttentionConfig", name), cfg.Std, cfg.OutStd); err != nil {
		return nil, err
	}
	a := &Attention{Name: name, Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: hkv, HeadDim: hd, Theta: cfg.RopeTheta, b: b,
		core: NewAttentionCore(b, cfg.Heads, hkv, hd, cfg.RopeTheta)}
	a.core.ws = ps.workspace(b)
	a.core.kept = a.core.ws
	lin := func(suffix string, out int, std float64) (*Linear, error) {
		return NewLinear(b, ps, name+"."+suffix, LinearConfig{In: cfg.Dim, Out: out, Std: std})
	}
	var err error
	if a.Wq, err = lin("wq", cfg.Dim, cfg.Std); err != nil {
		return nil, err
	}
	if a.Wk, err = lin("wk", hkv*hd, cfg.Std); err != nil {
		return nil, err
	}
	if a.Wv, err = lin("wv", hkv*hd, cfg.Std); err != nil {
		return nil, err
	}
	if a.Wo, err = lin("wo", cfg.Dim, cfg.OutStd); err != nil {
		return nil, err
	}
	return a, nil
}

// Params returns wq, wk, wv, wo.
func (a *Attention) Params() []*Param {
	return []*Param{a.Wq.W, a.Wk.W, a.Wv.W, a.Wo.W}
}

// Scale is the factor of the scores, 1/sqrt(HeadDim).
func (a *Attention) Scale() float32 { return a.core.Scale() }

func (a *Attention) what() string { return "layers: attention " + a.Name }

// Forward writes out (B, T, Dim) from x (B, T, Dim); position t attends to
// positions [0, t] of its own sequence.
func (a *Attention) Forward(out, x *tensor.Tensor) error {
	a.bt, a.rows = [2]int{}, false
	if err := checkParams(a.what(), a.Params()...); err != nil {
		return err
	}
	dt := a.Wq.W.W.DType()
	if err := layerkit.CheckOn(a.b, a.what(), "input x", x, dt); err != nil {
		return err
	}
	if s := x.Shape(); len(s) != 3 || s[2] != a.Dim || s[0] <= 0 || s[1] <= 0 {
		return fmt.Errorf("%s: input x has shape %v, expected (B, T, %d)", a.what(), s, a.Dim)
	}
	B, T, C := x.Dim(0), x.Dim(1), a.Dim
	if err := layerkit.CheckShape(a.b, a.what(), "output", out, dt, B, T, C); err != nil {
		return err
	}
	if err := layerkit.CheckApart(a.what(), "output", out, "input x", x); err != nil {
		return err
	}
	return a.forward(layerkit.Reshape(out, B*T, C), layerkit.Reshape(x, B*T, C), B, T)
}

// ForwardSeq is Forward on rows, the Mixer form: out and x are (B·T, Dim)
// (leading dims are flattened), the tokens of batch sequences of seq in
// order. A Backward after it takes its gradients shaped the same way.
func (a *Attention) ForwardSeq(out, x *tensor.Tensor, batch, seq int) error {
	a.bt, a.rows = [2]int{}, false
	if err := checkParams(a.what(), a.Params()...); err != nil {
		return err
	}
	if batch <= 0 || seq <= 0 {
		return fmt.Errorf("%s: batch %d, seq %d, expected positive sizes", a.what(), batch, seq)
	}
	dt, N, C := a.Wq.W.W.DType(), batch*seq, a.Dim
	if err := layerkit.CheckRowsN(a.b, a.what(), "input x", x, dt, C, N, fmt.Sprintf("the tokens of batch %d × seq %d", batch, seq)); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(a.b, a.what(), "output", out, dt, C, N, "like the input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(a.what(), "output", out, "input x", x); err != nil {
		return err
	}
	if err := a.forward(layerkit.Reshape(out, N, C), layerkit.Reshape(x, N, C), batch, seq); err != nil {
		return err
	}
	a.rows = true
	return nil
}

// forward runs the layer on validated rows x, out (B·T, Dim): one GEMM
// x·[Wq;Wk;Wv]ᵀ into the packed rows RoPEQKV reads when the three weights
// are stacked in memory, else three.
func (a *Attention) forward(out, x *tensor.Tensor, B, T int) error {
	a.stacked = false
	if w, _ := a.stackedQKV(); w != nil {
		qkv := a.core.InputsPacked(x.DType(), B, T)
		a.b.MatMul(qkv, x, w, false, true, 1, 0)
		att := a.core.Forward()
		if err := a.Wo.Forward(out, att); err != nil {
			return err
		}
		a.x, a.stacked, a.bt = x, true, [2]int{B, T}
		return layerkit.Sticky(a.b, a.what(), "forward")
	}
	q, k, v := a.core.Inputs(x.DType(), B, T)
	for _, p := range []struct {
		l   *Linear
		out *tensor.Tensor
	}{{a.Wq, q}, {a.Wk, k}, {a.Wv, v}} {
		if err := p.l.Forward(p.out, x); err != nil {
			return err
		}
	}
	att := a.core.Forward()
	if err := a.Wo.Forward(out, att); err != nil {
		return err
	}
	a.bt = [2]int{B, T}
	return layerkit.Sticky(a.b, a.what(), "forward")
}

// Backward overwrites dx with ∂L/∂x and adds the weight gradients, from
// dout, both shaped like the forward's x: (B, T, Dim) after Forward,
// (B·T, Dim) rows after ForwardSeq.
func (a *Attention) Backward(dx, dout *tensor.Tensor) error {
	if a.bt[0] == 0 {
		return errors.New(a.what() + ": Backward without a successful Forward")
	}
	dt := a.Wq.W.W.DType()
	B, T, C := a.bt[0], a.bt[1], a.Dim
	N := B * T
	for _, g := range []struct {
		what string
		t    *tensor.Tensor
	}{{"output gradient", dout}, {"input gradient dx", dx}} {
		var err error
		if a.rows {
			err = layerkit.CheckRowsN(a.b, a.what(), g.what, g.t, dt, C, N, "like the forward's input")
		} else {
			err = layerkit.CheckShape(a.b, a.what(), g.what, g.t, dt, B, T, C)
		}
		if err != nil {
			return err
		}
	}
	if err := layerkit.CheckApart(a.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	datt := a.core.OutputGrad()
	if err := a.Wo.Backward(datt, layerkit.Reshape(dout, N, C)); err != nil {
		return err
	}
	dx2 := layerkit.Reshape(dx, N, C)
	if a.stacked {
		// dx = dqkv·[Wq;Wk;Wv] and d[Wq;Wk;Wv] += dqkvᵀ·x: two GEMMs for the three.
		dqkv := a.core.BackwardPacked()
		a.b.MatMul(dx2, dqkv, a.wqkv, false, false, 1, 0)
		a.b.MatMul(a.gqkv, dqkv, a.x, true, false, 1, 1)
		return layerkit.Sticky(a.b, a.what(), "backward")
	}
	dq, dk, dv := a.core.Backward()
	if err := a.Wq.Backward(dx2, dq); err != nil {
		return err
	}
	if err := a.Wk.BackwardAccumulate(dx2, dk); err != nil {
		return err
	}
	if err := a.Wv.BackwardAccumulate(dx2, dv); err != nil {
		return err
	}
	return layerkit.Sticky(a.b, a.what(), "backward")
}
