// Package peerep is the pipelined strategy of the MoE expert path
// (overlap.KindExpert) on GPUs whose ranks share a symmetric heap
// (comm.SymmetricMemory: NVSHMEM PEs of one node, also several PEs on one
// GPU under MPS): the dispatch and combine are our own kernels
// (cuda/kernels/dispatch.cu, driven by cudabackend.ExpertDispatch) that
// follow DeepEP's intranode protocol — the routing laid out on the device,
// the counts exchanged by the kernels themselves through 64-bit epoch
// signals, each token stored once per destination rank straight into the
// owner's symmetric receive buffer through its peer pointer, the receiver
// expanding it into one row per kept expert choice, the combine returning
// every expert output to its token's home and summing the K choices there
// in fp32 in a fixed order. Every wait has a deadline and names the peer
// that never signalled.
//
// Pipelined is the strategy (it takes the place of overlap/peercopy's
// Pipelined for the TP sites, which it delegates to); Path is the
// ep.ExpertPath it builds.
//
// # Buffers and the bound
//
// Symmetric buffers are sized by the maximum tokens per rank
// (ep.WithMaxTokens, required: without it the strategy is unavailable
// for the site), allocated at the first Dispatch (a world collective, at
// the same call on every rank) and again when the top-k, the width or the
// dtype changes. A step over the bound is refused by every rank together:
// the counts travel with the tokens, and a rank over the bound sends its
// counts only.
//
// # Capacity
//
// With a capacity factor every token is still sent (once per rank); the
// receiver keeps, for each of its experts, the first capacity slots in
// group token order (the sources' counts arrive before any row is
// expanded), and each home drops the same slots from its combine: the rule
// of layers.RoutingPlan and the collective path, computed on the device.
//
// # Host synchronisation
//
// cudabackend.ExpertDispatch reads nothing on the host. ep.ExpertPath's
// Handle, however, holds host counts (and the MoE layer sizes its expert
// GEMMs from them), so Path.Dispatch reads the exchanged counts back once
// (ReadCounts), the one host wait of the step — as the collective path's
// count exchange does. A layer that keeps the counts on the device uses
// ExpertDispatch directly (Offsets is the grouped GEMM's device offsets).
//
// # Limits
//
// The token group must be the EP group (a wider one is refused with
// errors.ErrUnsupported), and every peer must be reachable by PeerPtr.
package peerep
