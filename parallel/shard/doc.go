// Package shard describes how a rank's parameters relate to the full
// parameters of a model split over ranks, and moves weights between the
// two: a Shard says which slice of which full parameter a rank holds and
// over which group (TP, EP, or none: replicated); Merge puts the ranks'
// pieces together, Cut takes a rank's piece out of a full tensor;
// SaveWeights and LoadWeights write and read a rank's weights as a
// safetensors file (a file of full tensors loads into any layout, and
// MergeFiles merges the files of a layout into the full tensors).
//
// The descriptions come from the layers: parallel/tp's and parallel/ep's
// layers return them (their Shards methods), and a model of one rank is
// described by Whole. The gradient reduction of parallel/grads is driven
// by the same descriptions.
package shard
