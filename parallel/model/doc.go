// Package model is the tensor- and data-parallel GPT: layers.GPT built
// from the layers of parallel/tp over a comm.Grid, implementing
// train.Model. Each rank holds one Model with its own shards.
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
//	wq,wk,wv  heads 0:H/2   H/2:H        0:H/2       H/2:H      (column-parallel)
//	wo        columns likewise                                  (row-parallel)
//	w_gate,up FFN 0:F/2     F/2:F        ...                    (column-parallel)
//	w_down    columns likewise                                  (row-parallel)
//	norms     whole         whole        whole       whole      (replicated)
//	lm_head   V rows 0:V/2  V/2:V        0:V/2       V/2:V      (column-parallel; tied: the embedding's)
//	batch     rows 0:B/2    rows 0:B/2   rows B/2:B  rows B/2:B
//
// Every rank is given the GLOBAL batch (B, T) — the same loader, seed and
// position on every rank, so a run at any layout sees the batches of the
// single-rank run — and replica d takes rows [d·B/DP, (d+1)·B/DP)
// (ReplicaRows). Forward returns the global mean loss on every rank: the
// per-row losses (the same on every rank of a TP group, from the
// vocab-parallel cross-entropy) are summed, all-reduced over DP and divided
// by the number of non-ignored targets of the global batch, and each
// replica's gradient is that of its rows' losses scaled by the same
// 1/count.
//
// # Gradients
//
// Backward runs the sharded backward, then reduces:
//
//	every parameter                     all-reduce (sum) over DP     (one call on the flat buffer)
//	replicated, partial per TP rank     all-reduce (sum) over TP     (norm weights under sequence parallelism)
//
// after which every gradient is d(global mean loss)/dθ for this rank's
// slice, and replicated parameters are bit-identical on every rank.
// GradSumSquares counts each parameter once: the TP shards' Σ g² summed
// over the TP group, the replicated ones taken once, nothing over DP.
// train.Run uses it for the clipping norm (train.GradSumSquarer); the
// AdamW update is elementwise, so each rank updates its shards exactly as
// the single-rank run updates those slices.
//
// # Checkpoints
//
// Run wraps train.Run for one rank: rank r keeps its checkpoints (its
// shards and their moments, under the unsharded model's parameter names)
// and its metrics in outDir/rank-0000r (RankDir); each state.json records
// the rank's Layout; a resume checks the layout and that all ranks resume
// from the same step, then continues exactly.
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
