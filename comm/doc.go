// Package comm is the communication layer of asynctp: the Comm interface
// that every transport implements (comm/local in-process, comm/nccl and
// comm/nvshmem on GPUs), the rank grid that carves TP, DP and EP groups from
// the world, Megatron's conjugate mappings, and the Strategy interface of the
// fused communication sites.
//
// # The async contract
//
// Every data op takes a Stream and returns a Work. The op is queued on the
// stream; Work.Wait(s) orders stream s after it (a GPU Work makes s wait on
// an event and returns at once; a CPU Work blocks until the op is done). Until
// Wait, the op's buffers belong to the transport. Overlap is therefore a
// visible decision: a caller that wants a gradient all-reduce to run under
// the next matmul starts it, issues the matmul, and waits later. nil is the
// default stream (synchronous on the CPU).
//
// # Groups
//
// Groups are values, passed to whoever needs them, never globals. Split
// follows MPI (same color → same group, ordered by key then rank; NoColor
// joins none). NewGrid builds a run's groups: TP groups of consecutive ranks,
// DP groups strided by TP, and EP groups of consecutive ranks laid over the
// same world with their EDP ("expert data parallel") complements; see Grid.
//
// # Errors
//
// Errors are values, never panics. An op's error is a *Error naming the op,
// the group (Comm.Name, e.g. "tp[2 3]") and the rank, and saying what was
// expected and what was found; transports share the Check functions, so
// they word the local checks alike. ErrTimeout, ErrAborted, ErrMismatch and
// ErrClosed tell the kinds of failure apart (errors.Is). Transports put a
// deadline on every blocking call; one that can abort (Aborter) lets a failed
// rank wake its peers at once.
//
// # Optional capabilities
//
// Like io.WriterTo, extra abilities are interfaces found by type assertion:
// SymmetricMemory (a symmetric heap for one-sided transports), Aborter,
// NamedSplitter on a Comm; ColumnCopier on a tensor.Backend.
//
// # Mappings
//
// The conjugate pairs of tensor parallelism are written once, as
// XxxForward / XxxBackward functions (mappings.go): copy-to-region,
// reduce-from-region, scatter-to-region, gather-from-region, the two
// sequence-parallel pairs and the all-to-all. Each returns early on a group
// of one rank, takes its group as an argument and orders its result on the
// stream it is given, which must be the stream of the backend b.
//
// Splitting and gathering along the last dim move strided blocks, which
// collectives (contiguous along dim 0) cannot. A last-dim all-gather runs as
// an all-gather along dim 0 into a scratch (P·R, C/P) from the backend,
// followed by one column-block copy per rank into (R, C); a last-dim split is
// one column-block copy. A column-block copy uses, fastest first: the
// backend's ColumnCopier (one strided copy, cudaMemcpy2DAsync on a GPU);
// direct slice copies when both tensors are in host memory; otherwise one
// backend.Copy per row on 1-row views, which is correct on any backend.
//
// # Strategies
//
// The fused sites of sequence parallelism, AllGatherMatmul and
// MatmulReduceScatter with their backward twins, sit behind the Strategy
// interface so that the GPU strategies (pipelined chunks, fused NVSHMEM
// kernels) can replace the reference, Collective: the collective, then the
// matmul. Every strategy must match Collective within bf16 tolerance.
package comm
