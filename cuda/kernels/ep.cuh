// ep.cuh: the expert path's dispatch and combine over symmetric memory, on
// the device: the protocol, its buffers and signals, the helpers the modes
// share, and the one list of its entry points (declared below, each checked
// by the compiler against its definition). One file per mode:
//
//   ep_layout.cu    ep_layout, ep_plan: the sender's layout, the receiver's plan
//   ep_signals.cu   ep_wait, ep_wait_one, ep_claim, ep_wait_raise, ep_signal: the epoch signals
//   ep_dispatch.cu  ep_send_*, ep_recv_*: tokens out once per destination rank, expert rows in
//   ep_combine.cu   ep_return_*, ep_scale_recv_*: expert rows home, the combine backward's rows
//   ep_fused.cu     ep_header, ep_fill_u64, ep_block_targets, ep_return_blocks_*: the fused path
//
// The host side of every launch (grids, arguments, the order of a step):
// parallel/ep/peerep/internal/dispatch.
//
// The protocol: DeepEP's intranode protocol (the pipelined and fused
// strategies of the expert path, parallel/ep/peerep): every buffer a peer
// writes is symmetric (same size on every rank), peers are reached by plain
// stores through NVLink-mapped peer pointers (an array of the P base
// addresses of each buffer, `peers`), and 64-bit signal words gate every
// buffer. No NVSHMEM device call: these kernels live in the ordinary image.
//
// Shapes (P ranks, me = this rank, E experts, L = E/P local experts, K
// choices, N tokens on this rank, Mt = max tokens per rank, C features, R =
// P·Mt·min(K, L) the bound on expert rows received):
//   hdr   (P, E+2) int32, symmetric: row s = source s's per-expert slot
//         counts (before any capacity), its token count, rows sent to me.
//   tok   (P·Mt, C) symmetric: region s = the tokens s sent me, each ONCE
//         however many of its K experts live here, in s's token order.
//   meta  (P·Mt, 1+2K) int32, symmetric: per region row: the source token n,
//         then for each choice j the expert id (−1: not mine) and the slot's
//         rank among s's slots of that expert (token, then choice order).
//   wts   (P·Mt, K) f32, symmetric: the routing weights of a region row
//         (combine backward only).
//   ybuf, gbuf (Mt·K, C) symmetric: combine / dispatch-backward returns, row
//         n·K + j = slot (n, j) of this rank's tokens.
//   sig   (7P) u64, symmetric: readyTok, readyY, readyG, ackTok, ackY, ackG,
//         and the fused path's readyHdr (its counts, ahead of the tokens),
//         word [channel·P + s] written by rank s.
// Local tables: cnt (E), rk (Mt·K), send_row (Mt·P), rows_to (P) of the
// layout; hcopy (P·(E+2)); tab (see ep_plan); pos (Mt·K); route (P·Mt·K);
// route_exp, route_recv (R, 2); recv_of_exp, exp_of_recv (R).
//
// Signals are epochs: call e of a channel stores e (never reset; a later
// call only raises it), so a waiter compares ≥ and back-to-back steps
// cannot race on a word a peer may still be waiting on. A writer first
// waits for the reader's ack of epoch e−1 of the same buffer (the reader has
// finished reading the previous contents), writes, then raises ready = e;
// the reader waits for ready ≥ e, reads, then raises ack = e.
//
// Memory ordering (why each fence is there):
//   - The data stores of a send kernel complete before the next kernel on
//     the stream starts (kernel boundary); ep_signal then issues
//     __threadfence_system() (fence.sc.sys) before its st.release.sys so
//     that the stores, made by other threads of the earlier kernel, are
//     ordered before the signal for every observer in the system (peer
//     GPUs through NVLink, and other MPS clients of this GPU).
//   - ep_wait reads the word with ld.acquire.sys: the peer's data stores
//     that happened before its release are visible to this thread; the
//     kernel boundary after ep_wait extends that to the kernels that read
//     the data.
//   - Acks are the same pair in the other direction.
// Waits have a deadline (%globaltimer): a word still short of its target
// after deadline_ns sets status[0] (every later kernel of the step then
// does nothing) and reports the peer through err (read at the next Sync).
//
// On the CPU emulator the waits never spin: the multi-rank tests run every
// rank's phase before any rank's next phase, so a word is always ready.
#pragma once
#include "common.cuh"  // defines: bf16, f32, cvt, vvisit, warp_sum, report_error, KERNEL
#include "signals.cuh" // defines: u64, ep_load_acquire, ep_store_release, ep_fence_system, ep_fence_gpu, ep_add_release_gpu, ep_now_ns, ep_peer

