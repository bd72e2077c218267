// Package model is the tensor-, data- and expert-parallel GPT: layers.GPT
// built from the layers of parallel/tp and parallel/ep over a comm.Grid —
// the same block (layers.Block, through tp.Block) and the same assembly
// (layers.Decoder) as the single-rank model, with sharded parts; this
// package adds the layout, the gradient reduction and failure handling.
// Each rank holds one Model with its own shards. It knows nothing of the
// training loop: a Model has what train.Run (train.Model) and
// train.RunSharded (train.Sharded: its Layout, WorldRank and StepRange)
// need, and train adapts it, so the sharded model does not import train.
//
// # Layout
//
// World rank r of W = DP × TP ranks is TP rank r % TP of TP group r / TP and
// DP rank r / TP (comm.Grid). Within a TP group the weights are split
// (parallel/tp); the DP replicas hold the same shards and train on
// different rows of the batch.
//
//	             TP group 0                 TP group 1   (DP = 2, TP = 2)
//	          rank 0      rank 1         rank 2      rank 3
//	embed     V rows 0:V/2  V/2:V        0:V/2       V/2:V
//	wq        heads 0:H/2   H/2:H        0:H/2       H/2:H      (column-parallel)
//	wk,wv     kv heads 0:Hkv/2  Hkv/2:Hkv  (likewise)           (column-parallel; Hkv = H without GQA)
//	wo        columns likewise                                  (row-parallel)
//	w_gate,up FFN 0:F/2     F/2:F        ...                    (column-parallel)
//	w_down    columns likewise                                  (row-parallel)
//	norms     whole         whole        whole       whole      (replicated)
//	lm_head   V rows 0:V/2  V/2:V        0:V/2       V/2:V      (column-parallel; tied: the embedding's)
//	batch     rows 0:B/2    rows 0:B/2   rows B/2:B  rows B/2:B
//
// # Mixture of experts
//
// With GPTConfig.Experts > 0 the MoE blocks (GPTConfig.IsMoE) are
// MoEBlocks: TP attention as above, then an ep.MoE over the grid's EP group
// (EP consecutive world ranks; EP divides the world, which may put an EP
// group across TP ranks, DP replicas or both) holding experts
// [r·E/EP, (r+1)·E/EP) on EP rank r, the router replicated everywhere.
// Each rank must bring different tokens to the EP layer: under sequence
// parallelism the TP ranks already hold different rows; without it the
// block takes this TP rank's 1/TP of its replica's rows (a split, whose
// backward is an all-gather) and all-gathers the outputs (whose backward
// is a split). So in an MoE block world rank r routes the tokens
// [r·N/W, (r+1)·N/W) of the global batch of N tokens, and the world is the
// layer's token group (ep.Parallel.TokenGroup): the auxiliary losses, router
// statistics, capacity and drops are those of the whole global batch, in
// token order, as layers.GPT computes them.
//
//	TP = 2, DP = 2, EP = 4, 8 experts          rank 0    rank 1    rank 2    rank 3
//	attention, dense MLP, embedding, head      TP shards as above
//	router                                     whole     whole     whole     whole
//	experts (w_gate, w_up, w_down)             0:2       2:4       4:6       6:8
//	MoE tokens (global batch of N)             0:N/4     N/4:N/2   N/2:3N/4  3N/4:N
//
// Every rank is given the GLOBAL batch (B, T) — the same loader, seed and
// position on every rank, so a run at any layout sees the batches of the
// single-rank run — and replica d takes rows [d·B/DP, (d+1)·B/DP)
// (ReplicaRows). Forward returns the global mean loss on every rank: the
// per-row losses (the same on every rank of a TP group, from the
// vocab-parallel cross-entropy) are summed and all-reduced over DP on the
// device, and only that one scalar is read back (by ReadLoss, after the
// Backward when train.Run drives ForwardAsync) and divided
// by the number of non-ignored targets of the global batch, and each
// replica's gradient is that of its rows' losses scaled by the same
// 1/count.
//
// # Gradients
//
// Backward (and ForwardBackward) runs the sharded backward and reduces:
//
//	every parameter but the experts     all-reduce (sum) over DP     (in buckets, behind the backward)
//	expert shards                       all-reduce (sum) over EDP    (the ranks holding the same experts; in buckets)
//	replicated, partial per TP rank     all-reduce (sum) over TP     (norm weights under sequence parallelism; routers; after the backward)
//
// The sums run on the main gradients (fp32 for a bf16 model, beside the
// optimizer's fp32 master weights), in buckets of the flat gradient, each
// started on a side stream (a goroutine on the CPU) as soon as the
// backward has written its last gradient (parallel/grads, as
// Options.GradReduce says: the dtype, the buckets' size, overlapped or
// after the backward); the step ends when every sum has. The TP sums wait
// for the end of the backward, which uses the TP group itself. After them
// every gradient is d(global loss)/dθ for this rank's slice,
// and replicated parameters are bit-identical on every rank. A router's
// gradient covers its rank's tokens, so DP then TP sums it over the whole
// world; an expert's already covers every token of its EP group, so only
// EDP adds the other groups'. The loss is the global mean cross-entropy
// plus the MoE blocks' AuxLoss (one value for the global batch); each rank
// adds the aux gradient for its own tokens and the reductions are sums, so
// the gradient of the aux term comes out whole (ep.Parallel.AuxGradScale stays
// 1). GradSumSquares counts each parameter once: the TP shards' Σ g²
// summed over the TP group, the expert shards' over the EP group, the
// replicated ones taken once, nothing over DP or EDP.
// train.Run uses it for the clipping norm (train.GradSumSquarer); the
// AdamW update is elementwise, so each rank updates its shards exactly as
// the single-rank run updates those slices.
//
// # Micro-batches
//
// SetMicroBatches(k) makes ForwardBackward run the global batch as k
// micro-batches (gradient accumulation, train.Config.MicroBatch): micro-batch
// j is rows [j·B/k, (j+1)·B/k) of the global batch and each replica takes
// its B/(k·DP) rows of it, so at any layout the micro-batches are those of
// the single-rank run. Every micro-batch's losses are scaled by 1/(the
// non-ignored targets of the whole global batch); their gradients add up in
// the main gradients and are reduced once, on the last. The MoE blocks
// route, fill their capacity and weigh their auxiliary losses over each
// micro-batch's tokens (of the whole world, their token group), the
// auxiliary losses entering with weight 1/k each and the router statistics
// summed (layers.Decoder.ForwardBackward, layers.CombineMoEStats).
//
// # Checkpoints
//
// train.RunSharded wraps train.Run for one rank: rank r keeps its
// checkpoints (its shards and their moments, under the unsharded model's
// parameter names) in outDir/rank-0000r (train.RankDir), and rank 0 alone
// writes metrics.jsonl and loss.png in outDir; each state.json records
// the rank's Layout and the number of ranks, and each file every tensor's
// slice of the full tensor (Shards). All ranks resume from the same step
// (the newest that every rank holds, when a rank died between its peers'
// checkpoints of a step): at the same layout each from its own
// checkpoint, exactly; at another (TP, DP, EP, sequence parallelism) each
// assembles its part of every weight and moment from the pieces of the
// checkpoint's ranks (the Model is a train.Resharder).
//
// # Failures
//
// Input errors (shapes, ids, a batch the layout cannot split) are found
// before any collective, identically on every rank. An error after that —
// a backend fault, a collective that fails — aborts the world
// (comm.Aborter), so the other ranks stop at once with an error naming the
// failing rank; a rank that dies silently is named by the others when the
// transport's deadline passes.
package model
