// Package nvshmem is the NVSHMEM transport behind comm.Comm: one process per
// PE, several PEs per GPU allowed, collectives queued on CUDA streams, a
// symmetric heap for the fused (one-sided) strategies, deadlines and a
// watchdog.
//
// # Loading
//
// NVSHMEM 3.x comes here as PyTorch's wheel: a host library
// (libnvshmem_host.so.3) and a static device library (libnvshmem_device.a).
// nvshmem_init and nvshmemx_init_attr are inline functions of the headers
// that call nvshmemi_init_thread, which lives in the static device library
// and also initialises the NVSHMEM device state of the module it is linked
// into. A Go program that only dlopens the host library can therefore not
// initialise NVSHMEM the documented way, and kernels that call NVSHMEM
// device functions must be device-linked against libnvshmem_device.a.
//
// So the transport's native half is a small shared library,
// build/libasynctp_nvshmem.so, built by nvcc on the GPU machine
// (`bash cuda/nvshmem/build.sh`; sources in cuda/nvshmem): its objects are
// compiled with -rdc=true, device-linked with libnvshmem_device.a, and linked
// against libnvshmem_host.so.3 with an rpath to its folder and the static
// CUDA runtime. It exports plain C entry points (atp_nv_*, declared in
// cuda/nvshmem/atp_nvshmem.h): the UID bootstrap, the symmetric heap, teams,
// the on-stream collectives, the exchange and barrier kernels, and the few
// CUDA runtime calls the Go side needs (streams, events, copies). This
// package dlopens it at run time (the cgo layer links only -ldl, so the
// package builds and its pure tests run anywhere), resolves every entry point
// into a table of function pointers, and checks that the library was built
// from the same header (ABI number, struct size). It is found at
// $ASYNCTP_LIBNVSHMEM, else next to the executable, else in the repository's
// build folder; a missing library gives an error naming the file, the
// variable and the build command.
//
// The alternative, dlopening libnvshmem_host.so.3 and initialising with
// nvshmemx_hostlib_init_attr, then loading kernels as a fatbin through the
// driver API and calling nvshmemx_cumodule_init on the module, was not tried
// on the GPU machine, whereas nvshmemx_init_attr from a device-linked binary
// was seen working there. The fused kernels call no NVSHMEM device
// function (they use the heap's peer pointers) and live in the ordinary
// kernels image; CUModuleInit (nvshmemx_cumodule_init on a module loaded
// through package cuda) stays for an image that would.
//
// The library makes the device current (cudaSetDevice) in every entry point,
// so no Go goroutine needs to be locked to a thread for it; it uses the
// device's primary context, the one package cuda and tensor/cudabackend use,
// so pointers and streams are shared.
//
// # Worlds, groups and paths
//
// New makes this process's PE of a world: rank 0 gets NVSHMEM's unique id,
// the rendezvous store carries it to the others (no MPI, PMI or launcher),
// and every rank calls nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID). It
// then allocates an arena on the symmetric heap (WithMaxGroups slots of
// WithStaging bytes plus signal words), finds which peers it reaches by
// loads and stores (nvshmem_ptr) and tells the others through the store.
// Rank 0 logs one line (Report): the NVSHMEM version, the hosts, GPUs and
// PEs per GPU, NVSHMEM's mode (one PE per GPU, limited MPG without MPS, full
// MPG with MPS), how its peers are reached (P2P on the same GPU, P2P on
// another GPU, remote) and the remote transport as configured.
//
// A group runs its collectives on one of two paths:
//
//   - the team path: all-gather, reduce-scatter, all-reduce and broadcast
//     are NVSHMEM's on-stream collectives (fcollect, reducescatter, reduce,
//     broadcast) on the group's NVSHMEM team. The world's team is
//     NVSHMEM_TEAM_WORLD; Split makes teams with nvshmem_team_split_strided,
//     which only makes groups of evenly strided ranks of the parent in
//     increasing order: the TP, DP, EP and EDP groups of comm.NewGrid are;
//     a group in another order (keys that reverse it) or of uneven members
//     gets no team.
//   - the P2P path: the exchange kernels of libasynctp_nvshmem.so (see
//     cuda/nvshmem/README.md). Every pair of ranks moves its bytes in rounds
//     through the receiver's symmetric staging: sender blocks store straight
//     into the peer's staging through the P2P mapping and set a signal word
//     there; receiver blocks wait for it, copy (or reduce, in fp32 or fp64,
//     in rank order) into the destination and acknowledge; two slots per
//     pair keep two rounds in flight. Counts may differ per pair, so
//     all-to-all-v (which NVSHMEM lacks) always runs here. It needs every
//     pair of the group to be P2P-reachable (one node).
//
// Under Auto a group uses the team path where it has a team (bf16
// reductions only if the NVSHMEM headers have them), else the P2P path.
// NVSHMEM's collectives are not available in limited MPG mode (several PEs
// on one GPU without MPS: NVSHMEM exits the process if they are called), so
// there no team is made and everything runs on the exchange kernels; that is
// how the tests run on a one-GPU machine. WithAlgorithm(Kernels) forces the
// P2P path everywhere, Collectives makes New fail in limited MPG mode. Path
// says what a group uses. A group with neither a team nor full P2P (a
// reordered group across nodes) cannot be made: Split fails for its ranks.
//
// # Tensors, staging and streams
//
// Ops move device tensors on the group's GPU whose Buffer has Ptr() uint64
// (tensor/cudabackend's Buffer, DeviceBuffer from DeviceMemory,
// SymmetricBuffer from AllocSymmetric), of f32, bf16, i32 or f64; every op
// calls its comm.Check function first. NVSHMEM can only address the
// symmetric heap, so tensors elsewhere pass through the group's staging:
// on the team path one D2D copy in and one out per chunk of at most the
// staging size (divided by the group size plus one for all-gather and
// reduce-scatter, by two for all-reduce and broadcast), on the P2P path one
// copy per side, the sender's straight into the peer's staging. For bytes
// that could have gone directly, that is about two more passes over HBM per
// op: about 0.5 ms per GiB staged on an H200 (4.2 TB/s of reads and writes). All-gather and
// reduce-scatter on a team skip the staging when both tensors are
// symmetric (every rank passing the same view) and disjoint.
//
// Streams follow comm's stream contract. Here every op is queued on the
// group's own stream (Stream), made to wait with an event on the stream it
// is given: a *cuda.Stream, or any value with Handle() uintptr
// (StreamHandle); the returned Work is an event recorded after the op. A
// group's ops run in order; groups run concurrently on
// their own streams, so two goroutines may drive a TP and a DP group at once.
// Barrier is a kernel on the group's stream, waited for on the host.
//
// # Deadlines and failures
//
// Every op has a deadline (WithTimeout, DefaultTimeout). The exchange and
// barrier kernels give up a wait after it and record which peer they waited
// for; the op then fails with an error naming the op, the group, the rank
// and that peer. A watchdog goroutine per world polls the events of the
// queued ops and those records; an op past its deadline plus a grace period
// (the team path has no kernel-side timeout) fails too. Either way the whole
// world fails: every pending and later op of every group returns a
// *comm.Error wrapping comm.ErrTimeout. NVSHMEM cannot abort: a collective
// kernel of NVSHMEM waiting for a dead peer, or a host call such as a team
// split or nvshmem_finalize, never returns. So a process whose world failed
// should exit (WithOnFailure is called once with the error; by default it is
// logged with that advice); its Close returns at once without finalising.
// Calls that block the host in NVSHMEM (init, the arena and AllocSymmetric,
// team splits, team destroy, finalize) run with the same deadline and fail
// the world when it passes, leaving the call blocked on its thread.
//
// # Symmetric memory
//
// Comm implements comm.SymmetricMemory: AllocSymmetric returns a zeroed
// tensor on the symmetric heap (nvshmem_calloc), usable by every group; it
// is collective over the whole world and called on the world (NVSHMEM
// allocates world-collectively), after the world's queued ops.
// SymmetricBuffer.PeerPtr gives the P2P address of a peer's copy for
// kernels that use loads and stores; FreeSymmetric gives it back.
//
// # Tests
//
// The pure tests (loader errors, the exchange plans checked against a host
// simulation of the kernels' rounds, split planning) run everywhere.
// TestEmulated builds cuda/nvshmem/emu/atp_emu.c, a CPU emulation of the
// library's C interface (processes with shared-memory heaps, streams as
// threads, the same exchange protocol), with the C compiler and runs the
// multi-process tests against it: it exercises this package end to end
// wherever there is cc and /dev/shm, but not the CUDA code. The GPU tests
// skip, saying why, without the library or a GPU. On the GPU machine:
//
//	bash cuda/nvshmem/build.sh                                          # → build/libasynctp_nvshmem.so
//	go test -c -o build/comm_nvshmem.test ./comm/nvshmem                 # on the dev machine
//	NVSHMEM_DISABLE_NVLS=1 ./build/comm_nvshmem.test -test.v -test.timeout 30m
//	NVSHMEM_DISABLE_NVLS=1 ./build/comm_nvshmem.test -test.run '^$' -test.bench Collectives -test.benchtime 1x
//
// TestConformance re-executes the test binary as 2 and then 4 child
// processes, all on GPU 0 when the machine has one GPU (else one per GPU),
// that meet through comm/rendezvous on 127.0.0.1 and each run
// commtest.RunRank; with several GPUs it also runs the P2P kernels alone.
// TestPutSignal is a put/signal smoke test of the symmetric heap;
// TestSymmetric runs the collectives on symmetric tensors; TestMissingRank
// checks that a rank that never joins an op makes the others fail within
// the timeout, naming it. BenchmarkCollectives times all-gather,
// reduce-scatter and all-to-all between 2 PEs from 4 KiB to 256 MiB.
package nvshmem
