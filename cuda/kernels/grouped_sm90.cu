// grouped_sm90.cu: the grouped expert GEMMs of tensor.GroupedGEMM on the GEMM
// engine (Hopper, sm_90a): one launch of the persistent, warp-specialized
// TMA + wgmma pipeline of gemm_sm90.cu for all the experts of a rank, the
// groups' row offsets read from device memory (off (G+1) int32: group g has
// rows [off[g], off[g+1]); no host copy of the counts).
//
//   grouped_sm90_nt_<out>  c[R_g] = alpha·a[R_g]·w[g]ᵀ + beta·c[R_g]
//                          a (M, K), w (G, N, K), c (M, N)   (x·W_eᵀ, transW)
//   grouped_sm90_nn_<out>  c[R_g] = alpha·a[R_g]·w[g] + beta·c[R_g]
//                          a (M, K), w (G, K, N), c (M, N)   (dy·W_e)
//   grouped_sm90_tn_<out>  c[g] = alpha·a[R_g]ᵀ·b[R_g] + beta·c[g]
//                          a (M, P), b (M, Q), c (G, P, Q)   (dW_e = dyᵀ·x)
//
// bf16 operands, fp32 accumulation, out = bf16 or f32 (c's dtype). Launch:
// block 384, dynamic shared memory GROUPED90_SMEM (the engine's ring plus the
// group tables), grid ≤ the number of SMs (any grid works: a CTA whose first
// tile is past the last one does nothing). N, K (P, Q) multiples of 8, M ≥ 1,
// 1 ≤ G ≤ MAX_GROUPS, tensors 16-byte aligned.
//
// The same tiles (128 × 256 of C, K steps of 64), stages, warp roles,
// barriers and wgmma descriptors as gemm_sm90.cu, whose helpers this file
// uses (asynctp_kernels.cu includes it first). What is new:
//
//   - The group tables. Every CTA first copies the offsets into shared memory
//     (off_s), checks 0 ≤ off[0] ≤ … ≤ off[G] ≤ M (the first bad entry goes to
//     err, from CTA 0, and then no CTA computes anything: like grouped.cu,
//     nothing is written) and, for nt/nn, computes the prefix blk_s[g] =
//     Σ_{i<g} ⌈rows_i / 128⌉ of the groups' 128-row blocks with one warp's
//     scan. G ≤ MAX_GROUPS = 1024: 8 KiB of tables next to the 192 KiB ring.
//   - The tile scheduler (nt/nn). Tiles are numbered group by group: the
//     tiles of group g are [blk_s[g]·num_n, blk_s[g+1]·num_n), num_n =
//     ⌈N / 256⌉; inside a group the engine's grouped raster (group_m m-blocks
//     sweep all n-blocks) orders its ⌈rows_g / 128⌉ × num_n tiles. Tile t's
//     group is the last g with blk_s[g] ≤ t / num_n (a binary search over the
//     table: empty groups have no tiles and are skipped by it). Its rows are
//     [off[g] + 128·mb, off[g+1]). CTA b takes tiles b, b + grid, ... as in
//     the engine; producer and consumers compute the same mapping.
//   - Masked rows (nt/nn). The TMA load of the 128 rows of a block reads
//     whatever follows the group's last row (the next group's rows, or zeros
//     past M): each output row depends only on its own row of a, so those
//     rows give garbage only in rows of c that the epilogue does not store
//     (it stores row < off[g+1] instead of row < M; stores go through the
//     engine's store_slice, no TMA store, so the mask is a plain guard).
//   - The weights are one 3-D tensor map over w, (K, N, G) for nt and
//     (N, K, G) for nn, innermost first, with boxes (64 K, 256 N, 1) and
//     (64 N, 64 K, 1): the same shared-memory image as the engine's 2-D
//     boxes, and a box that runs past N or K reads zeros, not group g+1.
//   - Wgrad (tn): the reduction runs over the group's rows, variable per
//     group: ⌈rows_g / 64⌉ K steps starting at row off[g]. The last step's
//     rows past off[g+1] belong to the next group and must contribute
//     nothing. The consumers zero them in shared memory before their wgmmas:
//     in an MN-major box (64 MN, 64 K) with the 128-byte swizzle, K row k is
//     the 128 bytes at 128·k (the swizzle permutes the 16-byte chunks within
//     a row, never across rows), so rows [v, 64) are one contiguous range
//     per box. Each consumer warpgroup zeroes them in the A box it reads and
//     in half of the shared B boxes (both operands, so that an Inf or NaN in
//     the next group's rows cannot give 0·Inf), each thread fences its
//     writes for the async proxy (fence.proxy.async.shared::cta: wgmma reads
//     shared memory through it), and the two warpgroups meet at a named
//     barrier before the wgmmas. Only the last step of a group whose rows
//     are not a multiple of 64 pays this. A group of no rows has no K steps:
//     its tiles store beta·c[g] (alpha times nothing).
//   - Wgrad tiles: G × ⌈P / 128⌉ × ⌈Q / 256⌉, group-major (a group's rows are
//     read from L2 by its tiles), the engine's raster inside a group.
//
// Not sm_90a (compute_90 PTX, sm_80): the kernels only report err[1] = -1,
// like the engine. Not built by the CPU emulator (no TMA, mbarrier, wgmma).
#if !defined(ASYNCTP_EMU)
#if !defined(GEMM90_SMEM)
#error "grouped_sm90.cu needs gemm_sm90.cu (include it first, as asynctp_kernels.cu does)"
#endif

