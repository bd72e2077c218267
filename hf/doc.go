// Package hf moves models between asynctp and Hugging Face transformers.
//
// Our GPT is Llama-shaped: pre-norm RMSNorm, rotate-half RoPE (the pair of
// features i and i+D/2 of a head turns together, as in transformers'
// rotate_half), SwiGLU, no biases. Its q and k projections therefore need
// no permutation: each head's rows are in the same order in both. An MoE
// model with MoE in every block is Mixtral-shaped (softmax router, top-k
// renormalised, experts w1 = gate, w3 = up, w2 = down).
//
// The names (ours → transformers):
//
//	embed.weight                       model.embed_tokens.weight
//	blocks.N.attn_norm.weight          model.layers.N.input_layernorm.weight
//	blocks.N.attn.{wq,wk,wv,wo}.weight model.layers.N.self_attn.{q,k,v,o}_proj.weight
//	blocks.N.mlp_norm.weight           model.layers.N.post_attention_layernorm.weight
//	blocks.N.mlp.w_{gate,up,down}.weight  model.layers.N.mlp.{gate,up,down}_proj.weight
//	blocks.N.moe.router.weight         model.layers.N.block_sparse_moe.gate.weight
//	blocks.N.moe.w_{gate,up,down} (E, ...)  model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.weight
//	final_norm.weight                  model.norm.weight
//	lm_head.weight                     lm_head.weight (absent when tied)
//
// Config maps LlamaConfig and MixtralConfig fields to layers.GPTConfig and
// back, refusing what our model cannot express (biases, rope_scaling,
// another activation, a head_dim other than hidden/heads); grouped-query
// attention (num_key_value_heads < num_attention_heads) maps to
// GPTConfig.KVHeads, its k and v projections taken as they are, and back.
// Consolidate merges the tensor- and expert-parallel shards of a
// checkpoint into the full tensors, and Shard cuts them again for a rank.
package hf
