// Package local is the in-process transport of comm: the N ranks of a world
// are goroutines of one process, with real collective semantics on host
// tensors (Float32, Float64, Int32 and BFloat16; reductions on the float
// dtypes, and Sum and Max on Int32). Every TP and EP equivalence test runs on
// it, on any machine.
//
// How a collective runs: each rank's call takes the next sequence number of
// its handle on the group; the calls with the same number meet in a slot.
// The ranks check their own arguments (the comm.Check functions) and that
// they agree with the first rank to arrive (same op, dtype, shape, root):
// a disagreement fails the slot for every rank with an error naming both
// ranks and wrapping comm.ErrMismatch. The last rank to arrive runs the op
// for all of them, on its own goroutine; the others wait.
//
// Reductions accumulate in float64 in a fixed order, rank 0 first, and round
// once to the dtype, so their results are deterministic and bit-identical on
// every rank.
//
// Failures never hang. Every blocking wait has a deadline (WithTimeout,
// DefaultTimeout otherwise): a rank that does not arrive makes the others
// fail with an error naming it and the op ("local: all-reduce on tp[0 1],
// rank 0: call #3: rank 1 did not arrive within 2s"), wrapping
// comm.ErrTimeout, and poisons the world so that every other pending or
// later call fails at once. A rank that fails on its own calls Abort (Run
// does it for it), and the others fail promptly with an error naming it. A
// rank that closes its handle makes the peers that wait for it fail with
// comm.ErrClosed.
//
// Groups from Split (comm.NewGrid's TP, DP, EP groups) have their own slots
// and lock, so ranks may drive several groups concurrently, one goroutine
// per group. Streams are ignored. With Async, data ops return before they
// have run and Work.Wait blocks, which makes the race detector catch callers
// that break the async contract of comm.Work.
package local
