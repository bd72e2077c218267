package hf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/asynctp/asynctp/layers"
)

// ConfigFile is the name of a model directory's configuration.
const ConfigFile = "config.json"

// Config is the part of a transformers LlamaConfig or MixtralConfig that
// our model has, plus what must be checked to refuse what it has not.
type Config struct {
	ModelType             string          `json:"model_type"`
	Architectures         []string        `json:"architectures,omitempty"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"`
	HeadDim               int             `json:"head_dim,omitempty"`
	HiddenAct             string          `json:"hidden_act"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	InitializerRange      float64         `json:"initializer_range"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	RopeTheta             float64         `json:"rope_theta"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	// RopeParameters is where transformers 5 keeps rope_theta and the
	// rope type ("default" is plain RoPE).
	RopeParameters *struct {
		RopeTheta float64 `json:"rope_theta"`
		RopeType  string  `json:"rope_type"`
	} `json:"rope_parameters,omitempty"`
	TieWordEmbeddings bool   `json:"tie_word_embeddings"`
	AttentionBias     bool   `json:"attention_bias"`
	MLPBias           bool   `json:"mlp_bias"`
	TorchDType        string `json:"torch_dtype,omitempty"`
	// Mixtral.
	NumLocalExperts   int             `json:"num_local_experts,omitempty"`
	NumExpertsPerTok  int             `json:"num_experts_per_tok,omitempty"`
	RouterAuxLossCoef float64         `json:"router_aux_loss_coef,omitempty"`
	SlidingWindow     json.RawMessage `json:"sliding_window,omitempty"`
}

// ReadConfig reads dir/config.json.
func ReadConfig(dir string) (Config, error) {
	var c Config
	path := filepath.Join(dir, ConfigFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("hf: %w (expected a Hugging Face model directory with config.json and model.safetensors)", err)
	}
	// The defaults of transformers' LlamaConfig for the fields a file may
	// leave out.
	c = Config{HiddenAct: "silu", RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 2048, InitializerRange: 0.02}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("hf: %s: %w", path, err)
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if rp := c.RopeParameters; rp != nil {
		if rp.RopeTheta > 0 {
			c.RopeTheta = rp.RopeTheta
		}
		if rp.RopeType != "" && rp.RopeType != "default" {
			c.RopeScaling = json.RawMessage(fmt.Sprintf(`{"rope_type": %q}`, rp.RopeType))
		}
	}
	return c, nil
}

// MoE reports whether c is a Mixtral config.
func (c Config) MoE() bool { return c.ModelType == "mixtral" }

// Model returns the layers.GPTConfig of c, or an error naming each field
// our model cannot express. seq is the run's sequence length (at most
// max_position_embeddings).
func (c Config) Model(seq int) (layers.GPTConfig, error) {
	var bad []string
	if c.ModelType != "llama" && c.ModelType != "mixtral" {
		bad = append(bad, fmt.Sprintf("model_type %q, expected \"llama\" or \"mixtral\"", c.ModelType))
	}
	if c.HiddenAct != "silu" {
		bad = append(bad, fmt.Sprintf("hidden_act %q, expected \"silu\" (SwiGLU)", c.HiddenAct))
	}
	if len(c.RopeScaling) > 0 && string(c.RopeScaling) != "null" {
		bad = append(bad, fmt.Sprintf("rope_scaling %s, expected null (plain RoPE)", c.RopeScaling))
	}
	if c.AttentionBias || c.MLPBias {
		bad = append(bad, fmt.Sprintf("attention_bias %v, mlp_bias %v, expected both false (no biases)", c.AttentionBias, c.MLPBias))
	}
	if c.NumAttentionHeads <= 0 || c.HiddenSize%max(c.NumAttentionHeads, 1) != 0 {
		bad = append(bad, fmt.Sprintf("num_attention_heads %d does not divide hidden_size %d", c.NumAttentionHeads, c.HiddenSize))
	} else if c.HeadDim != 0 && c.HeadDim != c.HiddenSize/c.NumAttentionHeads {
		bad = append(bad, fmt.Sprintf("head_dim %d, expected hidden_size/num_attention_heads = %d", c.HeadDim, c.HiddenSize/c.NumAttentionHeads))
	}
	if c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%max(c.NumKeyValueHeads, 1) != 0 {
		bad = append(bad, fmt.Sprintf("num_key_value_heads %d does not divide num_attention_heads %d", c.NumKeyValueHeads, c.NumAttentionHeads))
	}
	if c.MoE() {
		if c.NumLocalExperts <= 0 || c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NumLocalExperts {
			bad = append(bad, fmt.Sprintf("num_local_experts %d, num_experts_per_tok %d, expected 1 ≤ per token ≤ experts", c.NumLocalExperts, c.NumExpertsPerTok))
		}
	}
	if sw := strings.TrimSpace(string(c.SlidingWindow)); sw != "" && sw != "null" {
		var w int
		if json.Unmarshal(c.SlidingWindow, &w) != nil || w < seq {
			bad = append(bad, fmt.Sprintf("sliding_window %s, expected null or at least the sequence length %d (our attention is full causal)", sw, seq))
		}
	}
	if seq > c.MaxPositionEmbeddings {
		bad = append(bad, fmt.Sprintf("the run's sequence length %d exceeds max_position_embeddings %d", seq, c.MaxPositionEmbeddings))
	}
	if len(bad) > 0 {
		return layers.GPTConfig{}, fmt.Errorf("hf: a %s config our model cannot take: %s", c.ModelType, strings.Join(bad, "; "))
	}
	m := layers.GPTConfig{Layers: c.NumHiddenLayers, Dim: c.HiddenSize, Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, Vocab: c.VocabSize,
		Seq: seq, FFN: c.IntermediateSize, TiedEmbeddings: c.TieWordEmbeddings, RopeTheta: c.RopeTheta,
		NormEps: float32(c.RMSNormEps), InitStd: c.InitializerRange}
	if c.MoE() {
		m.Experts, m.TopK, m.MoEEvery, m.AuxLossCoef = c.NumLocalExperts, c.NumExpertsPerTok, 1, c.RouterAuxLossCoef
	}
	if err := m.Validate(); err != nil {
		return layers.GPTConfig{}, fmt.Errorf("hf: %w", err)
	}
	return m.WithDefaults(), nil
}

// ConfigOf is the transformers config of our model m (defaults filled
// in): a LlamaConfig, or a MixtralConfig for an MoE model with MoE in
// every block. A model with MoE in some blocks only, or that drops tokens
// over an expert's capacity, has no transformers counterpart.
func ConfigOf(m layers.GPTConfig) (map[string]any, error) {
	m = m.WithDefaults()
	c := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": m.Vocab, "hidden_size": m.Dim, "intermediate_size": m.FFN,
		"num_hidden_layers": m.Layers, "num_attention_heads": m.Heads, "num_key_value_heads": m.KVHeads,
		"head_dim": m.Dim / m.Heads, "hidden_act": "silu", "max_position_embeddings": m.Seq,
		"initializer_range": floatJSON(m.InitStd), "rms_norm_eps": floatJSON(m.NormEps), "rope_theta": floatJSON(m.RopeTheta),
		"rope_scaling": nil, "tie_word_embeddings": m.TiedEmbeddings, "attention_bias": false,
		"attention_dropout": floatJSON(0), "mlp_bias": false, "pretraining_tp": 1, "use_cache": true,
		"torch_dtype": "float32",
	}
	if m.Experts > 0 {
		if m.MoEEvery != 1 {
			return nil, fmt.Errorf("hf: the model has MoE in every %d-th block only (moe_every %d); Mixtral, the transformers MoE of this shape, has it in every block", m.MoEEvery, m.MoEEvery)
		}
		if m.CapacityFactor != 0 {
			return nil, fmt.Errorf("hf: the model drops tokens over capacity (capacity_factor %v); Mixtral is dropless, so its logits would differ (a model of CapacityFactor 0 drops none)", m.CapacityFactor)
		}
		c["architectures"], c["model_type"] = []string{"MixtralForCausalLM"}, "mixtral"
		c["num_local_experts"], c["num_experts_per_tok"] = m.Experts, m.TopK
		c["router_aux_loss_coef"], c["output_router_logits"] = floatJSON(m.AuxLossCoef), false
		c["sliding_window"], c["router_jitter_noise"] = nil, floatJSON(0)
		delete(c, "mlp_bias")
		delete(c, "pretraining_tp")
	}
	return c, nil
}

// floatJSON is a float that marshals with a decimal point ("0.0", not
// "0"): transformers' strict config dataclasses refuse an int where the
// field is typed float (router_jitter_noise = 0 failed from_pretrained of
// MixtralConfig, transformers 5.17).
type floatJSON float64

func (f floatJSON) MarshalJSON() ([]byte, error) {
	s := strconv.FormatFloat(float64(f), 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEnN") {
		s += ".0"
	}
	return []byte(s), nil
}