namespace atp {
namespace gemm90 {

constexpr int MAX_GROUPS = 1024;
// After the engine's ring, barriers and abort word: off_s[MAX_GROUPS + 1],
// blk_s[MAX_GROUPS + 1] and the bad-entry word.
constexpr int GROUPED_TABLE_BYTES = 2 * (MAX_GROUPS + 1) * 4 + 16;
constexpr int GROUPED_SMEM_BYTES = SMEM_BYTES + GROUPED_TABLE_BYTES;
static_assert(GROUPED_SMEM_BYTES <= 227 * 1024, "the ring and the group tables must fit an SM");

} // namespace gemm90
} // namespace atp

#define GROUPED90_SMEM atp::gemm90::GROUPED_SMEM_BYTES

namespace atp {
namespace gemm90 {

#if defined(ATP_GEMM90_BODY)

// tma_load_3d is tma_load_2d for a 3-D map (c0 innermost).
__device__ __forceinline__ void tma_load_3d(const TmaDesc& d, uint32_t dst, uint32_t bar, int c0,
                                            int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&d)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
}

// fence_proxy_async_shared (wgmma.cuh) makes the zeroes visible to the
// async proxy (the wgmma operand reads).

// The shared memory of a grouped kernel: the engine's ring (1024-aligned),
// its 2·STAGES mbarriers and abort word, then the group tables.
struct GroupedSmem {
    uint32_t ring, bars;
    float* stage; // the epilogue's staging area (gemm_sm90.cu, store_slice)
    int* off_s; // (G+1) the offsets
    int* blk_s; // (G+1) blk_s[g] = Σ_{i<g} ⌈rows_i / 128⌉ (nt, nn)
    int* bad_s; // the first bad offsets entry (0x7fffffff: none)
    volatile int* abort_w; // the engine's abort word: a flag wait timed out (nt, nn)
};

__device__ __forceinline__ GroupedSmem grouped_smem(unsigned char* base) {
    GroupedSmem s;
    const uint32_t raw = smem_u32(base);
    s.ring = (raw + 1023u) & ~1023u;
    s.stage = reinterpret_cast<float*>(base + (s.ring - raw) + STAGES * STAGE_BYTES);
    s.bars = s.ring + STAGES * STAGE_BYTES + EPI_BYTES;
    s.off_s = reinterpret_cast<int*>(base + (s.bars - raw) + 2 * STAGES * 8 + 16);
    s.blk_s = s.off_s + (MAX_GROUPS + 1);
    s.bad_s = s.blk_s + (MAX_GROUPS + 1);
    s.abort_w = reinterpret_cast<volatile int*>(base + (s.bars - raw) + 2 * STAGES * 8);
    return s;
}

// grouped_init (thread 0, before the CTA's first barrier): the mbarriers as
// in the engine and the bad-entry word.
__device__ __forceinline__ void grouped_init(const GroupedSmem& sm) {
    for (int s = 0; s < STAGES; s++) {
        mbar_init(sm.bars + 8 * s, 1);                 // full: the producer's expect_tx
        mbar_init(sm.bars + 8 * (STAGES + s), 2 * 4);  // empty: one arrive per consumer warp
    }
    *sm.bad_s = 0x7fffffff;
    *sm.abort_w = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// load_groups (every thread of the CTA, after grouped_init and a barrier)
// copies off (G+1) into off_s and checks 0 ≤ off[0] ≤ … ≤ off[G] ≤ M; with
// prefix, warp 0 then scans the groups' 128-row block counts into blk_s. It
// returns the index of the first bad entry (the one grouped.cu's sequential
// check would name) or -1, the same value in every thread.
__device__ __forceinline__ int load_groups(const GroupedSmem& sm, const int* off, int G, int M,
                                           bool prefix) {
    for (int i = threadIdx.x; i <= G; i += blockDim.x) {
        const int v = off[i];
        const int prev = i == 0 ? 0 : off[i - 1];
        sm.off_s[i] = v;
        if (v < prev || v > M) atomicMin(sm.bad_s, i);
    }
    __syncthreads();
    const int bad = *sm.bad_s;
    if (bad != 0x7fffffff) return bad; // every thread: no barrier below is skipped by some
    if (prefix && threadIdx.x < 32) {
        const int lane = threadIdx.x;
        if (lane == 0) sm.blk_s[0] = 0;
        int carry = 0;
        for (int base = 0; base < G; base += 32) {
            const int i = base + lane;
            int n = i < G ? (sm.off_s[i + 1] - sm.off_s[i] + BM - 1) / BM : 0;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) { // inclusive scan over the warp
                const int u = __shfl_up_sync(ATP_FULL_MASK, n, d);
                if (lane >= d) n += u;
            }
            if (i < G) sm.blk_s[i + 1] = carry + n;
            carry += __shfl_sync(ATP_FULL_MASK, n, 31);
        }
    }
    __syncthreads();
    return -1;
}

// fwd_tile maps tile t of nt/nn to its group g, rows [r0, r1) of c (r1 the
// group's end: rows of the block at or past it are not stored), first
// column n0 and 128-row block blk in group-major order (blk_s[g] + the
// block in the group after the raster: the index of the fused path's
// flags).
__device__ __forceinline__ void fwd_tile(const GroupedSmem& sm, int t, int num_n, int G,
                                         int group_m, int& g, int& r0, int& r1, int& n0, int& blk) {
    const int q = t / num_n; // the tile's 128-row block in group-major order (before the raster)
    int lo = 0, hi = G - 1;  // the last g < G with blk_s[g] ≤ q (blk_s[0] = 0)
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (sm.blk_s[mid] <= q) lo = mid;
        else hi = mid - 1;
    }
    g = lo;
    const int first = sm.blk_s[g];
    int mb, nb;
    tile_of(t - first * num_n, sm.blk_s[g + 1] - first, num_n, group_m, 0, mb, nb);
    r0 = sm.off_s[g] + mb * BM;
    r1 = sm.off_s[g + 1];
    n0 = nb * BN;
    blk = first + mb;
}

