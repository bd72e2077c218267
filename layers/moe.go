package layers

import (
	"errors"
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// MoEConfig describes a mixture-of-experts feed-forward layer.
type MoEConfig struct {
	Dim, Hidden int // model width; hidden width of each SwiGLU expert
	Experts     int // E
	TopK        int // experts per token, 1 ≤ TopK ≤ Experts
	// CapacityFactor bounds the token-slots each expert takes in a step to
	// ceil(CapacityFactor·T·TopK/Experts) for T tokens; the overflow is
	// dropped in token order. 0 means dropless.
	CapacityFactor float64
	AuxLossCoef    float64 // weight of the load-balancing loss (0: off)
	ZLossCoef      float64 // weight of the router z-loss (0: off)
	// Std is the init std of the router and of w_gate, w_up; OutStd that
	// of w_down. Unlike a LinearConfig's, 0 is accepted here and gives
	// zero weights (a block's MoE takes the block's Std and OutStd when
	// they are 0: BlockConfig.MoE).
	Std    float64
	OutStd float64 // init std of w_down (0: zero weights)
}

// Validate checks the sizes and coefficients of c.
func (c MoEConfig) Validate() error {
	if c.Dim <= 0 || c.Hidden <= 0 || c.Experts <= 0 {
		return fmt.Errorf("layers: MoEConfig: Dim = %d, Hidden = %d, Experts = %d, expected positive sizes", c.Dim, c.Hidden, c.Experts)
	}
	if c.TopK < 1 || c.TopK > c.Experts {
		return fmt.Errorf("layers: MoEConfig: TopK = %d, expected 1 ≤ TopK ≤ Experts = %d", c.TopK, c.Experts)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"CapacityFactor", c.CapacityFactor}, {"AuxLossCoef", c.AuxLossCoef}, {"ZLossCoef", c.ZLossCoef}, {"Std", c.Std}, {"OutStd", c.OutStd}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("layers: MoEConfig.%s = %v, expected a finite value ≥ 0", f.name, f.v)
		}
	}
	return nil
}

// MoEStats describes the routing of an MoE layer's last forward, over all
// the tokens of the step (of the whole expert-parallel group under EP).
type MoEStats struct {
	Name            string  // the layer
	Tokens          int     // tokens routed
	TokensPerExpert []int   // (E) token-slots routed to each expert, before the capacity
	Dropped         int     // token-slots over capacity (0 when dropless)
	LoadBalance     float64 // E·Σ_e f_e·P_e: 1 when balanced, up to E
	ZLoss           float64 // mean logsumexp(logits)²
	AuxLoss         float64 // AuxLossCoef·LoadBalance + ZLossCoef·ZLoss, added to the loss
}

// MoE is the single-rank mixture-of-experts layer (the reference that
// parallel/ep is compared with):
//
//	weights, idx = router(x)                       top-k of softmax(x·W_rᵀ)
//	xe  = x[tok]                                   (M, C) gather: expert-contiguous rows
//	ye  = experts(xe)                              one GEMM per expert and projection
//	out[n] = Σ_j weights[n, j]·ye[pos[n, j]]       unpermute and combine
//
// Backward runs it in reverse and adds the gradient of AuxLoss: the layer's
// objective is L(out) + AuxLoss().
type MoE struct {
	Name    string   // the layer's name, its parameters' prefix
	Router  *Router  // the gate
	Experts *Experts // every expert of the layer

	cfg  MoEConfig
	b    tensor.Backend
	ops  tensor.MoEOps
	n    int // tokens of the last Forward; 0 before a successful one
	plan *RoutingPlan
	// Activations of the last Forward.
	tok      *tensor.Tensor // (M) int32 token of each expert row
	pos      *tensor.Tensor // (N, K) int32 expert row of each slot, −1 dropped
	xe, ye   *tensor.Tensor // (M, C)
	dxe, dye *tensor.Tensor // (M, C) backward scratch
	dw       *tensor.Tensor // (N, K) backward scratch
}

