// Package layers holds the plain, single-rank layers of a GPT model, each
// with an explicit Forward and Backward written out (the llm.c / Megatron
// style; no autodiff), built only from tensor.Backend ops so that the same
// code runs on the CPU reference backend and on a GPU backend.
//
// # Parameters
//
// Layers register their parameters in a ParamSet when they are constructed
// (name, shape, weight-decay flag, initialiser). ParamSet.Materialize then
// allocates one flat weight buffer and one flat gradient buffer on the
// backend and turns every Param's W and G into views of them, decayed
// parameters first, so an optimizer can treat the model as two flat vectors.
// Initial values are drawn on the host from a PCG generator seeded by the
// set's seed and a hash of the parameter's name: they depend neither on the
// order of construction nor on the device. The zero ParamSet is an empty set
// of seed 0; a weight's standard deviation must be > 0 (Init: Constant(0)
// asks for zeros).
//
// A bf16 set can keep fp32 main gradients beside its gradients
// (UseMainGrads), into which each micro-batch's gradients add
// (AccumulateGrads); MainGrads is what the optimizer and the gradient
// reduction read. Decoder.ForwardBackward runs a step as micro-batches and
// tells a GradSync (parallel/grads' Reducer) when parameters' gradients are
// complete, so that their reduction can start behind the backward.
//
// # Conventions
//
//   - Activations are row-major; shapes are written next to the fields that
//     hold them, e.g. // (B*T, C). Layers that need the batch and sequence
//     structure (attention, blocks) take (B, T, C) tensors; the others accept
//     any leading dimensions and treat them as rows.
//   - Forward(out, x) writes the caller's out and keeps what the backward
//     needs (the inputs it was given, by reference, and its own internal
//     activations, which it allocates on first use and reuses while the
//     shapes stay the same). Backward(dx, dout) overwrites dx (nil skips the
//     input gradient where that is allowed) and accumulates (+=) into the
//     parameters' gradients, following tensor.Backend. The caller must keep
//     the forward's inputs unchanged until the backward has run, and dx must
//     not alias dout.
//   - Layer is that contract as an interface (Forward, Backward, Params):
//     Linear, MLP, Attention, Block, RMSNorm and MoE have it, as do the
//     tensor-parallel linears and MLP and the expert-parallel MoE, so a
//     program composes its own model from any of them.
//   - Errors, not panics: bad shapes, dtypes, token ids and lengths are
//     checked before any op is issued, and the error says what was expected
//     and what was found. At the end of each Forward and Backward the
//     layer returns the backend's sticky error, if any.
//
// GPT puts the layers together: token embedding, pre-norm transformer
// blocks (causal self-attention with rotary position embedding, SwiGLU
// MLP), a final RMSNorm, an LM head tied to the embedding or not, and a
// fused softmax cross-entropy.
//
// One model: Block and Decoder (the GPT assembly) take their parts as small
// interfaces (Mixer, FeedForward; TokenEmbedding, Projection, Loss) and are
// also the block and the assembly of the sharded model — parallel/tp and
// parallel/model build them from tensor-, vocab- and expert-parallel parts,
// with DecoderParts' hooks for the replica's rows, the token shard, the
// loss all-reduce and failure handling. Parallelism is a property of the
// parts, not a second copy of the model.
package layers