#endif // ATP_GEMM90_BODY

// nt (TB = 0: w (G, N, K), B K-major) and nn (TB = 1: w (G, K, N), B
// MN-major). A is always K-major: a (M, K).
template <int TB, typename OutT>
__device__ __forceinline__ void grouped_body(const TmaDesc& tma_a, const TmaDesc& tma_w, OutT* c,
                                             const int* off, int G, int M, int N, int K,
                                             float alpha, float beta, int group_m,
                                             long long watchdog_ns, int* err,
                                             const unsigned long long* wait_flags,
                                             unsigned long long wait_target,
                                             long long wait_timeout_ns,
                                             unsigned long long* sig_flags,
                                             unsigned long long sig_value) {
#if defined(ATP_GEMM90_BODY)
    extern __shared__ __align__(1024) unsigned char grouped90_smem[];
    const GroupedSmem sm = grouped_smem(grouped90_smem);
    const uint32_t ring = sm.ring, bars = sm.bars;
    if (threadIdx.x == 0) grouped_init(sm);
    __syncthreads();
    const int bad = load_groups(sm, off, G, M, true);
    if (bad >= 0 && blockIdx.x == 0 && threadIdx.x == 0) report_error(err, bad);
    const int num_n = (N + BN - 1) / BN;
    // Warp-uniform for the compiler (see gemm_body): the loop around the
    // wgmmas must not look divergent.
    const int tiles = __shfl_sync(ATP_FULL_MASK, bad >= 0 ? 0 : sm.blk_s[G] * num_n, 0);
    const int kblocks = (K + BK - 1) / BK;

    const int wg = __shfl_sync(ATP_FULL_MASK, (int)(threadIdx.x / 128), 0);
    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0) return;
        tma_prefetch(tma_a);
        tma_prefetch(tma_w);
        int it = 0;
        bool aborted = false; // a flag wait timed out: feed the ring without data
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int g, r0, r1, n0, q;
            fwd_tile(sm, t, num_n, G, group_m, g, r0, r1, n0, q);
            for (int kb = 0; kb < kblocks; kb++, it++) {
                const int s = it % STAGES;
                const uint32_t ph = (it / STAGES) & 1;
                mbar_wait(bars + 8 * (STAGES + s), ph ^ 1, watchdog_ns);
                const uint32_t full = bars + 8 * s;
                // The fused path's wait (gemm_sm90.cu's, per 128-row block
                // q of a instead of per chunk): before the block's first
                // load, until wait_flags[q] >= wait_target.
                if (kb == 0 && wait_flags != nullptr && !aborted &&
                    ld_acquire_sys(wait_flags + q) < wait_target) {
                    const unsigned long long t0 = globaltimer();
                    bool ok = false;
                    for (;;) {
                        if (ld_acquire_sys(wait_flags + q) >= wait_target) {
                            ok = true;
                            break;
                        }
                        if ((long long)(globaltimer() - t0) > wait_timeout_ns) break;
                        __nanosleep(128);
                    }
                    if (!ok) {
                        report_error(err, 0x40000000 + q);
                        *sm.abort_w = 1;
                        aborted = true;
                    }
                }
                if (kb == 0 && wait_flags != nullptr && !aborted) fence_proxy_async_global();
                if (aborted) {
                    // Complete the phase without data (no TMA in flight when
                    // the CTA ends); the consumers run on stale tiles.
                    mbar_arrive(full);
                    continue;
                }
                mbar_expect_tx(full, STAGE_BYTES);
                const uint32_t sa = ring + s * STAGE_BYTES, sb = sa + A_BYTES;
                const int k0 = kb * BK;
                tma_load_2d(tma_a, sa, full, k0, r0); // (64 K, 128 rows) from row r0
                if (TB) { // (64 N, 64 K, 1) boxes of w[g]
#pragma unroll
                    for (int i = 0; i < BN / 64; i++)
                        tma_load_3d(tma_w, sb + i * BOX_MN_BYTES, full, n0 + 64 * i, k0, g);
                } else { // one (64 K, 256 N, 1) box of w[g]
                    tma_load_3d(tma_w, sb, full, k0, n0, g);
                }
            }
        }
        return;
    }

    // ---- consumers ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1; // rows [64·cw, 64·cw + 64) of the tile
    const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int g, r0, r1, n0, q;
        fwd_tile(sm, t, num_n, G, group_m, g, r0, r1, n0, q);
        int prev = 0;
        for (int kb = 0; kb < kblocks; kb++, it++) {
            const int s = it % STAGES;
            const uint32_t ph = (it / STAGES) & 1;
            mbar_wait(bars + 8 * s, ph, watchdog_ns);
            const uint32_t sa = ring + s * STAGE_BYTES + cw * (64 * 128), sb = ring + s * STAGE_BYTES + A_BYTES;
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; k++)
                wgmma_m64n256k16<0, TB>(acc, slice_desc<false>(sa, k), slice_desc<TB != 0>(sb, k),
                                        (kb > 0 || k > 0) ? 1 : 0);
            wgmma_commit();
            wgmma_wait<1>();
            if (kb > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + prev));
            prev = s;
        }
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(bars + 8 * (STAGES + prev));

        // ---- epilogue: the group's rows only ----
        store_slice<OutT>(acc, sm.stage + (4 * cw + warp) * EPI_WARP_FLOATS, c, N,
                          r0 + 64 * cw + 16 * warp, r1, n0, N, alpha, beta, true, lane);
        if (sig_flags != nullptr) { // gemm_sm90.cu's per-row-block signal, block q
            consumer_bar(); // every consumer's stores before the one release
            if (threadIdx.x == 128 && *sm.abort_w == 0) { // no signal for a stale tile
                fence_acq_rel_sys();
                red_release_sys_add(sig_flags + q, sig_value);
            }
        }
    }