// NewMoE registers name+".router.weight" and the experts' name+".w_gate",
// ".w_up", ".w_down" in ps.
func NewMoE(b tensor.Backend, ps *ParamSet, name string, cfg MoEConfig) (*MoE, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("layers: moe %q: %w", name, err)
	}
	ops, err := tensor.MoEOpsOf(b)
	if err != nil {
		return nil, fmt.Errorf("layers: moe %q: %w", name, err)
	}
	m := &MoE{Name: name, cfg: cfg, b: b, ops: ops}
	if m.Router, err = NewRouter(b, ps, name+".router", RouterConfig{Dim: cfg.Dim, Experts: cfg.Experts, TopK: cfg.TopK,
		Std: cfg.Std, AuxLossCoef: cfg.AuxLossCoef, ZLossCoef: cfg.ZLossCoef}); err != nil {
		return nil, err
	}
	if m.Experts, err = NewExperts(b, ps, name, ExpertsConfig{Dim: cfg.Dim, Hidden: cfg.Hidden, Experts: cfg.Experts,
		Std: cfg.Std, OutStd: cfg.OutStd}); err != nil {
		return nil, err
	}
	return m, nil
}

// Config returns the layer's configuration.
func (m *MoE) Config() MoEConfig { return m.cfg }

// Params returns the router weight, then w_gate, w_up, w_down.
func (m *MoE) Params() []*Param { return append([]*Param{m.Router.W}, m.Experts.Params()...) }

// SetAuxWeight weights the gradient of the router's auxiliary losses
// (AuxWeighter, Router.AuxWeight).
func (m *MoE) SetAuxWeight(w float64) { m.Router.SetAuxWeight(w) }

func (m *MoE) what() string { return "layers: moe " + m.Name }

// AuxLoss is the auxiliary loss of the last Forward (0 before one).
func (m *MoE) AuxLoss() float64 {
	if m.n == 0 {
		return 0
	}
	return m.Router.AuxLoss()
}

// Stats describes the routing of the last Forward.
func (m *MoE) Stats() MoEStats {
	if m.n == 0 {
		return MoEStats{Name: m.Name}
	}
	return NewMoEStats(m.Name, m.Router, m.Router.Local(), m.plan.Dropped())
}

// NewMoEStats assembles the MoEStats of a router after SetGlobal(g).
func NewMoEStats(name string, r *Router, g LoadStats, dropped int) MoEStats {
	bal, z := r.Losses()
	return MoEStats{Name: name, Tokens: g.Tokens, TokensPerExpert: append([]int(nil), g.Routed...),
		Dropped: dropped, LoadBalance: bal, ZLoss: z, AuxLoss: r.AuxLoss()}
}

// NewMoEStatsOf is NewMoEStats for the statistics g of a step that the
// router may no longer hold (read back after later forwards): the losses
// are those SetLosses(g) sets, with the router's coefficients, and the
// router is left as it is.
func NewMoEStatsOf(name string, r *Router, g LoadStats, dropped int) MoEStats {
	bal, z := lossesOf(g, r.Experts, r.TopK)
	return MoEStats{Name: name, Tokens: g.Tokens, TokensPerExpert: append([]int(nil), g.Routed...),
		Dropped: dropped, LoadBalance: bal, ZLoss: z, AuxLoss: r.AuxLossCoef*bal + r.ZLossCoef*z}
}

