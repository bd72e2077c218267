// Package commtest is the conformance suite of comm.Comm transports (the
// gonum testblas pattern): every transport runs the same cases and must give
// the same results.
//
// In-process transports (comm/local) call Run with a function that makes
// worlds; Run drives each rank from its own goroutine over world sizes 1 to
// 8. Transports that run one rank per process (comm/nccl, comm/nvshmem) call
// RunRank from every process with that process's world Comm, a Memory that
// uploads to and downloads from the device, and the stream the ops run on.
// Each rank builds the seeded inputs of every rank (a pure function of the
// seed, the case and the rank) and checks its own results against a float64
// reference computed from them, so no rank needs another's results.
//
// The cases: every op (all-gather, reduce-scatter, all-reduce, all-to-all-v,
// broadcast, barrier) in every dtype that it supports and with every
// ReduceOp; uneven all-to-all counts with zero-length parts and a rank that
// sends and receives nothing; in-place all-gather; Work waited twice and two
// ops in flight; Split with two colors and reversed keys, a split of a split,
// comm.NoColor; ops on two sub-groups at once from two goroutines; the groups
// of comm.NewGrid; and local errors (shape, dtype, counts, root) that every
// transport must report as a *comm.Error naming the op, group and rank.
// Options add what only some transports can check: ranks that disagree
// (Mismatch) and a rank that never arrives or aborts (MissingRank).
//
// Data movement is compared exactly (the inputs are exact in bf16);
// reductions by relative norm: 1e-12 in f64, 1e-6 in f32, 1e-2 in bf16.
package commtest