namespace atp {

// ep_copy_row copies C elements of T with the block's threads, 16 bytes at
// a time when both rows allow it.
template <typename T> __device__ __forceinline__ void ep_copy_row(T* dst, const T* src, int C) {
    long long bytes = (long long)C * sizeof(T);
    if ((bytes & 15) == 0 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (long long i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
    }
}

// ep_copy_row_warp copies C elements of T with one warp (lane 0..31), 16
// bytes at a time when both rows allow it, four loads in flight per lane
// before their stores (a lone warp per row is latency-bound otherwise).
template <typename T>
__device__ __forceinline__ void ep_copy_row_warp(T* dst, const T* src, int C, int lane) {
    long long bytes = (long long)C * sizeof(T);
    if ((bytes & 15) == 0 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        const long long n = bytes / 16;
        long long i = lane;
        for (; i + 96 < n; i += 128) {
            uint4 a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
            d[i] = a;
            d[i + 32] = b;
            d[i + 64] = c;
            d[i + 96] = e;
        }
        for (; i < n; i += 32) d[i] = s[i];
    } else {
        for (int i = lane; i < C; i += 32) dst[i] = src[i];
    }
}

// block_exclusive_scan of one int per thread (blockDim.x a multiple of 32,
// at most 1024); returns the exclusive prefix and sets *total. scratch: 33
// ints of shared memory.
__device__ __forceinline__ int ep_block_scan(int v, int* scratch, int* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(ATP_FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int w = 0; w < nw; w++) {
            int c = scratch[w];
            scratch[w] = run;
            run += c;
        }
        scratch[32] = run;
    }
    __syncthreads();
    int r = scratch[warp] + x - v;
    *total = scratch[32];
    __syncthreads();
    return r;
}

} // namespace atp

using namespace atp;

// ---- helpers of several modes ------------------------------------------------------
// ep_set_targets (every thread of the block): counters[q] = 128 − the rows
// of 128-row block q (0 past the step's blocks blk[L]), blk[el] the first
// block of local expert el (see ep_plan).
// A step that has failed already (failed: status[0] set) gets 128
// everywhere: its rows will never land, and no GEMM should wait for them.
__device__ __forceinline__ void ep_set_targets(const int* offsets, const int* blk, int L, u64* counters, int nblk,
                                               bool failed) {
    for (int q = threadIdx.x; q < nblk; q += blockDim.x) {
        int rows = 0;
        if (q < blk[L] && !failed) {
            int el = 0;
            while (blk[el + 1] <= q) el++; // the expert of block q (no empty expert has a block)
            rows = offsets[el + 1] - offsets[el] - 128 * (q - blk[el]);
            if (rows > 128) rows = 128;
        }
        counters[q] = (u64)(128 - rows);
    }
}

// ep_write_header stores this rank's header row (its per-expert counts, its
// token count N, the rows it sends to rank d: 0 over the bound Mt) into row
// me of every rank's header, with the block's threads.
__device__ __forceinline__ void ep_write_header(const int* cnt, const int* rows_to, int N, int E, int P, int Mt, int me,
                                                const unsigned long long* hdr_peers) {
    int W = E + 2;
    for (int d = 0; d < P; d++) {
        int* h = ep_peer<int>(hdr_peers, d) + (long long)me * W;
        for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = cnt[e];
        if (threadIdx.x == 0) {
            h[E] = N;
            h[E + 1] = N > Mt ? 0 : rows_to[d];
        }
    }
}

// ---- the entry points, by mode ------------------------------------------------------
// ep_layout.cu
KERNEL void ep_layout(const int* idx, int N, int K, int E, int P, int L, int* cnt, int* rk, int* send_row,
                      int* rows_to, int* err);
KERNEL void ep_plan(const int* hdr, const int* idx, const int* rk, int P, int E, int L, int me, int N, int K,
                    int Mt, long long cf_bits, int* hcopy, int* offsets, int* tab, int* pos, int* status,
                    unsigned long long* counters, int nblk);
