package layers

import (
	"errors"
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// GPTConfig describes a GPT model. Zero values of FFN, RopeTheta, NormEps and
// InitStd mean the defaults that WithDefaults fills in.
//
// Mixture of experts: with Experts > 0, the blocks i with (i+1)%MoEEvery == 0
// replace their MLP by an MoE layer of Experts SwiGLU experts of width FFN,
// TopK of them per token (defaults: MoEEvery 1, TopK min(2, Experts)).
// CapacityFactor 0 is dropless; AuxLossCoef and ZLossCoef 0 turn the
// load-balancing loss and the router z-loss off. Experts = 0 is a dense
// model, and the other MoE fields are then ignored.
type GPTConfig struct {
	Layers         int     `json:"layers"`
	Dim            int     `json:"dim"`
	Heads          int     `json:"heads"`
	Vocab          int     `json:"vocab"`
	Seq            int     `json:"seq"`
	FFN            int     `json:"ffn"`             // hidden width of the SwiGLU MLP; 0 means the default: 4*Dim*2/3 rounded up to a multiple of 64
	TiedEmbeddings bool    `json:"tied_embeddings"` // the LM head reuses the token embedding
	RopeTheta      float64 `json:"rope_theta"`      // 0 means 10000
	NormEps        float32 `json:"norm_eps"`        // 0 means 1e-5
	InitStd        float64 `json:"init_std"`        // 0 means 0.02
	Seed           uint64  `json:"seed"`

	Experts        int     `json:"experts"`         // MoE: experts per MoE block (0: dense)
	TopK           int     `json:"top_k"`           // experts per token
	MoEEvery       int     `json:"moe_every"`       // MoE block period
	CapacityFactor float64 `json:"capacity_factor"` // token-slots per expert: ceil(CF·tokens·TopK/Experts); 0: dropless
	AuxLossCoef    float64 `json:"aux_loss_coef"`   // weight of the load-balancing loss
	ZLossCoef      float64 `json:"z_loss_coef"`     // weight of the router z-loss
}

// WithDefaults returns c with its zero-valued optional fields set.
func (c GPTConfig) WithDefaults() GPTConfig {
	if c.FFN == 0 && c.Dim > 0 {
		h := (8*c.Dim + 2) / 3 // ceil(4·Dim·2/3)
		c.FFN = (h + 63) / 64 * 64
	}
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	if c.InitStd == 0 {
		c.InitStd = 0.02
	}
	if c.Experts > 0 {
		if c.TopK == 0 {
			c.TopK = min(2, c.Experts)
		}
		if c.MoEEvery == 0 {
			c.MoEEvery = 1
		}
	}
	return c
}

// IsMoE reports whether block i (0-based) is an MoE block.
func (c GPTConfig) IsMoE(i int) bool {
	return c.Experts > 0 && c.MoEEvery > 0 && (i+1)%c.MoEEvery == 0
}

// validateMoE checks the MoE fields (when Experts > 0).
func (c GPTConfig) validateMoE() error {
	if c.Experts < 0 {
		return fmt.Errorf("layers: GPTConfig.Experts = %d, expected ≥ 0 (0 for a dense model)", c.Experts)
	}
	if c.Experts == 0 {
		return nil
	}
	if c.TopK < 0 || c.TopK > c.Experts {
		return fmt.Errorf("layers: GPTConfig.TopK = %d, expected 1 ≤ TopK ≤ Experts = %d (or 0 for the default)", c.TopK, c.Experts)
	}
	if c.MoEEvery < 0 || c.MoEEvery > c.Layers {
		return fmt.Errorf("layers: GPTConfig.MoEEvery = %d, expected 1 ≤ MoEEvery ≤ Layers = %d (or 0 for the default, 1)", c.MoEEvery, c.Layers)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"CapacityFactor", c.CapacityFactor}, {"AuxLossCoef", c.AuxLossCoef}, {"ZLossCoef", c.ZLossCoef}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("layers: GPTConfig.%s = %v, expected a finite value >= 0", f.name, f.v)
		}
	}
	return nil
}

// MoEConfig is the configuration of the MoE layer of an MoE block (with
// defaults filled in).
func (c GPTConfig) MoEConfig() MoEConfig {
	c = c.WithDefaults()
	return MoEConfig{Dim: c.Dim, Hidden: c.FFN, Experts: c.Experts, TopK: c.TopK, CapacityFactor: c.CapacityFactor,
		AuxLossCoef: c.AuxLossCoef, ZLossCoef: c.ZLossCoef, Std: c.InitStd, OutStd: c.InitStd / math.Sqrt(2*float64(max(c.Layers, 1)))}
}

