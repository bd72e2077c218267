package layers

import (
	"errors"
	"fmt"
	"math"

	"github.com/asynctp/asynctp/tensor"
)

// GPTConfig describes a GPT model. Zero values of KVHeads, FFN, RopeTheta,
// NormEps and InitStd mean the defaults that WithDefaults fills in.
//
// Grouped-query attention: KVHeads key/value heads (dividing Heads), each
// read by Heads/KVHeads query heads; KVHeads = Heads (the default) is
// multi-head attention.
//
// Mixture of experts: with Experts > 0, the blocks i with (i+1)%MoEEvery == 0
// replace their MLP by an MoE layer of Experts SwiGLU experts of width FFN,
// TopK of them per token (defaults: MoEEvery 1, TopK min(2, Experts)).
// CapacityFactor 0 is dropless; AuxLossCoef and ZLossCoef 0 turn the
// load-balancing loss and the router z-loss off. Experts = 0 is a dense
// model, and the other MoE fields are then ignored.
type GPTConfig struct {
	Layers         int     `json:"layers"`          // blocks
	Dim            int     `json:"dim"`             // the residual stream's width
	Heads          int     `json:"heads"`           // query heads (dividing Dim)
	KVHeads        int     `json:"kv_heads"`        // key/value heads; 0 means the default, Heads
	Vocab          int     `json:"vocab"`           // token ids [0, Vocab)
	Seq            int     `json:"seq"`             // the longest sequence (RoPE's positions)
	FFN            int     `json:"ffn"`             // hidden width of the SwiGLU MLP; 0 means the default: 4*Dim*2/3 rounded up to a multiple of 64
	TiedEmbeddings bool    `json:"tied_embeddings"` // the LM head reuses the token embedding
	RopeTheta      float64 `json:"rope_theta"`      // 0 means 10000
	NormEps        float32 `json:"norm_eps"`        // 0 means 1e-5
	InitStd        float64 `json:"init_std"`        // 0 means 0.02
	Seed           uint64  `json:"seed"`            // seeds the initial weights

	Experts        int     `json:"experts"`         // MoE: experts per MoE block (0: dense)
	TopK           int     `json:"top_k"`           // experts per token
	MoEEvery       int     `json:"moe_every"`       // MoE block period
	CapacityFactor float64 `json:"capacity_factor"` // token-slots per expert: ceil(CF·tokens·TopK/Experts); 0: dropless
	AuxLossCoef    float64 `json:"aux_loss_coef"`   // weight of the load-balancing loss
	ZLossCoef      float64 `json:"z_loss_coef"`     // weight of the router z-loss
}