#else
    if (threadIdx.x == 0 && blockIdx.x == 0) report_error(err, -1);
#endif
}

// tn: c[g] (P, Q) = alpha·a[R_g]ᵀ·b[R_g] + beta·c[g]; both operands MN-major
// (a (M, P), b (M, Q), the reduction over the rows).
template <typename OutT>
__device__ __forceinline__ void grouped_tn_body(const TmaDesc& tma_a, const TmaDesc& tma_b, OutT* c,
                                                const int* off, int G, int M, int P, int Q,
                                                float alpha, float beta, int group_m,
                                                long long watchdog_ns, int* err) {
#if defined(ATP_GEMM90_BODY)
    extern __shared__ __align__(1024) unsigned char grouped90_smem[];
    const GroupedSmem sm = grouped_smem(grouped90_smem);
    const uint32_t ring = sm.ring, bars = sm.bars;
    if (threadIdx.x == 0) grouped_init(sm);
    __syncthreads();
    const int bad = load_groups(sm, off, G, M, false);
    if (bad >= 0 && blockIdx.x == 0 && threadIdx.x == 0) report_error(err, bad);
    const int num_m = (P + BM - 1) / BM, num_n = (Q + BN - 1) / BN;
    const int per = num_m * num_n; // tiles of one group
    const int tiles = __shfl_sync(ATP_FULL_MASK, bad >= 0 ? 0 : G * per, 0);

    const int wg = __shfl_sync(ATP_FULL_MASK, (int)(threadIdx.x / 128), 0);
    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0) return;
        tma_prefetch(tma_a);
        tma_prefetch(tma_b);
        int it = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int g = t / per;
            int mb, nb;
            tile_of(t - g * per, num_m, num_n, group_m, 0, mb, nb);
            const int p0 = mb * BM, q0 = nb * BN;
            const int hi = sm.off_s[g + 1];
            for (int r = sm.off_s[g]; r < hi; r += BK, it++) {
                const int s = it % STAGES;
                const uint32_t ph = (it / STAGES) & 1;
                mbar_wait(bars + 8 * (STAGES + s), ph ^ 1, watchdog_ns);
                const uint32_t full = bars + 8 * s;
                mbar_expect_tx(full, STAGE_BYTES);
                const uint32_t sa = ring + s * STAGE_BYTES, sb = sa + A_BYTES;
                // (64 P, 64 rows) and (64 Q, 64 rows) boxes from row r; rows
                // past the group are zeroed by the consumers.
                tma_load_2d(tma_a, sa, full, p0, r);
                tma_load_2d(tma_a, sa + BOX_MN_BYTES, full, p0 + 64, r);
#pragma unroll
                for (int i = 0; i < BN / 64; i++)
                    tma_load_2d(tma_b, sb + i * BOX_MN_BYTES, full, q0 + 64 * i, r);
            }
        }
        return;
    }

    // ---- consumers ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1; // rows [64·cw, 64·cw + 64) of the tile (columns of a)
    const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    const int tw = threadIdx.x & 127; // the thread in its warpgroup
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int g = t / per;
        int mb, nb;
        tile_of(t - g * per, num_m, num_n, group_m, 0, mb, nb);
        const int p0 = mb * BM, q0 = nb * BN;
        // Warp-uniform for the compiler, like tiles: the K loop and the
        // zeroing branch hold wgmmas and a named barrier.
        const int rows = __shfl_sync(ATP_FULL_MASK, sm.off_s[g + 1] - sm.off_s[g], 0);
        const int kblocks = (rows + BK - 1) / BK;
        int prev = 0;
        for (int kb = 0; kb < kblocks; kb++, it++) {
            const int s = it % STAGES;
            const uint32_t ph = (it / STAGES) & 1;
            mbar_wait(bars + 8 * s, ph, watchdog_ns);
            const uint32_t stage = ring + s * STAGE_BYTES;
            const uint32_t sa = stage + cw * BOX_MN_BYTES, sb = stage + A_BYTES;
            const int valid = rows - kb * BK; // rows of this step in the group (≥ 1)
            if (valid < BK) {
                // Zero K rows [valid, 64): in this warpgroup's A box and in B
                // boxes 2·cw and 2·cw + 1; bytes [128·valid, 8192) of each.
                for (int i = valid * 8 + tw; i < BK * 8; i += 128) {
                    st_shared_zero16(sa + 16 * i);
                    st_shared_zero16(sb + (2 * cw) * BOX_MN_BYTES + 16 * i);
                    st_shared_zero16(sb + (2 * cw + 1) * BOX_MN_BYTES + 16 * i);
                }
                fence_proxy_async_shared();
                consumer_bar(); // the other warpgroup's half of B is zeroed too
            }
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; k++)
                wgmma_m64n256k16<1, 1>(acc, slice_desc<true>(sa, k), slice_desc<true>(sb, k),
                                       (kb > 0 || k > 0) ? 1 : 0);
            wgmma_commit();
            wgmma_wait<1>();
            if (kb > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + prev));
            prev = s;
        }
        wgmma_wait<0>();
        if (kblocks > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + prev));

        // ---- epilogue: c[g] = alpha·acc + beta·c[g]; an empty group has no
        // product (acc holds the previous tile's): alpha·0 ----
        store_slice<OutT>(acc, sm.stage + (4 * cw + warp) * EPI_WARP_FLOATS, c + (long long)g * P * Q,
                          Q, p0 + 64 * cw + 16 * warp, P, q0, Q, alpha, beta, kblocks > 0, lane);
    }
