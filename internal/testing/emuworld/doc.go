// Package emuworld is the world of the kernel-emulator tests (build tag
// asynctp_emu): ranks are goroutines over comm/local, each with its own
// emulated CUDA backend. Emulated device memory is host memory, so a
// symmetric allocation is one ordinary allocation per rank, registered so
// that every rank finds the others' (its "peer pointers": the other ranks'
// plain buffers; Sym over a Registry). comm/local moves host tensors only,
// so the collectives of device tensors go through host copies (Staged).
// The emulator runs one kernel at a time, so a wait kernel must never spin
// on a word that another rank's later kernel would write: every rank
// passes a Barrier before each wait, by which time every rank has run the
// sends the wait is for. Backend is one emulated backend, closed with the
// test. HybridRanks runs ranks whose groups are comm/hybrid over a Staged
// world and a Sym one. Shared by the emulator tests of overlap/strategies, overlap/peercopy,
// parallel/ep/peerep (and its dispatch engine), parallel/grads and
// parallel/model (Registry.SymmetricCounts: every symmetric allocation
// freed once).
package emuworld
