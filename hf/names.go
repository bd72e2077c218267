package hf

import (
	"fmt"

	"github.com/asynctp/asynctp/layers"
)

// Param is one parameter of our unsharded model: its name, its full shape,
// and whether it is a stacked expert weight (E, ...), split over EP ranks
// along its first dimension.
type Param struct {
	Name   string
	Shape  []int
	Expert bool
}

// Params lists the parameters of layers.GPT for m (defaults filled in),
// in its order, with their full shapes.
func Params(m layers.GPTConfig) []Param {
	m = m.WithDefaults()
	C, F, V, E, KV := m.Dim, m.FFN, m.Vocab, m.Experts, m.KVDim()
	ps := []Param{{Name: "embed.weight", Shape: []int{V, C}}}
	for l := range m.Layers {
		b := fmt.Sprintf("blocks.%d.", l)
		ps = append(ps, Param{Name: b + "attn_norm.weight", Shape: []int{C}})
		for _, w := range []struct {
			name string
			out  int
		}{{"wq", C}, {"wk", KV}, {"wv", KV}, {"wo", C}} {
			ps = append(ps, Param{Name: b + "attn." + w.name + ".weight", Shape: []int{w.out, C}})
		}
		ps = append(ps, Param{Name: b + "mlp_norm.weight", Shape: []int{C}})
		if m.IsMoE(l) {
			ps = append(ps, Param{Name: b + "moe.router.weight", Shape: []int{E, C}},
				Param{Name: b + "moe.w_gate", Shape: []int{E, F, C}, Expert: true},
				Param{Name: b + "moe.w_up", Shape: []int{E, F, C}, Expert: true},
				Param{Name: b + "moe.w_down", Shape: []int{E, C, F}, Expert: true})
			continue
		}
		ps = append(ps, Param{Name: b + "mlp.w_gate.weight", Shape: []int{F, C}},
			Param{Name: b + "mlp.w_up.weight", Shape: []int{F, C}},
			Param{Name: b + "mlp.w_down.weight", Shape: []int{C, F}})
	}
	ps = append(ps, Param{Name: "final_norm.weight", Shape: []int{C}})
	if !m.TiedEmbeddings {
		ps = append(ps, Param{Name: "lm_head.weight", Shape: []int{V, C}})
	}
	return ps
}

// hfNames maps each of our names to the transformers name, for a dense or
// a Mixtral model; an expert weight maps to the format of the names of its
// experts ("...experts.%d.w1.weight").
func hfName(p Param) string {
	var l int
	var rest string
	if n, _ := fmt.Sscanf(p.Name, "blocks.%d.%s", &l, &rest); n == 2 {
		pre := fmt.Sprintf("model.layers.%d.", l)
		if s, ok := map[string]string{
			"attn_norm.weight": "input_layernorm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
			"attn.wq.weight": "self_attn.q_proj.weight", "attn.wk.weight": "self_attn.k_proj.weight",
			"attn.wv.weight": "self_attn.v_proj.weight", "attn.wo.weight": "self_attn.o_proj.weight",
			"mlp.w_gate.weight": "mlp.gate_proj.weight", "mlp.w_up.weight": "mlp.up_proj.weight",
			"mlp.w_down.weight": "mlp.down_proj.weight", "moe.router.weight": "block_sparse_moe.gate.weight",
			"moe.w_gate": "block_sparse_moe.experts.%d.w1.weight", "moe.w_up": "block_sparse_moe.experts.%d.w3.weight",
			"moe.w_down": "block_sparse_moe.experts.%d.w2.weight",
		}[rest]; ok {
			return pre + s
		}
	}
	switch p.Name {
	case "embed.weight":
		return "model.embed_tokens.weight"
	case "final_norm.weight":
		return "model.norm.weight"
	case "lm_head.weight":
		return "lm_head.weight"
	}
	panic("hf: internal error: no transformers name for " + p.Name)
}