#else
    if (threadIdx.x == 0 && blockIdx.x == 0) report_error(err, -1);
#endif
}

} // namespace gemm90
} // namespace atp

#define GROUPED90_KERNEL(name, TB, OutT)                                                         \
    extern "C" __global__ void __launch_bounds__(atp::gemm90::THREADS, 1) name(                  \
        const __grid_constant__ atp::gemm90::TmaDesc tma_a,                                      \
        const __grid_constant__ atp::gemm90::TmaDesc tma_w, OutT* c, const int* off, int G,      \
        int M, int N, int K, float alpha, float beta, int group_m, long long watchdog_ns,        \
        int* err, const unsigned long long* wait_flags, unsigned long long wait_target,          \
        long long wait_timeout_ns, unsigned long long* sig_flags,                                \
        unsigned long long sig_value) {                                                          \
        atp::gemm90::grouped_body<TB, OutT>(tma_a, tma_w, c, off, G, M, N, K, alpha, beta,       \
                                            group_m, watchdog_ns, err, wait_flags, wait_target,  \
                                            wait_timeout_ns, sig_flags, sig_value);              \
    }

#define GROUPED90_TN_KERNEL(name, OutT)                                                          \
    extern "C" __global__ void __launch_bounds__(atp::gemm90::THREADS, 1) name(                  \
        const __grid_constant__ atp::gemm90::TmaDesc tma_a,                                      \
        const __grid_constant__ atp::gemm90::TmaDesc tma_b, OutT* c, const int* off, int G,      \
        int M, int P, int Q, float alpha, float beta, int group_m, long long watchdog_ns,        \
        int* err) {                                                                              \
        atp::gemm90::grouped_tn_body<OutT>(tma_a, tma_b, c, off, G, M, P, Q, alpha, beta,        \
                                           group_m, watchdog_ns, err);                           \
    }

GROUPED90_KERNEL(grouped_sm90_nt_bf16, 0, bf16)
GROUPED90_KERNEL(grouped_sm90_nt_f32, 0, float)
GROUPED90_KERNEL(grouped_sm90_nn_bf16, 1, bf16)
GROUPED90_KERNEL(grouped_sm90_nn_f32, 1, float)
GROUPED90_TN_KERNEL(grouped_sm90_tn_bf16, bf16)
GROUPED90_TN_KERNEL(grouped_sm90_tn_f32, float)

#endif // !ASYNCTP_EMU
