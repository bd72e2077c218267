// Package peerep is the pipelined strategy of the MoE expert path
// (overlap.KindExpert) on GPUs whose ranks share a symmetric heap
// (comm.SymmetricMemory: NVSHMEM PEs of one node, also several PEs on one
// GPU under MPS): the dispatch and combine are our own kernels
// (cuda/kernels/ep_*.cu, listed in ep.cuh, driven by the engine of
// internal/dispatch) that
// follow DeepEP's intranode protocol — the routing laid out on the device,
// the counts exchanged by the kernels themselves through 64-bit epoch
// signals, each token stored once per destination rank straight into the
// owner's symmetric receive buffer through its peer pointer, the receiver
// expanding it into one row per kept expert choice, the combine returning
// every expert output to its token's home and summing the K choices there
// in fp32 in a fixed order. Every wait has a deadline and names the peer
// that never signalled.
//
// Path is the ep.ExpertPath of the pipelined strategy; Expert builds it,
// and with Fused the same Path in its fused mode. The strategies by name
// are the registry's (overlap/strategies: Pipelined and Fused hold Expert
// for the expert path and overlap/peercopy's Chunked and Engine for the
// TP sites).
//
// # The fused strategy
//
// Fused (after ThunderKittens' moe_dispatch_gemm and Comet) runs the MoE layer's device step with the dispatch and the
// combine inside the experts' grouped GEMMs (ep.FusedOffsets, whose hooks
// layers.Experts.ForwardOffsetsHooked calls; the engine's
// DispatchRecvFused and CombineSendFused; kernels in ep_fused.cu, the other
// ep_*.cu and grouped_sm90.cu):
//
//   - Dispatch. Each rank sends its counts to every peer first, on their
//     own signal ("counts ready"), then its tokens (once per destination
//     rank, as in the pipelined path) and "tokens ready". A receiver waits
//     for the counts only, plans the step (capacity, offsets), and sets a
//     counter per 128-row block of the expert-major receive buffer (the
//     grouped GEMM's blocks: group by group, ⌈rows_e / 128⌉ each) to
//     128 − the rows the block will hold (128 for blocks past the step's).
//     Then, on a side stream, source by source starting with its own
//     tokens (already there) and then rank+1, rank+2, …, it waits for the
//     source's tokens and expands them into expert rows, adding 1
//     (release) to a block's counter per row written: every block's
//     target is 128, known without a copy of the counts to the host.
//   - First GEMM (gate). The grouped engine's producer waits, before the
//     first load of a tile's 128-row block, until the block's counter is
//     128 (ld.acquire.sys, the path's deadline; a block still short stops
//     the kernel and names the block). The tile order stays static (group
//     by group, the engine's raster in a group): every source brings rows
//     of every expert, and a block holds several sources' rows, so no block
//     order is cheaply known to arrive first; the dispatch side's order
//     (own tokens first) is where arrival order is used. The up
//     projection runs after it on the same stream (all rows landed).
//   - Down GEMM and combine. The done flags and a claim counter are
//     cleared; on the side stream the combine's send (ep_return_blocks,
//     2 CTAs of 8 warps) waits for the homes' combine buffers, then claims
//     16-row units in increasing order, waits for each unit's block flag to
//     reach ⌈C / 256⌉ and stores the unit's rows into their tokens' homes
//     (the same slots as the pipelined combine, a warp per row); meanwhile
//     the down projection's engine epilogue adds 1 (release) to its block's
//     flag after each tile it stores. After the GEMM, on its stream, a
//     second launch of the same kernel on a full grid sends every unit not
//     yet claimed (its flags are up: it never spins), then the side stream
//     is joined and the homes are signalled. The home's
//     CombineRecv is the pipelined one: it waits for every source and sums
//     the K slots in fp32 in choice order, so the output has the pipelined
//     path's bits (on the emulator, and on the GPU with 2 PEs under MPS:
//     TestFusedGPU, bit for bit). On one shared GPU it takes 1.1–1.2 × the
//     pipelined path's time on one MoE layer (BENCHMARKS.md); it was 3.3 ×
//     while the whole send ran on the 2 side CTAs and every source landed
//     on the side stream.
//   - Backward, the mirror (ep.FusedOffsets' CombineBackwardFused,
//     layers.Experts.BackwardHooked): ∂out goes once per destination rank
//     with the routing weights (the pipelined send); the receiver sets the
//     step's counters to their targets again and, on the side stream,
//     source by source from its own, scales each source's rows into
//     expert-major ∂ye rows as they land, +1 per row; the first dgrad GEMM
//     (dh = ∂ye·W_down) waits per block on them; the last GEMM into the
//     expert rows' input gradient (dx += dup·W_up) signals per block, and
//     the dispatch backward sends each finished block home from the side
//     stream (the same flag-driven kernel as the combine); the home sums
//     the K slot gradients as in the pipelined path. The weight-gradient
//     GEMMs (grouped TN) have no hooks: the rows they read have landed once
//     the dh GEMM has run, which precedes them on the stream.
//
// Landing (forward and backward): each source's rows land on whichever
// stream gets to them first (ep_claim, atomicCAS per source): on the
// backend's stream before the first GEMM, one claim takes every source
// whose tokens are already here and lands them on the whole GPU; the side
// stream takes the rest, each once its tokens arrive, on the SMs the
// waiting GEMM leaves free.
//
// The side stream's kernels run beside persistent GEMMs only if those
// leave them SMs: the hooked GEMMs reserve EngineReserveSMs (as the TP
// fused GEMM does), and the combine's spinning send keeps to 2 CTAs so
// that the GEMM whose flags it waits for can always have every CTA
// resident. The fused strategy needs the backend's grouped GEMM on (it runs
// only as the MoE device step), the grouped GEMM engine (an sm_90a GPU) and
// bf16 tensors, else it is unavailable (a default keeps collective, an
// explicit request fails; a layer handed a fused path without the device
// step refuses its forward). WithStreamHooks runs the same
// protocol with the waits and signals as one-warp kernels around the
// ordinary grouped GEMMs (no overlap): the kernel emulator's form, which
// the emulator tests compare bit for bit with the pipelined path. The
// host-count ExpertPath methods of a fused Path are the pipelined ones
// (the counts on their own signal); DispatchDevice on a fused Path joins
// the side stream before it returns (no hooks, no overlap).
//
// # Buffers and the bound
//
// Symmetric buffers are sized by the maximum tokens per rank
// (ep.Parallel.MaxTokens, required: without it the strategy is unavailable
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
// # The collective path's bits
//
// The MoE layer's device step over this path (pipelined or fused) gives
// the collective dispatcher's host-count step bit for bit, forward and
// backward, when both run the grouped GEMM (TestEmuDeviceStepBitsMatchCollective):
// the expert rows are in the same order (local expert, source rank, token
// order) at the same offsets, so every grouped GEMM — the weight gradients'
// sums over rows included — adds the same products in the same order; the
// combine and the dispatch backward are the backend's CombineRows over the
// same slots; the send kernel's dweights reduce each dot product in
// CombineRowsBackward's order (a warp per slot), and the router's
// auxiliary gradients come from the same device ops on either step
// (layers.Router.SetGlobal and SetGlobalDevice).
//
// # Host synchronisation
//
// The engine (internal/dispatch) reads nothing on the host. ep.ExpertPath's
// Handle, however, holds host counts (and the MoE layer sizes its expert
// GEMMs from them), so Path.Dispatch reads the exchanged counts back once
// (ReadCounts), the one host wait of the step — as the collective path's
// count exchange does. A layer that keeps the counts on the device takes
// the device step (ep.DeviceOffsets: DispatchDevice, whose handle's
// Offsets are the grouped GEMM's device offsets).
//
// # Limits
//
// The token group must be the EP group (a wider one is refused with
// errors.ErrUnsupported), and every peer must be reachable by PeerPtr.
package peerep