// Forward writes out (..., Dim) from x (..., Dim), which must stay unchanged
// until Backward.
func (m *MoE) Forward(out, x *tensor.Tensor) error {
	m.n = 0
	if err := checkParams(m.what(), m.Params()...); err != nil {
		return err
	}
	dt := m.Router.W.W.DType()
	n, err := layerkit.CheckRows(m.b, m.what(), "input x", x, dt, m.cfg.Dim)
	if err != nil {
		return err
	}
	if err := layerkit.CheckShape(m.b, m.what(), "output", out, dt, x.Shape()...); err != nil {
		return err
	}
	if err := layerkit.CheckApart(m.what(), "output", out, "input x", x); err != nil {
		return err
	}
	C, K := m.cfg.Dim, m.cfg.TopK
	x2, out2 := layerkit.Reshape(x, n, C), layerkit.Reshape(out, n, C)
	if err := m.Router.Forward(x2); err != nil {
		return err
	}
	if err := m.Router.SetGlobal(m.Router.Local()); err != nil {
		return err
	}
	capacity := layerkit.Capacity(m.cfg.CapacityFactor, n, K, m.cfg.Experts)
	plan, err := NewRoutingPlan(m.Router.Indices(), n, K, m.cfg.Experts, capacity, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", m.what(), err)
	}
	M := plan.Rows()
	m.tok = uploadInts(m.b, m.tok, plan.TokenOf(), M)
	m.pos = uploadInts(m.b, m.pos, plan.Pos, n, K)
	m.xe = layerkit.Ensure(m.b, m.xe, dt, M, C)
	m.ye = layerkit.Ensure(m.b, m.ye, dt, M, C)
	m.ops.GatherRows(m.xe, x2, m.tok, nil)
	if err := m.Experts.Forward(m.ye, m.xe, plan.Kept); err != nil {
		return err
	}
	m.ops.CombineRows(out2, m.ye, m.pos, m.Router.Weights())
	if err := layerkit.Sticky(m.b, m.what(), "forward"); err != nil {
		return err
	}
	m.plan, m.n = plan, n
	return nil
}

// Backward overwrites dx (..., Dim) with ∂L/∂x, adds the parameters'
// gradients, from dout (..., Dim), and adds the gradient of AuxLoss.
func (m *MoE) Backward(dx, dout *tensor.Tensor) error {
	if m.n == 0 {
		return errors.New(m.what() + ": Backward without a successful Forward")
	}
	dt, n, C, K := m.Router.W.W.DType(), m.n, m.cfg.Dim, m.cfg.TopK
	if err := layerkit.CheckRowsN(m.b, m.what(), "output gradient", dout, dt, C, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckRowsN(m.b, m.what(), "input gradient dx", dx, dt, C, n, "like the forward's input"); err != nil {
		return err
	}
	if err := layerkit.CheckApart(m.what(), "input gradient dx", dx, "output gradient", dout); err != nil {
		return err
	}
	M := m.plan.Rows()
	m.dxe = layerkit.Ensure(m.b, m.dxe, dt, M, C)
	m.dye = layerkit.Ensure(m.b, m.dye, dt, M, C)
	m.dw = layerkit.Ensure(m.b, m.dw, dt, n, K)
	dx2, dout2 := layerkit.Reshape(dx, n, C), layerkit.Reshape(dout, n, C)
	m.ops.CombineRowsBackward(m.dye, m.dw, dout2, m.ye, m.pos, m.Router.Weights())
	if err := m.Experts.Backward(m.dxe, m.dye); err != nil {
		return err
	}
	m.ops.CombineRows(dx2, m.dxe, m.pos, nil) // the gather's adjoint: Σ of a token's slots
	if err := m.Router.Backward(dx2, m.dw, true); err != nil {
		return err
	}
	return layerkit.Sticky(m.b, m.what(), "backward")
}

// uploadInts uploads vals into an int32 device tensor of the given shape,
// reusing t when it fits.
func uploadInts(b tensor.Backend, t *tensor.Tensor, vals []int32, shape ...int) *tensor.Tensor {
	t = layerkit.Ensure(b, t, tensor.Int32, shape...)
	h, err := tensor.FromInt32(vals, shape...)
	if err != nil {
		panic("layers: internal error: " + err.Error())
	}
	b.Upload(t, h)
	return t
}
