// Package overlaptest is the conformance suite of the overlap strategies
// (gonum's testblas pattern): every strategy, on every transport, runs the
// same checks of every site kind against the unsharded math in float64, on
// seeded random non-zero inputs, ragged row counts, outputs poisoned with
// NaN, and two calls per site.
//
// A check runs on one rank (Rank): every rank of a group calls it with the
// same arguments, so the suite runs alike on goroutine ranks (CPU tests,
// RunLocal) and on process ranks (the GPU tests, one process per NVSHMEM
// PE or NCCL rank).
package overlaptest
