// ep_fused.cu: the fused expert path (ep.cuh; parallel/ep/peerep's Fused):
// the counts sent ahead of the tokens (ep_header), the per-block counters
// set again for the backward (ep_block_targets), the down GEMM's signal
// without the engine's hook (ep_fill_u64), and the combine's flag-driven
// send beside the GEMM (ep_return_blocks).
#include "ep.cuh" // defines: the protocol's buffers and helpers, every ep_* entry point declared

// ---- the fused path (parallel/ep/peerep's Fused) ----------------------------------
// ep_header: grid 1, block 128. Block 0 of ep_send's header stores alone:
// this rank's header row into every rank's hdr. The fused path sends the
// counts first (and signals them on their own channel), so that every
// receiver plans the step and starts its grouped GEMM while the tokens are
// still on their way. Nothing when status[0] is set.
KERNEL void ep_header(const int* cnt, const int* rows_to, int N, int E, int P, int Mt, int me,
                      const unsigned long long* hdr_peers, const int* status) {
    if (status[0] != 0) return;
    ep_write_header(cnt, rows_to, N, E, P, Mt, me, hdr_peers);
}

// ep_fill_u64: grid 1, block 128. words[i] = value for i < n, with release
// (GPU scope) after a fence: the signal of a down-projection GEMM without
// the engine's epilogue hook (every block done at once).
KERNEL void ep_fill_u64(unsigned long long* words, int n, long long value) {
    ep_fence_gpu();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
#if defined(ASYNCTP_EMU)
        __atomic_store_n(words + i, (u64)value, __ATOMIC_RELEASE);
#else
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(words + i), "l"((u64)value) : "memory");
#endif
    }
}

// ep_block_targets: grid 1, block 256. ep_plan's counters again, from the
// step's offsets and block table (tab), for the fused backward's second
// use of the counters (the combine backward's rows landing).
KERNEL void ep_block_targets(const int* offsets, const int* tab, int P, int L, unsigned long long* counters, int nblk,
                             const int* status) {
    ep_set_targets(offsets, tab + 4 + 3 * P * L, L, counters, nblk, *(volatile const int*)status != 0);
}

// ep_return_blocks: the fused combine's send, in two launches that share
// one claim counter (zero before the first): a few CTAs on a side stream
// while the down-projection GEMM runs, then a full grid on the GEMM's
// stream after it, which sends whatever the first has not claimed. Block
// 256 (8 warps). The expert-major rows y are in the grouped GEMM's 128-row
// blocks (blk, offsets of ep_plan), cut into units of 16 rows; a CTA claims
// the next unit (atomicAdd on *claim: units in increasing order, the order
// the GEMM's static tile order finishes the blocks in), waits until the
// unit's block flag is ≥ target (the GEMM's epilogue adds 1 per stored
// tile: target = its n-blocks; ld.acquire, deadline) and stores each of
// the unit's rows into its token's home ybuf slot (a warp per row), as
// ep_return does. A flag still short after deadline_ns sets status[0] = 1
// and reports 0x20000000 + the block through err; that CTA then stops (the
// step has failed; the homes' wait for this rank's ready signal, which
// ep_signal still raises, passes on stale rows and the error surfaces here
// at the next Sync). After the GEMM every flag is up, so the second launch
// never waits.
#define EP_UNIT_ROWS 16
template <typename T>
__device__ void ep_return_blocks_impl(const T* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                      int C, const u64* flags, long long target, long long deadline_ns,
                                      const u64* peers, int* status, int* err, int* claim) {
    __shared__ int sh_unit;
    const int* blk = tab + 4 + 3 * P * L;
    const int units = blk[L] * (128 / EP_UNIT_ROWS);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (;;) {
        if (threadIdx.x == 0) {
            int u = atomicAdd(claim, 1);
            int q = u / (128 / EP_UNIT_ROWS);
            if (*(volatile const int*)status != 0) u = units; // the step has failed already
            if (u < units) {
                long long start = ep_now_ns();
                while (ep_load_acquire(flags + q) < (u64)target) {
                    if (*(volatile const int*)status != 0) {
                        u = units;
                        break;
                    }
                    if (ep_now_ns() - start > deadline_ns) {
                        status[0] = 1;
                        report_error(err, 0x20000000 + q);
                        u = units;
                        break;
                    }
#if !defined(ASYNCTP_EMU)
                    __nanosleep(128);
#endif
                }
            }
            sh_unit = u;
        }
        __syncthreads();
        const int u = sh_unit;
        if (u >= units) return;
        const int q = u / (128 / EP_UNIT_ROWS);
        int el = 0;
        while (blk[el + 1] <= q) el++;
        const int b0 = offsets[el] + 128 * (q - blk[el]);
        const int r0 = b0 + EP_UNIT_ROWS * (u % (128 / EP_UNIT_ROWS));
        int r1 = r0 + EP_UNIT_ROWS;
        if (r1 > b0 + 128) r1 = b0 + 128;
        if (r1 > offsets[el + 1]) r1 = offsets[el + 1];
        for (int i = r0 + warp; i < r1; i += nw) {
            const int s = routes[2 * i], slot = routes[2 * i + 1];
            ep_copy_row_warp(ep_peer<T>(peers, s) + (long long)slot * C, y + (long long)i * C, C, lane);
        }
        __syncthreads(); // sh_unit is rewritten for the next unit
    }
}

KERNEL void ep_return_blocks_bf16(const bf16* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                  int C, const unsigned long long* flags, long long target, long long deadline_ns,
                                  const unsigned long long* peers, int* status, int* err, int* claim) {
    ep_return_blocks_impl(y, routes, offsets, tab, P, L, C, flags, target, deadline_ns, peers, status, err, claim);
}
KERNEL void ep_return_blocks_f32(const float* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                 int C, const unsigned long long* flags, long long target, long long deadline_ns,
                                 const unsigned long long* peers, int* status, int* err, int* claim) {
    ep_return_blocks_impl(y, routes, offsets, tab, P, L, C, flags, target, deadline_ns, peers, status, err, claim);
}
