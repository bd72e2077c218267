// Package overlap is where communication meets math: the communication
// sites of tensor-parallel and MoE layers, the strategies that run them,
// and the chooser that picks a strategy for each site.
//
// A TP or MoE layer does not call collectives. At construction it asks for
// a site for each place where its communication meets its math, from a
// Spec (group, rows, widths, dtype), and calls the site in Forward and
// Backward:
//
//	site                     forward                         backward (the adjoint)
//	all-gather∘matmul        out_i = AG(x)·W_iᵀ              dx = RS(Σ_i dout_i·W_i); dW_i += dout_iᵀ·AG(x)
//	matmul∘reduce-scatter    out = RS(x·Wᵀ)                  dx = AG(dout)·W; dW += AG(dout)ᵀ·x
//	matmul∘all-reduce        out = AR(Σ_i a_i·op(W_i))       (the row-parallel exit; the column entry's backward)
//
// A site owns what lives as long as its layer: buffers, the side stream of
// its lane, signal words. Strategies, one type per name (a Strategy: a
// Builder of sites under the name a configuration uses):
//   - Collective, the reference: the collective, then the matmul;
//   - pipelined and fused, the types of overlap/strategies (the registry:
//     strategies.All, strategies.Available), which pick their
//     implementation per site from what its group and backend offer.
//
// The implementations are Builders without a name: Exchange here (the
// pipelined schedule on any transport: the collective in P−1 exchange
// steps on a lane, a side stream on the GPU, a goroutine on the CPU, the
// math of each chunk as soon as it has landed, the own shard first); on
// symmetric memory with peer pointers, overlap/peercopy (the TP sites by
// copy-engine pulls, a GEMM per chunk or our GEMM engine waiting per
// chunk) and parallel/ep/peerep (the expert path).
//
// A Chooser maps each site to a strategy from a Config (the --overlap flag
// and the "overlap" section of a run's configuration); "auto" consults a
// Tuning, the autotune cache that cmd/ablate writes (WithTuning). Every strategy
// passes the conformance suite in overlap/overlaptest against Collective.
//
// Shadow mode (Shadow, ShadowConfig; a Chooser WithShadow) checks a
// strategy against Collective while a run trains: on the steps the
// training loop's Shadow samples, every site whose strategy is not
// collective also runs collective from the same inputs into buffers of its
// own, and the differences (Diff: the relative difference and the distance
// in ULPs) of its outputs, input gradient and weight gradients are
// recorded, merged over the world, reported per step (metrics) and per
// site (Summary), and bounded (FailAbove). The MoE expert path's shadow is
// parallel/ep's, through Chooser.ShadowOf.
//
// The Megatron conjugate pairs (regions.go) stay for the communication
// that meets no matmul: each has a forward and its adjoint.
package overlap