// WithDefaults returns c with its zero-valued optional fields set.
func (c GPTConfig) WithDefaults() GPTConfig {
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
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
// Heads dividing Dim, KVHeads dividing Heads, an even head dimension (RoPE
// turns pairs), optional fields non-negative and finite.
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
	if c.KVHeads < 0 || c.KVHeads > 0 && c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("layers: GPTConfig.KVHeads = %d does not divide Heads = %d (expected a divisor, or 0 for Heads)", c.KVHeads, c.Heads)
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
// blocks → final RMSNorm → LM head → softmax cross-entropy. It is the
// Decoder of this package's layers (parallel/model builds the same
// assembly from sharded parts); its fields are those parts.
type GPT struct {
	Embed  *Embedding // the token embedding
	Blocks []*Block   // the blocks, in order
	Norm   *RMSNorm   // the final norm
	Head   *Linear    // (Vocab, Dim) weight: the embedding's when tied
	// HeadLoss runs Head and the cross-entropy by chunks of rows on a
	// forward with targets (its ChunkRows may be changed before a forward).
	HeadLoss *ChunkedHeadLoss

	// The assembly of those parts: Forward, ForwardAsync, ReadLoss,
	// Backward, AuxLoss, RouterStats and Logits are its.
	*Decoder

	cfg GPTConfig
	ps  *ParamSet
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
	m := &GPT{cfg: cfg, ps: NewParamSet(cfg.Seed)}
	std, outStd := cfg.InitStd, cfg.InitStd/math.Sqrt(2*float64(cfg.Layers))
	var err error
	if m.Embed, err = NewEmbedding(b, m.ps, "embed", cfg.Vocab, cfg.Dim, std); err != nil {
		return nil, err
	}
	for l := range cfg.Layers {
		bc := BlockConfig{
			Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: cfg.KVHeads, FFN: cfg.FFN, RopeTheta: cfg.RopeTheta,
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
	loss, err := NewCrossEntropy(b, cfg.Vocab)
	if err != nil {
		return nil, err
	}
	if m.HeadLoss, err = NewChunkedHeadLoss(b, m.Head, loss); err != nil {
		return nil, err
	}
	if m.Decoder, err = NewDecoder(b, DecoderParts{
		What: "layers: gpt", Seq: cfg.Seq, Vocab: cfg.Vocab, Dim: cfg.Dim, LogitCols: cfg.Vocab, DType: dt,
		Embed: &hostIDs{e: m.Embed, b: b}, Blocks: m.Blocks, Norm: m.Norm, Head: m.Head, Loss: loss,
		HeadLoss: m.HeadLoss,
	}); err != nil {
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

// ZeroGrad sets every parameter gradient to zero.
func (m *GPT) ZeroGrad() { m.ps.ZeroGrad() }

// Replicas is 1: the model is one data-parallel replica.
func (m *GPT) Replicas() int { return 1 }

// SetMicroBatches makes each following ForwardBackward run its batch as
// k micro-batches (Decoder.ForwardBackward). A bf16 model with k > 1
// gets fp32 main gradients (ParamSet.UseMainGrads), into which each
// micro-batch's gradients add: call it before the optimizer is made.
func (m *GPT) SetMicroBatches(k int) error {
	if err := m.Decoder.SetMicroBatches(k); err != nil {
		return err
	}
	if k == 1 || m.ps.MainGrads().DType() != tensor.BFloat16 {
		return nil
	}
	if err := m.ps.UseMainGrads(); err != nil {
		return err
	}
	m.Decoder.p.Grads = &mainGrads{ps: m.ps}
	return nil
}

// FLOPsPerToken is the forward+backward model FLOPs per token
// (GPTConfig.FLOPsPerToken), for MFU.
func (m *GPT) FLOPsPerToken() float64 { return m.cfg.FLOPsPerToken() }

// KVDim is the width of the key and value projections, KVHeads·(Dim/Heads)
// (Dim without grouped-query attention), with the default filled in.
func (c GPTConfig) KVDim() int {
	c = c.WithDefaults()
	if c.Heads <= 0 {
		return 0
	}
	return c.KVHeads * (c.Dim / c.Heads)
}

// AttentionParams is the parameter count of one block's attention: wq and
// wo (Dim, Dim), wk and wv (KVDim, Dim).
func (c GPTConfig) AttentionParams() int { return 2*c.Dim*c.Dim + 2*c.KVDim()*c.Dim }

// FLOPsPerToken is the forward+backward FLOPs per token of the model c
// describes (defaults filled in), all ranks together: 6·N for the matmul
// parameters N (all linear layers and the LM head; the embedding lookup
// and norms are not matmuls; wk and wv are KVDim wide), plus the attention
// scores and weighted sum, 12·Layers·Dim·Seq (the usual convention, which
// does not halve for the causal mask; as many under grouped-query
// attention: every query head scores every key). In an MoE block N counts
// the router and the TopK experts a token goes through (the active
// parameters).
func (c GPTConfig) FLOPsPerToken() float64 {
	c = c.WithDefaults()
	var n float64
	for l := range c.Layers {
		ffn := 3 * c.Dim * c.FFN
		if c.IsMoE(l) {
			ffn = c.TopK*ffn + c.Experts*c.Dim
		}
		n += float64(c.AttentionParams() + ffn)
	}
	n += float64(c.Vocab) * float64(c.Dim)
	return 6*n + 12*float64(c.Layers)*float64(c.Dim)*float64(c.Seq)
}