// ep_signals.cu
KERNEL void ep_wait(unsigned long long* words, int n, long long target, long long deadline_ns, int code, int* status,
                    int* err);
KERNEL void ep_wait_one(unsigned long long* words, int idx, long long target, long long deadline_ns, int code,
                        int* status, int* err);
KERNEL void ep_claim(const unsigned long long* words, int P, long long target, int only, int* claims, int who);
KERNEL void ep_wait_raise(unsigned long long* words, int n, long long target, long long deadline_ns, int code,
                          int* status, int* err);
KERNEL void ep_signal(const unsigned long long* peers, int n, long long word, long long value);
// ep_dispatch.cu
KERNEL void ep_send_bf16(const bf16* x, const int* idx, const int* rk, const int* send_row, const int* cnt,
                         const int* rows_to, int N, int K, int E, int P, int L, int C, int Mt, int me,
                         const unsigned long long* tok_peers, const unsigned long long* meta_peers,
                         const unsigned long long* hdr_peers, const bf16* w, const unsigned long long* wts_peers,
                         const int* pos, const bf16* ybuf, bf16* dweights, const int* status);
KERNEL void ep_recv_bf16(const bf16* tok, const int* meta, const int* hcopy, const int* tab, int P, int E, int L, int K,
                         int C, int Mt, int me, int order, bf16* out, int* route, int* route_exp, int* route_recv,
                         int* recv_of_exp, int* exp_of_recv, const int* status, int only,
                         unsigned long long* counters, const int* offsets, const int* claims, int want);
KERNEL void ep_send_f32(const float* x, const int* idx, const int* rk, const int* send_row, const int* cnt,
                         const int* rows_to, int N, int K, int E, int P, int L, int C, int Mt, int me,
                         const unsigned long long* tok_peers, const unsigned long long* meta_peers,
                         const unsigned long long* hdr_peers, const float* w, const unsigned long long* wts_peers,
                         const int* pos, const float* ybuf, float* dweights, const int* status);
KERNEL void ep_recv_f32(const float* tok, const int* meta, const int* hcopy, const int* tab, int P, int E, int L, int K,
                         int C, int Mt, int me, int order, float* out, int* route, int* route_exp, int* route_recv,
                         int* recv_of_exp, int* exp_of_recv, const int* status, int only,
                         unsigned long long* counters, const int* offsets, const int* claims, int want);
// ep_combine.cu
KERNEL void ep_return_bf16(const bf16* y, const int* routes, const int* tab, int C, const unsigned long long* peers,
                           const int* status);
KERNEL void ep_scale_recv_bf16(const bf16* tok, const float* wts, const int* hcopy, const int* route, const int* remap,
                               int P, int E, int K, int C, int Mt, bf16* dy, const int* status,
                               int only, unsigned long long* counters, const int* offsets, const int* tab, int L,
                               const int* claims, int want);
KERNEL void ep_return_f32(const float* y, const int* routes, const int* tab, int C, const unsigned long long* peers,
                           const int* status);
KERNEL void ep_scale_recv_f32(const float* tok, const float* wts, const int* hcopy, const int* route, const int* remap,
                               int P, int E, int K, int C, int Mt, float* dy, const int* status,
                               int only, unsigned long long* counters, const int* offsets, const int* tab, int L,
                               const int* claims, int want);
// ep_fused.cu
KERNEL void ep_header(const int* cnt, const int* rows_to, int N, int E, int P, int Mt, int me,
                      const unsigned long long* hdr_peers, const int* status);
KERNEL void ep_fill_u64(unsigned long long* words, int n, long long value);
KERNEL void ep_block_targets(const int* offsets, const int* tab, int P, int L, unsigned long long* counters, int nblk,
                             const int* status);
KERNEL void ep_return_blocks_bf16(const bf16* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                  int C, const unsigned long long* flags, long long target, long long deadline_ns,
                                  const unsigned long long* peers, int* status, int* err, int* claim);
KERNEL void ep_return_blocks_f32(const float* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                 int C, const unsigned long long* flags, long long target, long long deadline_ns,
                                 const unsigned long long* peers, int* status, int* err, int* claim);
