// Package dispatch is the device engine of the expert path's dispatch and
// combine over symmetric memory (Engine), beside the strategy that owns
// its protocol (parallel/ep/peerep): DeepEP's intranode protocol, layout →
// dispatch → combine, every step a kernel of cuda/kernels/ep_*.cu (ep.cuh
// lists them), peers written through their peer pointers, every buffer
// gated by 64-bit epoch signals with a deadline on each wait; and its fused
// form (Config.Fused), whose grouped GEMMs wait on per-block counters and
// signal per-block flags. It queues its kernels through the CUDA backend's
// narrow launcher (cudabackend.Backend.Queue), and is tested through
// peerep on the kernel emulator (go test -tags asynctp_emu
// ./parallel/ep/...).
package dispatch
