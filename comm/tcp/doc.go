// Package tcp is a CPU transport behind comm.Comm for ranks in separate
// processes, on one machine or several: host tensors move over TCP
// connections between the ranks. It is the gloo of asynctp, kept minimal:
// its purpose is to run the multi-process launcher, its failure handling
// and the parallel model across real processes on machines without GPUs
// (CI), with the same numbers as comm/local.
//
// # Setup
//
// New is collective: every rank listens on a port of its own (see
// WithHost), publishes "host:port" in the rendezvous store under
// "<prefix>/addr/<rank>", and connects to every other rank: the higher rank
// of each pair dials, and both sides exchange a hello naming the world and
// their ranks. The store is used for nothing else, so what it holds stays
// bounded (one key per rank and world). Every op has a deadline
// (WithTimeout, DefaultTimeout otherwise); so has New.
//
// # Ops
//
// Each rank has one reader goroutine per peer that files the peer's frames
// in a mailbox keyed by (group, op number, sender), so that sends never wait
// for the receiver's ops. An op is one exchange: every rank sends every
// other member its header (what it called: op, dtype, shape, counts) and
// the payload meant for it, then takes every other member's from the
// mailbox; the op then runs locally. All-gather sends src to everyone;
// reduce-scatter sends part q to rank q; all-reduce sends the whole buffer
// to everyone (P−1 copies: simple, not bandwidth-optimal); broadcast sends
// from the root only; all-to-all-v sends part q to rank q; barrier and
// split send headers only. Reductions accumulate in float64 in rank order
// and round once, so every rank gets the same bits as comm/local. Ops
// complete before they return: their Work is already done, and the stream
// argument is ignored. Groups made by Split share the world's connections
// and are told apart by an id that every member derives alike.
//
// # Errors and failures
//
// Errors are *comm.Error values naming the op, the group and the rank.
// Because every rank sees every other rank's header, ranks that disagree
// (different ops or sizes, all-to-all counts that do not match) all fail
// with comm.ErrMismatch naming the rank that differs, and the group stays
// usable; a rank whose call fails its local checks still takes part, so
// the others fail at once, naming it.
//
// A failure fails the whole world: every pending and later op of every
// group returns it. The failures and how they are noticed:
//
//   - a peer's process dies (exit, crash, SIGKILL): its connections end
//     without a goodbye, which every other rank sees at once: "world rank 2
//     is gone: its connection ended without a goodbye ..." (ErrPeerGone);
//   - a peer stalls: the op's deadline passes: "rank 2 did not arrive
//     within 30s" (comm.ErrTimeout);
//   - a rank fails on its own and calls Abort (comm.Aborter).
//
// The rank that notices tells the others with an abort frame carrying its
// error's text and the sentinels it wraps, so that they fail promptly with
// an error naming the lost rank instead of waiting for their deadlines.
// Close of the world says goodbye first, so a clean exit is not taken for
// a death; ops waiting for a rank that closed the group or the world fail
// with comm.ErrClosed.
//
// # Tests
//
// The tests run commtest's conformance suite (with its mismatch cases) on
// worlds of 1 to 5 ranks in one process, and commtest.RunRank in 2 and 4
// child processes of the test binary that meet through comm/rendezvous on
// 127.0.0.1; fault tests kill a child with SIGKILL in the middle of an op,
// leave a rank out of a collective, abort and close.
package tcp
