// Package grads reduces the gradients of any model whose parameters are
// split over ranks, driven by what the layers describe of their
// parameters (shard.Shard): the sums over the data-parallel, tensor-parallel
// and expert groups that give every rank the gradient of the global loss
// (Reducer.Reduce), and the global gradient norm with each parameter
// counted once (GradSumSquares on the host, GradSumSquaresTo on the device
// for optim.AdamW.ClipStep, ClipGrads for a loop that clips itself).
//
// Reductions lists the sums as gradient tensors grouped by the group they
// are summed over, so a caller can schedule them itself (in buckets, behind
// the backward). parallel/model's GPT uses this package; a custom model
// passes its layers' Shards and the groups of its grid.
package grads
