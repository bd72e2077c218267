// peerput.cu: the put transfer of the fused all-gather∘matmul
// (overlap/peercopy.Fused with Transfer "put"; host side
// overlap/peercopy/putkernel.go). Instead of every rank pulling each peer's
// shard with the copy engine, every rank stores its own shard through the
// peer pointers into the symmetric gather buffer of every peer, chunk by
// chunk, and raises the chunk's 64-bit flag there; the GEMM engine of each
// peer waits on those flags (GEMMWait, the same hook as for the pulls).
//
// It is launched on the site's side stream with a few CTAs, about the SMs
// the GEMM engine leaves free while it waits (GEMMWait.ReserveSMs): it must
// run beside a persistent GEMM that spins on flags (ARCHITECTURE.md, "No
// deadlock by construction": the only waits here are on words raised by
// stream memory operations after kernels that have finished, each with a
// deadline).
//
// Signals are epochs (signals.cuh, ep.cuh): call e stores e and never
// resets a word, so buffers and flags are reused across calls; a writer
// first waits for the reader's ack of epoch e−1, then writes, then raises
// the chunk's flag to e.
#include "common.cuh"
#include "signals.cuh"

namespace atp {

// pp_copy copies bytes (a multiple of 16, both ends 16-byte aligned) with
// the block's threads, up to four 16-byte loads in flight per thread before
// their stores (the stores through a peer pointer are posted writes).
__device__ __forceinline__ void pp_copy(unsigned char* dst, const unsigned char* src, long long bytes) {
    uint4* d = reinterpret_cast<uint4*>(dst);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    long long n = bytes / 16, nt = (long long)blockDim.x;
    for (long long i = threadIdx.x; i < n; i += 4 * nt) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            long long k = i + j * nt;
            v[j] = k < n ? s[k] : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            long long k = i + j * nt;
            if (k < n) d[k] = v[j];
        }
    }
}

// pp_wait_free waits (one thread) until *word ≥ target, at most
// deadline_ns; it returns 0 after reporting peer through err when the word
// stays short.
__device__ __forceinline__ int pp_wait_free(const u64* word, u64 target, long long deadline_ns, int peer, int* err) {
    if (ep_load_acquire(word) >= target) return 1;
    long long start = ep_now_ns();
    while (ep_load_acquire(word) < target) {
        if (ep_now_ns() - start > deadline_ns) {
            report_error(err, peer);
            return 0;
        }
#if !defined(ASYNCTP_EMU)
        __nanosleep(64);
#endif
    }
    return 1;
}

} // namespace atp

using namespace atp;

// peer_put: grid G (a few CTAs), block 256 (a multiple of 32). Rank me of P
// puts its shard src (rows rows of row_bytes bytes; row_bytes a multiple of
// 16, src and every gather buffer 16-byte aligned) into rows
// [me·rows, (me+1)·rows) of every peer's gather buffer, chunk by chunk
// (chunk k = rows [k·chunk_rows, min((k+1)·chunk_rows, rows)), the last one
// ragged), and raises each chunk's flag on that peer.
//   peers (3P u64): [0, P) the gather buffers (P·rows rows of row_bytes),
//     [P, 2P) the chunk flags (P·chunks u64, chunks = ceil(rows/chunk_rows):
//     word q·chunks + k guards chunk k of rank q's shard, so with
//     chunk_rows dividing rows, word c guards gathered rows
//     [c·chunk_rows, (c+1)·chunk_rows): GEMMWait's layout), [2P, 3P) the
//     signal pads (2P u64: word q = the epoch whose put rank q has started
//     into this rank; word P + q = the epoch whose rows of this rank's
//     buffer rank q has finished reading, written there by q).
// Work units (destination i, chunk k), destination-major, grid-strided over
// the CTAs. Destination i is rank (me − 1 − i) mod P: the GEMM on rank d
// starts on d's own rows and then takes rank d+1's, d+2's, …, so rank
// me−1 reads this shard first (right after its own); and at step i every
// rank writes to a different destination.
// Before its first unit for destination d, a CTA waits (thread 0, acquire
// loads of this rank's pad word P + d, deadline_ns) until d has finished
// reading the previous epoch's rows (≥ epoch − 1). A wait that runs out
// reports d through err and the CTA skips d's units (d is gone or stuck;
// its own waits report this rank); it does not set status, which would
// stop the CTAs not yet started (the other destinations still get their
// rows).
// After a unit's stores, every thread fences at system scope (its stores
// are performed for every observer: a peer GPU over NVLink, another MPS
// client of this GPU), the block synchronises, and thread 0 stores the
// chunk's flag = epoch with st.release.sys; the engine's producer reads it
// with ld.acquire.sys, then fence.proxy.async before its TMA loads.
// Block 0's thread 0 first stores pad word me = epoch on every destination
// (release): the put has started (the consumer's one-warp wait before it
// launches its engine, overlap/peercopy's waitSignals).
// status[0] already set (an earlier wait of the site ran out): nothing is
// done.
KERNEL void peer_put(const unsigned char* src, int rows, long long row_bytes, int chunk_rows, int me, int P,
                     const unsigned long long* peers, long long epoch, long long deadline_ns, int* status,
                     int* err) {
    if (status[0] != 0) return;
    const u64* bufs = peers;
    const u64* flags = peers + P;
    const u64* pads = peers + 2 * P;
    int chunks = (rows + chunk_rows - 1) / chunk_rows;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (int i = 0; i < P - 1; i++) ep_store_release(ep_peer<u64>(pads, (me - 1 - i + P) % P) + me, (u64)epoch);
    }
    __shared__ int free_dst;
    const u64* ack = ep_peer<u64>(pads, me) + P;
    int dst = -1;
    int good = 0;
    long long units = (long long)(P - 1) * chunks;
    for (long long u = blockIdx.x; u < units; u += gridDim.x) {
        int i = (int)(u / chunks), k = (int)(u % chunks);
        int d = (me - 1 - i + P) % P;
        if (d != dst) {
            if (threadIdx.x == 0) free_dst = pp_wait_free(ack + d, (u64)(epoch - 1), deadline_ns, d, err);
            __syncthreads();
            good = free_dst;
            __syncthreads(); // every thread has read free_dst before thread 0 may write it again
            dst = d;
        }
        if (!good) continue; // uniform over the block
        long long r0 = (long long)k * chunk_rows;
        long long n = rows - r0 < chunk_rows ? rows - r0 : (long long)chunk_rows;
        unsigned char* to = ep_peer<unsigned char>(bufs, d) + ((long long)me * rows + r0) * row_bytes;
        pp_copy(to, src + r0 * row_bytes, n * row_bytes);
        ep_fence_system();
        __syncthreads();
        if (threadIdx.x == 0) ep_store_release(ep_peer<u64>(flags, d) + (long long)me * chunks + k, (u64)epoch);
    }
}