// Validate checks c (with or without defaults filled in): sizes positive,
// Heads dividing Dim, an even head dimension (RoPE turns pairs), optional
// fields non-negative and finite.
func (c GPTConfig) Validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Layers", c.Layers}, {"Dim", c.Dim}, {"Heads", c.Heads}, {"Vocab", c.Vocab}, {"Seq", c.Seq}} {
		if f.v <= 0 {
			return fmt.Errorf("layers: GPTConfig.%s = %d, expected > 0", f.name, f.v)
		}
	}
	if c.Vocab > math.MaxInt32 {
		return fmt.Errorf("layers: GPTConfig.Vocab = %d, expected at most %d (token ids are int32)", c.Vocab, math.MaxInt32)
	}
	if c.Dim%c.Heads != 0 {
		return fmt.Errorf("layers: GPTConfig.Heads = %d does not divide Dim = %d", c.Heads, c.Dim)
	}
	if hd := c.Dim / c.Heads; hd%2 != 0 {
		return fmt.Errorf("layers: GPTConfig: head dim Dim/Heads = %d/%d = %d is odd, expected even (RoPE)", c.Dim, c.Heads, hd)
	}
	if c.FFN < 0 {
		return fmt.Errorf("layers: GPTConfig.FFN = %d, expected > 0 (or 0 for the default)", c.FFN)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"RopeTheta", c.RopeTheta}, {"NormEps", float64(c.NormEps)}, {"InitStd", c.InitStd}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("layers: GPTConfig.%s = %v, expected a finite value >= 0 (0 for the default)", f.name, f.v)
		}
	}
	return c.validateMoE()
}

// GPT is a decoder-only transformer: token embedding → Layers pre-norm
// blocks → final RMSNorm → LM head → softmax cross-entropy.
type GPT struct {
	Embed  *Embedding
	Blocks []*Block
	Norm   *RMSNorm
	Head   *Linear // (Vocab, Dim) weight: the embedding's when tied

	cfg GPTConfig
	b   tensor.Backend
	dt  tensor.DType
	ps  *ParamSet

	// Activations of the last Forward (reallocated when B or T change).
	bt       [2]int           // B, T
	ids      *tensor.Tensor   // (B, T) int32 token ids, on the device
	targets  *tensor.Tensor   // (B*T) int32 targets, on the device
	xs       []*tensor.Tensor // Layers+1 of (B, T, C): xs[0] embeddings, xs[l+1] output of block l
	hf       *tensor.Tensor   // (B, T, C) final norm output
	logits   *tensor.Tensor   // (B*T, V)
	losses   *tensor.Tensor   // (B*T) per-row loss (f32, or f64 for f64 models)
	dlogits  *tensor.Tensor   // (B*T, V) ∂loss/∂logits, from the fused cross-entropy
	lossSum  *tensor.Tensor   // (1) Σ losses, like losses
	nTargets int              // non-ignored targets of the last Forward
	lossAt   int              // where the last Forward's loss is (lossNone, ...)
	ready    bool             // a Forward with targets ran and no Backward since
	// Backward scratch.
	dhf, dxa, dxb *tensor.Tensor // (B, T, C)
}

