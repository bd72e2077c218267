// Package launch opens a world: the one place where a process (or a
// goroutine rank) becomes a rank of a run. From the launcher's environment
// (rendezvous.FromEnv: asynctp's own variables, torchrun, SLURM, Open MPI)
// and Options it joins the rendezvous store, opens the transport (--comm:
// local, tcp, nccl, nvshmem, or nccl+nvshmem, NCCL's collectives with
// NVSHMEM's symmetric memory), opens the backend the rank computes on (the
// CPU, or its GPU: local_rank % GPUs), carves the grid of groups (TP, DP,
// EP) and returns them as a World with one Close. cmd/train, cmd/ablate and
// the multi-process test harnesses (internal/testing/pes) call it; none of them
// opens a transport itself.
//
//	info, launched, err := launch.StartedBy(nil)
//	w, err := launch.Open(ctx, info, launch.Options{Transport: launch.TCP, Timeout: time.Minute, DP: 2, TP: 2, EP: 1})
//	if err != nil { ... }
//	defer w.Close()
//	// w.Grid, w.Backend, w.Stream, w.DType: what the rank trains with
//
// Spawn is --nproc's launcher: it hosts the store on 127.0.0.1 and starts N
// processes of a command, one rank each, passing interrupts on and stopping
// the others when one fails. Goroutines runs a world of goroutine ranks
// over comm/local (the CPU reference and the tests).
//
// # Failures
//
// Every wait has the deadline of Options.Timeout. A rank whose world fails
// prints why at once (Options.Log), naming the ranks it lost; Fail tells the
// others and lets the store's host close at once instead of waiting for the
// ranks that are gone. NVSHMEM cannot abort a kernel or a host call that
// waits for a dead peer, so an NVSHMEM rank that learns of a failure
// (heartbeats in the store, rendezvous.Liveness) calls Options.Exit: only
// a command may end the process.
package launch
