// Package comm is the transport contract of asynctp: the Comm interface
// that every transport implements (comm/local and comm/tcp on the CPU,
// comm/nccl and comm/nvshmem on GPUs), Work, the optional capabilities, the
// argument checks the transports share, and the rank grid that carves TP,
// DP and EP groups from the world. Compute lives elsewhere: the conjugate
// regions of tensor parallelism and the communication sites that meet the
// math are in package overlap.
//
// # The stream contract (every transport)
//
// Every data op takes a Stream and returns a Work:
//   - the op is ordered after the work already queued on the stream it is
//     given (a GPU transport queues it there, or on a stream of its own made
//     to wait on an event recorded there);
//   - its result is ordered before whatever the caller queues on stream s
//     after Work.Wait(s): a GPU Work makes s wait on an event recorded after
//     the op and returns at once (no host synchronisation); Wait(nil) blocks
//     the host until the op is done; a CPU Work returns when the op is done;
//   - until Wait, the op's buffers belong to the transport: the caller
//     neither reads its destination nor writes its source;
//   - a nil stream orders the op after nothing but the group's earlier ops:
//     the caller has made its inputs ready itself (synchronous copies, a
//     synchronised backend). On the CPU nil is the only stream.
//
// A group's ops run in the order they are issued, and every rank issues a
// group's ops in the same order. Side streams belong to the sites that use
// them (overlap); the fork/join between streams is a backend capability
// (tensor.Streams). Overlap is therefore a visible decision: a caller that
// wants a gradient all-reduce to run under the next matmul starts it,
// issues the matmul, and waits later.
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
// SymmetricMemory (a symmetric heap with peer pointers, for one-sided
// transports; found through decorators with SymmetricOf), Aborter and
// NamedSplitter.
package comm