// NewGPT builds the model on b with parameters of dtype dt (Float32 or
// Float64 on the CPU) and initialises them from cfg.Seed: weights from
// N(0, InitStd²), the residual branches' output projections (wo, w_down)
// from N(0, InitStd²/(2·Layers)), norm weights 1.
func NewGPT(b tensor.Backend, cfg GPTConfig, dt tensor.DType) (*GPT, error) {
	if b == nil {
		return nil, errors.New("layers: NewGPT with a nil backend")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !dt.IsFloat() {
		return nil, fmt.Errorf("layers: NewGPT with dtype %v, expected a float dtype (f32 or f64 on the cpu)", dt)
	}
	m := &GPT{cfg: cfg, b: b, dt: dt, ps: NewParamSet(cfg.Seed)}
	std, outStd := cfg.InitStd, cfg.InitStd/math.Sqrt(2*float64(cfg.Layers))
	var err error
	if m.Embed, err = NewEmbedding(b, m.ps, "embed", cfg.Vocab, cfg.Dim, std); err != nil {
		return nil, err
	}
	for l := range cfg.Layers {
		bc := BlockConfig{
			Dim: cfg.Dim, Heads: cfg.Heads, FFN: cfg.FFN, RopeTheta: cfg.RopeTheta,
			NormEps: cfg.NormEps, Std: std, OutStd: outStd,
		}
		if cfg.IsMoE(l) {
			mc := cfg.MoEConfig()
			bc.MoE = &mc
		}
		blk, err := NewBlock(b, m.ps, fmt.Sprintf("blocks.%d", l), bc)
		if err != nil {
			return nil, err
		}
		m.Blocks = append(m.Blocks, blk)
	}
	if m.Norm, err = NewRMSNorm(b, m.ps, "final_norm", cfg.Dim, cfg.NormEps); err != nil {
		return nil, err
	}
	if cfg.TiedEmbeddings {
		m.Head, err = NewLinearFromParams(b, "lm_head", m.Embed.W, nil)
	} else {
		m.Head, err = NewLinear(b, m.ps, "lm_head", LinearConfig{In: cfg.Dim, Out: cfg.Vocab, Std: std})
	}
	if err != nil {
		return nil, err
	}
	if err := m.ps.Materialize(b, dt); err != nil {
		return nil, err
	}
	return m, nil
}

// Config returns the model's configuration, defaults filled in.
func (m *GPT) Config() GPTConfig { return m.cfg }

// Params returns the model's parameter set.
func (m *GPT) Params() *ParamSet { return m.ps }

// Logits returns the (B*T, Vocab) logits of the last Forward (nil before the
// first); they stay valid until the next Forward.
func (m *GPT) Logits() *tensor.Tensor { return m.logits }

// ZeroGrad sets every parameter gradient to zero.
func (m *GPT) ZeroGrad() { m.ps.ZeroGrad() }

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

// Forward runs the model on ids (host int32 (B, T), T ≤ Seq, each id in
// [0, Vocab)) and, when targets (host int32 (B, T); negative values are
// ignored) is not nil, returns the mean cross-entropy over the non-ignored
// targets plus the MoE blocks' auxiliary losses (AuxLoss; 0 in a dense
// model) and prepares the gradient of that sum for Backward. With nil
// targets the loss is 0 and Backward is not allowed. It is ForwardAsync
// then ReadLoss.
func (m *GPT) Forward(ids, targets *tensor.Tensor) (float64, error) {
	if err := m.ForwardAsync(ids, targets); err != nil {
		return 0, err
	}
	return m.ReadLoss()
}

// ForwardAsync is Forward without reading the loss back: the per-row
// losses are summed on the device and stay there until ReadLoss, so a
// Backward queues behind the forward with no host sync in between.
func (m *GPT) ForwardAsync(ids, targets *tensor.Tensor) error {
	m.ready, m.lossAt = false, lossNone
	if err := CheckTokens("layers: gpt", "ids", ids, m.cfg.Seq); err != nil {
		return err
	}
	if err := CheckIDs("layers: gpt: ids", ids, m.cfg.Vocab); err != nil {
		return err
	}
	nTargets := 0
	if targets != nil {
		if err := CheckTokens("layers: gpt", "targets", targets, m.cfg.Seq); err != nil {
			return err
		}
		var err error
		if nTargets, err = CountTargets("layers: gpt", targets, ids, m.cfg.Vocab); err != nil {
			return err
		}
	}
	if err := m.b.Err(); err != nil {
		return fmt.Errorf("layers: gpt: the backend already holds an error: %w", err)
	}
	B, T, C := ids.Dim(0), ids.Dim(1), m.cfg.Dim
	N := B * T
	m.alloc(B, T)
	m.b.Upload(m.ids, ids)
	if err := m.Embed.Forward(m.xs[0], m.ids); err != nil {
		return err
	}
	for l, blk := range m.Blocks {
		if err := blk.Forward(m.xs[l+1], m.xs[l]); err != nil {
			return err
		}
	}
	if err := m.Norm.Forward(m.hf, m.xs[len(m.Blocks)]); err != nil {
		return err
	}
	if err := m.Head.Forward(m.logits, Reshape(m.hf, N, C)); err != nil {
		return err
	}
	if targets == nil {
		m.lossAt = lossZero
		return Sticky(m.b, "layers: gpt", "forward")
	}
	scale := float32(0)
	if nTargets > 0 {
		scale = float32(1 / float64(nTargets))
	}
	m.b.Upload(m.targets, Reshape(targets, N))
	m.b.CrossEntropy(m.losses, m.dlogits, m.logits, m.targets, scale)
	m.b.Fill(m.lossSum, 0)
	m.b.SumRows(m.lossSum, Reshape(m.losses, N, 1))
	if err := Sticky(m.b, "layers: gpt", "forward"); err != nil {
		return err
	}
	m.ready, m.lossAt, m.nTargets = true, lossOnDevice, nTargets
	return nil
}

// Where the loss of the last forward is.
const (
	lossNone     = iota // no successful forward
	lossZero            // a forward without targets: 0
	lossOnDevice        // Σ losses in lossSum, over nTargets targets
)

// ReadLoss returns the loss of the last ForwardAsync (what Forward
// returns), reading one scalar from the device: it waits for the work
// queued before it, so read it after Backward to keep the two back to
// back. It may be called more than once.
func (m *GPT) ReadLoss() (float64, error) {
	switch m.lossAt {
	case lossNone:
		return 0, errors.New("layers: gpt: ReadLoss needs a successful Forward first")
	case lossZero:
		return 0, nil
	}
	h := tensor.MustHost(tensor.Float64, 1)
	m.b.Download(h, m.lossSum)
	if err := Sticky(m.b, "layers: gpt", "reading the loss"); err != nil {
		return 0, err
	}
	if m.nTargets == 0 {
		return m.AuxLoss(), nil
	}
	return h.F64()[0]/float64(m.nTargets) + m.AuxLoss(), nil
}

// AuxLoss is the sum of the MoE blocks' auxiliary losses (load balance and
// z-loss, with their coefficients) of the last Forward: the part of
// Forward's loss that is not the cross-entropy. 0 in a dense model.
func (m *GPT) AuxLoss() float64 {
	var s float64
	for _, blk := range m.Blocks {
		s += blk.AuxLoss()
	}
	return s
}

// RouterStats returns the routing statistics of the last Forward, one per
// MoE block in block order (nil in a dense model).
func (m *GPT) RouterStats() []MoEStats {
	var st []MoEStats
	for _, blk := range m.Blocks {
		if blk.MoE != nil {
			st = append(st, blk.MoE.Stats())
		}
	}
	return st
}

// alloc (re)allocates the activations for a batch of B sequences of T.
func (m *GPT) alloc(B, T int) {
	C, V, N, dt := m.cfg.Dim, m.cfg.Vocab, B*T, m.dt
	if m.bt == [2]int{B, T} {
		return
	}
	m.bt = [2]int{B, T}
	m.ids = Ensure(m.b, m.ids, tensor.Int32, B, T)
	m.targets = Ensure(m.b, m.targets, tensor.Int32, N)
	if m.xs == nil {
		m.xs = make([]*tensor.Tensor, len(m.Blocks)+1)
	}
	for i := range m.xs {
		m.xs[i] = Ensure(m.b, m.xs[i], dt, B, T, C)
	}
	m.hf = Ensure(m.b, m.hf, dt, B, T, C)
	m.logits = Ensure(m.b, m.logits, dt, N, V)
	m.dlogits = Ensure(m.b, m.dlogits, dt, N, V)
	m.losses = Ensure(m.b, m.losses, StatDType(dt), N)
	m.lossSum = Ensure(m.b, m.lossSum, StatDType(dt), 1)
	m.dhf = Ensure(m.b, m.dhf, dt, B, T, C)
	m.dxa = Ensure(m.b, m.dxa, dt, B, T, C)
	m.dxb = Ensure(m.b, m.dxb, dt, B, T, C)
}

// Backward adds the gradient of the last Forward's mean loss to the
// parameters' gradients (Params().Flat()). It requires a Forward with
// targets, and runs once per Forward.
func (m *GPT) Backward() error {
	if !m.ready {
		return errors.New("layers: gpt: Backward needs a successful Forward with targets since the last Backward")
	}
	m.ready = false
	N, C := m.bt[0]*m.bt[1], m.cfg.Dim
	if err := m.Head.Backward(Reshape(m.dhf, N, C), m.dlogits); err != nil {
		return err
	}
	dx, dnext := m.dxa, m.dxb
	if err := m.Norm.Backward(dx, m.dhf); err != nil {
		return err
	}
	for l := len(m.Blocks) - 1; l >= 0; l-- {
		if err := m.Blocks[l].Backward(dnext, dx); err != nil {
			return err
		}
		dx, dnext = dnext, dx
	}
	if err := m.Embed.Backward(dx); err != nil {
		return err
	}
	return Sticky(m.b, "layers: gpt", "backward")
}

// FLOPsPerToken is the forward+backward model FLOPs per token
// (GPTConfig.FLOPsPerToken), for MFU.
func (m *GPT) FLOPsPerToken() float64 { return m.cfg.FLOPsPerToken() }

// FLOPsPerToken is the forward+backward FLOPs per token of the model c
// describes (defaults filled in), all ranks together: 6·N for the matmul
// parameters N (all linear layers and the LM head; the embedding lookup
// and norms are not matmuls), plus the attention scores and weighted sum,
// 12·Layers·Dim·Seq (the usual convention, which does not halve for the
// causal mask). In an MoE block N counts the router and the TopK experts
// a token goes through (the active parameters).
func (c GPTConfig) FLOPsPerToken() float64 {
	c = c.WithDefaults()
	var n float64
	for l := range c.Layers {
		ffn := 3 * c.Dim * c.FFN
		if c.IsMoE(l) {
			ffn = c.TopK*ffn + c.Experts*c.Dim
		}
		n += float64(4*c.Dim*c.Dim + ffn)
	}
	n += float64(c.Vocab) * float64(c.Dim)
	return 6*n + 12*float64(c.Layers)*float64(c.Dim)*float64(c.Seq)
}
