// Package dispatch is the device engine of the expert path's dispatch and
// combine over symmetric memory (Engine), beside the strategy that owns
// its protocol (parallel/ep/peerep): DeepEP's intranode protocol, layout →
// dispatch → combine, every step a kernel of cuda/kernels/ep_*.cu (ep.cuh
// lists them), peers written through their peer pointers, every buffer
// gated by 64-bit epoch signals with a deadline on each wait; and its fused
// form (Config.Fused), whose grouped GEMMs wait on per-block counters and
// signal per-block flags. It queues its kernels through the CUDA backend's
// narrow launcher (cudabackend.Backend.Queue).
//
// Its tests run every call of both forms on 1 to 3 emulated ranks of the
// kernel emulator (go test -tags asynctp_emu
// ./parallel/ep/peerep/internal/dispatch: one emulated backend per rank,
// whose plain allocations stand for the symmetric buffers) against a
// float64 reference of the protocol written in the tests, and the
// configuration's checks without the tag; peerep's tests run it again
// through the expert path and the MoE layer.
package dispatch
