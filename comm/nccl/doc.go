// Package nccl is the NCCL transport behind comm.Comm: one process per GPU,
// collectives and point-to-point calls queued on CUDA streams, with
// deadlines, a watchdog and aborts.
//
// # Loading
//
// Nothing of NCCL is linked: the cgo layer (atp_nccl.c) includes neither
// nccl.h nor a CUDA header and links only -ldl. Load (called by New) opens
// libnccl.so.2, or the file named by ASYNCTP_LIBNCCL (internal/dynlib,
// the project's one loader), resolves every entry point into a table of
// function pointers with dlsym (a missing one is an error naming it, not a
// crash later), and checks that the version
// is at least MinVersion (2.18). The NCCL types are declared in atp_nccl.h
// with the layout of nccl.h 2.28.3: ncclConfig_t is the 2.28 struct
// (ncclConfig_v22800, 80 bytes on LP64), filled exactly like
// NCCL_CONFIG_INITIALIZER (size, magic 0xcafebeef, version 22803, every
// other field undefined), then blocking = 0. A missing library gives
//
//	nccl: cannot load libnccl.so.2 (set ASYNCTP_LIBNCCL to its path; it comes with the NCCL package or PyTorch's nvidia-nccl wheel): <dlerror>
//
// Load returns the Library (path and version) for the caller to log once;
// Comm.Library returns it too.
//
// # Worlds and groups
//
// New makes this process's rank of a world: rank 0 calls ncclGetUniqueId,
// the rendezvous store carries the id (BroadcastBytes), and every rank calls
// ncclCommInitRankConfig in non-blocking mode and polls
// ncclCommGetAsyncError until the communicator is ready or the deadline
// passes (then it is aborted). Split and SplitNamed use ncclCommSplit after
// an all-gather of (color, key), so that each group knows the world ranks
// of its members: Name reads like comm/local's, "world[0 1]", "tp[2 3]".
//
// # Tensors, streams and Work
//
// Ops move device tensors on the group's GPU whose Buffer has Ptr() uint64,
// the device address of element 0 (tensor/cudabackend's Buffer does): f32,
// bf16, i32 and f64 map to ncclFloat32 (7), ncclBfloat16 (9), ncclInt32 (2)
// and ncclFloat64 (8); sum, max and avg to ncclSum (0), ncclMax (2) and
// ncclAvg (4). Every op calls its comm.Check function first, then checks
// the device, the dtype and overlaps (in-place all-gather and
// reduce-scatter at this rank's part only).
//
// Streams follow comm's stream contract. Here the stream argument is a
// *cuda.Stream, on which the op is queued, or nil, the group's own stream
// (Comm.Stream); the returned Work is an event recorded after the op.
// AllToAllV is a group of ncclSend/ncclRecv, one pair per peer with a nonzero count, issued in one call into C; a rank that
// exchanges rows with itself only (any rank of a world of one) calls no
// NCCL: its own part is a device-to-device copy on the stream
// (cuMemcpyDtoDAsync), as NCCL does for the collectives of a communicator
// of one rank. Barrier is a one-element all-reduce on the group's stream,
// waited for on the host.
//
// # Host cost of an op
//
// The communicators are non-blocking (so that init, split and finalize
// keep a deadline and can be aborted). On those, NCCL 2.19 and later run
// every group, and every collective of a communicator of several ranks, on
// a launch thread of their own: the call answers ncclInProgress and the
// communicator takes no other call until ncclCommGetAsyncError says
// ncclSuccess, tens of microseconds later. An op polls for that, and
// Wait(nil) polls its event, without sleeping for up to 2 ms (in C for the
// former), then with sleeps: a Go sleep or timer lasts about a millisecond
// on Linux, whatever it asks for, so a wait that sleeps costs an op a
// millisecond. An op makes no host synchronisation and no allocation of
// device memory; its event comes from a pool that the watchdog refills.
//
// Ops of one group run in the order they are queued. Groups used from
// several goroutines at once (a TP and a DP group) must not share one
// stream: their ops would queue on it in an order that differs between
// ranks and deadlock; give each goroutine its own stream, or pass nil.
//
// # Failures
//
// Every op has a deadline (WithTimeout, DefaultTimeout otherwise). A
// watchdog goroutine per process polls the events of the queued ops and
// ncclCommGetAsyncError of every communicator; an op whose event has not
// completed by its deadline, or an asynchronous NCCL error, fails the whole
// world: every pending and later op, of every group, returns a *comm.Error
// naming the op, the group and the rank, wrapping comm.ErrTimeout or the
// NCCL *Error (with ncclGetLastError's text, which may name a peer), and
// every communicator is aborted with ncclCommAbort so that NCCL's kernels
// return. NCCL does not notice a peer whose process died when the ranks
// talk over NVLink or PCIe, so the ranks of a world also keep a heartbeat
// in the store (WithHeartbeat; rendezvous.Liveness, the heartbeats every
// transport shares): a rank that falls silent fails the world
// with ErrPeerGone and an error naming it, and a timeout's error says which
// peers were silent. A rank whose world fails (Abort included, see
// comm.Aborter) sets an abort key in the store, which every rank watches, so
// that the others fail promptly with an error naming it.
//
// # Threads
//
// CUDA's current context is per OS thread: every call into CUDA or NCCL is
// made with the goroutine locked to its thread and the device's primary
// context bound (NCCL uses the primary context too). ncclGroupStart and
// ncclGroupEnd are thread-local, so a group is issued on one locked thread.
//
// # Tests
//
// The pure-Go tests (type mapping, config layout, loader errors, the
// checks before any NCCL call) run everywhere (the heartbeats are tested
// in comm/rendezvous); TestFakeLibrary builds a fake libnccl with the C compiler and
// drives the loader and the non-blocking init through it in a child
// process. TestFakeOps drives ops through a fake libnccl that behaves like
// NCCL's non-blocking launch thread and a fake libcuda, and counts what an
// op costs the host: NCCL calls, host synchronisations, events, sleeps. The
// GPU tests skip, saying why, without libnccl.so.2 or a GPU.
// On the GPU machine (one command each):
//
//	go test -c -o build/comm_nccl.test ./comm/nccl     # on the dev machine
//	NCCL_NVLS_ENABLE=0 ./build/comm_nccl.test -test.v -test.timeout 30m
//	NCCL_NVLS_ENABLE=0 ./build/comm_nccl.test -test.run '^$' -test.bench BusBandwidth -test.timeout 30m
//
// BenchmarkBusBandwidth times the ops on the GPU with CUDA events around the
// loop, as bench/torch_nccl.py does for PyTorch, and reports us/op,
// host-us/op, algGB/s and busGB/s (ns/op is the host time of the loop alone).
//
// TestWorldOfOne runs commtest.RunRank in this process on GPU 0 (on
// tensor/cudabackend's memory when its kernels image is found and
// ASYNCTP_NCCL_TEST_RAW is unset, else on raw device memory; f64, which the
// backend does not store, always on raw memory). TestMultiProcess
// re-executes the test binary as min(GPUs, 8) children, one per GPU, that
// meet through comm/rendezvous on 127.0.0.1 and each run commtest.RunRank;
// TestKillRank kills one of them mid-collective and checks that the others
// fail within the deadline with an error naming it; TestStraggler checks a
// rank that never arrives. They skip on a machine with one GPU.
package nccl
