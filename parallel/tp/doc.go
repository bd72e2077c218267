// Package tp holds the tensor-parallel layers (Megatron-LM style): the
// layers of package layers with their weights split over a TP group of P
// ranks, built from the conjugate regions of package overlap (each forward
// collective has its adjoint as backward) and from its communication sites:
// where a collective meets a matmul, the layer builds a site at construction
// (overlap.Chooser picks its strategy: collective, pipelined, ...) and calls
// it in Forward and Backward; the layers never call collectives of their
// own there.
//
// Every layer takes a Parallel value: its TP group (a comm.Comm, passed in,
// never global), the chooser of its sites' strategies, whether sequence
// parallelism is on, and the stream. Parameters keep the names layers gives them, and each rank
// registers only its shard, initialised with layers.ShardInit: a TP model
// holds exactly the slices of the unsharded model built with the same seed.
// Shards reports, per parameter, which slice a rank holds (or that it is
// replicated, and whether its gradient is a partial sum over the group).
//
// # The regions and their conjugate pairs
//
// N tokens (B·T rows), width C, P ranks; "n" is N, or N/P under sequence
// parallelism (SP).
//
//	ColumnParallelLinear   W (Out/P, In) = rows of W
//
//	  x (n, In) ──[copy: fwd identity / bwd all-reduce]──────────► x (N, In) ─► x·Wᵀ ─► y (N, Out/P)
//	              (bwd: a matmul∘all-reduce site)
//	            ──[SP: fwd all-gather / bwd reduce-scatter]──────►   (an all-gather∘matmul site)
//	  optional: y ──[gather: fwd all-gather last dim / bwd split]─► y (N, Out)
//
//	RowParallelLinear      W (Out, In/P) = columns of W
//
//	  x (N, In/P) ─► x·Wᵀ partial ──[reduce: fwd all-reduce / bwd identity]────────► y (N, Out)
//	                              ──[SP: fwd reduce-scatter / bwd all-gather]──────► y (N/P, Out)
//	                                (fwd: a matmul∘all-reduce site; SP: a matmul∘reduce-scatter site)
//
//	VocabParallelEmbedding table (V/P, C) = rows of the table
//
//	  ids ─► this rank's ids looked up, others 0 ──[reduce: all-reduce / identity]──► (N, C)
//	                                             ──[SP: reduce-scatter / all-gather]─► (N/P, C)
//
//	VocabParallelCrossEntropy   logits (N, V/P) = columns of the logits
//
//	  per row: the local log-sum-exp and loss, one all-gather of both, the global
//	  log-sum-exp on the device; backward local (no collective).
//
// A transformer block puts them together — Block is layers.Block with
// Attention and MLP as its parts (the attention's heads and the MLP's
// hidden features are split; the norms and the residual stream stay
// outside the regions):
//
//	x ─► RMSNorm ─► [enter] ─► wq,wk,wv (column) ─► RoPE, attention on H/P heads (Hkv/P kv heads) ─► wo (row) ─► [leave] ─► + x
//	  ─► RMSNorm ─► [enter] ─► w_gate,w_up (column) ─► SwiGLU on F/P features ─► w_down (row) ─► [leave] ─► +
//
// where [enter] is copy (identity, all-reduce of the gradient) or, under
// SP, all-gather (reduce-scatter of the gradient), and [leave] is
// all-reduce (identity) or, under SP, reduce-scatter (all-gather). Columns
// that read the same input (q, k, v; gate, up) enter the region once: one
// site for all of them (one all-gather streamed into every weight's matmul,
// and one all-reduce or reduce-scatter of the summed input gradient, which
// moves while the weight gradients compute).
//
// Under SP the residual stream, the norms and the embedding's output are
// split along the tokens, so their activations take 1/P of the memory; the
// norm weights' gradients then cover only a rank's tokens and must be summed
// over the TP group (shard.Shard.PartialGrad) — parallel/model does that with the
// data-parallel reduction.
//
// The layers follow the conventions of package layers: Forward(out, x)
// keeps what the backward needs, Backward(dx, dout) overwrites dx and adds
// into the parameters' gradients, errors (not panics) say what was expected,
// and the backend's sticky error is checked before every collective, so a
// rank whose backend failed stops before it moves garbage.
//
// A layer owns the sites it built: Close (on the linears, Attention, MLP
// and Block) releases them once, in the order they were built, on every
// rank alike (a site's symmetric buffers are freed collectively); Forward
// then refuses.
package tp
