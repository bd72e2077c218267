// Package peercopy holds the tensor-parallel sites of the pipelined and
// fused strategies on GPUs whose ranks share memory through a symmetric
// heap (comm.SymmetricMemory: NVSHMEM PEs of one node, also several PEs on
// one GPU under MPS): Chunked (pipelined: a GEMM per chunk as it lands)
// and Engine (fused: our GEMM engine waiting per chunk). They are
// Builders without a strategy name; the registry, overlap/strategies,
// picks them for the groups that can run them.
//
// Each chunk of a site's communication is a copy-engine pull from the
// peer's symmetric stage through its peer pointer, on the site's side
// stream; the producer announces its rows with a 64-bit signal word that it
// writes into the consumer's signal pad (cuStreamWriteValue64, which fences
// the writes before it), the consumer's side stream waits for the word
// (cuStreamWaitValue64) before its copy, and acknowledges it in the
// producer's pad when done, so the producer never overwrites rows still
// being read. The compute stream runs the own shard's matmul first, then
// each chunk's after its pull's event. Nothing waits on the host; no kernel
// spins, so no SM is held by a wait.
//
// The fused form (Engine) feeds our GEMM engine from the same
// exchanges, or, with Transfer "put", from puts: a small kernel on each
// rank's side stream stores its shard into every peer's symmetric gather
// buffer and raises a flag per chunk there, which the engine waits on
// (putGather, queuePut, putkernel.go).
//
// A stream wait has no deadline on the device: a peer that dies leaves its
// partners' streams waiting, and the run's liveness checks (heartbeats in
// the rendezvous store) end the processes.
//
// The device work goes through the CUDA backend's narrow launcher
// (cudabackend.Queue: copies, 64-bit stream writes and waits, the side
// stream by Launcher.OnStream), so the same code runs on the kernel
// emulator: there the side stream is the backend's one stream, whose work
// runs as it is queued, and a stream wait is a wait on the host that lets
// the other emulated ranks run (they write the word). Chunked runs there
// as on a GPU; Engine runs with StreamHooks (the engine's waits and
// signals around the backend's MatMul: the emulator has no TMA, mbarrier
// or wgmma, so the GEMM engine itself is refused there) and the pull
// transfer (the put kernel spins on its peers' words, and the emulator
// runs one block of one kernel at a time: putkernel_emu_test.go runs it
// for several ranks on one device instead). overlap/strategies' emulator
// tests run them in a world of two transports.
package peercopy
