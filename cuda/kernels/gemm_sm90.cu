// gemm_sm90.cu: the GEMM engine of asynctp on Hopper (sm_90a): a persistent,
// warp-specialized TMA + wgmma bf16 GEMM with fp32 accumulation and a bf16 or
// fp32 output, with the hooks the fused tensor-parallel kernels need (tile
// order, a producer-side wait on per-chunk flags, an epilogue-side signal).
//
//   C (M, N) = alpha · op(A) · op(B) + beta · C           (beta = 0: C not read)
//
// Row-major operands, named by how their elements run in memory:
//   A "K-major"  : A stored (M, K), K contiguous (transA = false)
//   A "MN-major" : A stored (K, M), M contiguous (transA = true)
//   B "K-major"  : B stored (N, K), K contiguous (transB = true)
//   B "MN-major" : B stored (K, N), N contiguous (transB = false)
// Kernels gemm_sm90_<la><lb>_<out>, la/lb = n (not transposed) or t
// (transposed) as in the BLAS names of Backend.MatMul's flags, out = bf16 or
// f32 (C's dtype):
//   nt: y = x·Wᵀ (both K-major: the native wgmma case)
//   nn: dx = dy·W (B MN-major)      tn: dW += dyᵀ·x (both MN-major)
//   tt: A MN-major, B K-major (for completeness)
// and gemm_sm90_<la><lb>_bf16_ts, the same with a TMA-store epilogue (a
// third tensor map, of C; 3 stages; TS_SMEM_BYTES; see store_tile_tma),
// and gemm_sm90_<la><lb>_bf16_tsc, those for beta ≠ 0: the tile of C is
// loaded by TMA during the main loop (load_c_tma). Two families, not one,
// because the load's code in the main loop and epilogue cost the beta = 0
// calls ~10 % at short K (measured: ptxas spilled, nt 0.99–1.08 → 0.87–0.95
// of cuBLASLt).
//
// Split-K (ksplit > 1, only without the hooks): the K range is cut into
// ksplit slices of ⌈K/64 / ksplit⌉ k-blocks, each (tile, slice) is a work
// unit, and each stores its fp32 product alpha·A·B to its slice of partial
// (ksplit × M × N floats); gemm_splitk_reduce_<out> then adds the slices in
// a fixed order and beta·C. For outputs of few tiles with a long K (weight
// gradients: a 768 × 768 dW is 18 tiles for 132 SMs). (A reduction by the
// last unit of each tile instead, without the second kernel, was measured
// 1.2–2 × slower on those shapes: the reduction of a tile then runs on one
// SM, at ~30 GB/s, where the kernel spreads it over all of them;
// docs/measurements/2026-12-02.md.)
//
// Launch: grid (min(tiles · ksplit, SMs)), block 384, dynamic shared memory
// GEMM90_SMEM bytes (needs cuFuncSetAttribute: > 48 KiB). M, N, K > 0 and
// multiples of 8 (16-byte rows for TMA); A, B, C 16-byte aligned.
//
// The design (see README.md, "The GEMM engine"):
//   - Tiles of 128 × 256 (BM × BN), K in steps of 64 (BK: one 128-byte row of
//     bf16 = the 128-byte swizzle span); 4 stages of 48 KiB in shared memory.
//   - Warpgroup 0 is the producer: one thread issues the TMA loads of each
//     stage into the ring (full[s]: TMA transaction bytes; empty[s]: the
//     consumers' release), after waiting on the chunk flags if asked.
//     setmaxnreg gives its registers to the consumers (40 vs 232).
//   - Warpgroups 1 and 2 are consumers: each computes 64 rows × 256 columns
//     of the tile with wgmma.m64n256k16 (128 fp32 accumulators per thread),
//     keeping one wgmma group in flight, then stores its rows with alpha,
//     beta (guarded at the edges) through a 2 KiB staging area per warp,
//     so that the stores are row-contiguous (store_slice).
//   - The grid is persistent: CTA b takes tiles b, b + grid, ...; the tile
//     index goes through a grouped raster (group_m m-blocks per group, for
//     L2 reuse of B) and a rotation of the m-blocks by m_rot (a rank starts
//     at its own shard of M).
//   - The TMA box of a K-major operand is (64 K, rows) and of an MN-major one
//     (64 MN, 64 K), both with CU_TENSOR_MAP_SWIZZLE_128B; the wgmma shared
//     memory descriptors below describe exactly those boxes.
//
// Hooks (all off when the pointer is null):
//   wait_flags: before the TMA loads of a tile, the producer waits until
//     wait_flags[c] >= wait_target (ld.acquire.sys, 64-bit) for every chunk c
//     of wait_rows rows of op(A) that the tile's rows touch. After
//     wait_timeout_ns nanoseconds (%globaltimer) on one chunk it records the
//     chunk in err (err[0] |= 1, err[1] = chunk), sets an abort word in
//     shared memory and from then on completes every stage of its remaining
//     tiles with a plain mbarrier arrive and no load: the CTA runs out
//     quickly on stale data (C is undefined after a timeout), sends no more
//     signals and ends with no TMA load in flight. (Consumers that returned
//     early instead would make the compiler serialise every wgmma: a
//     data-dependent exit puts them on a divergent path.)
//   sig_flags: after all 256 consumer threads stored a tile (each fences,
//     then a named barrier), one thread adds sig_value to sig_flags[i] with
//     red.release.sys: i = m_block · n_blocks + n_block (sig_mode 0, per
//     tile) or i = m_block (sig_mode 1, per 128-row block: it reaches
//     n_blocks · sig_value when the row block is done).
//   Both use system scope: the fused kernels' flags are written by the copy
//   engine (cuStreamWriteValue64) or by peers over NVLink.
//
// Built for anything but sm_90a (compute_90 PTX, sm_80), the kernels only
// report err[1] = -1 (the engine needs sm_90a's wgmma, TMA and setmaxnreg).
// The CPU emulator (ASYNCTP_EMU) does not build this file: it has no TMA,
// mbarrier or wgmma (the Go side refuses the engine there).
#if !defined(ASYNCTP_EMU)
#include "common.cuh"
#include "wgmma.cuh"

namespace atp {
namespace gemm90 {

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4;
constexpr int THREADS = 384;                  // producer warpgroup + 2 consumers
constexpr int A_BYTES = BM * BK * 2;          // 16 KiB
constexpr int B_BYTES = BN * BK * 2;          // 32 KiB
constexpr int STAGE_BYTES = A_BYTES + B_BYTES; // 48 KiB, a multiple of 1024
constexpr int BOX_MN_BYTES = 64 * BK * 2;     // one (64 MN, 64 K) box: 8 KiB
// The epilogue's staging area: per consumer warp, 16 rows × 32 fp32 columns
// (2 KiB; see store_slice).
constexpr int EPI_COLS = 32;
constexpr int EPI_WARP_FLOATS = 16 * EPI_COLS;
constexpr int EPI_BYTES = 8 * EPI_WARP_FLOATS * 4; // 16 KiB
// The ring, 1024-byte aligned by hand (the 128-byte swizzle pattern repeats
// every 1024 bytes and wgmma assumes it starts there), the epilogue's
// staging area, then 2·STAGES mbarriers and the abort word.
constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + EPI_BYTES + 2 * STAGES * 8 + 16;
// The TMA-store kernels (…_bf16_ts, see store_tile_tma): 3 stages, and the
// whole bf16 tile (128 × 256, 64 KiB, four 128-byte-swizzled (64, 64) boxes
// per consumer warpgroup) staged for cp.async.bulk.tensor stores after the
// store_slice area.
constexpr int TS_STAGES = 3;
constexpr int CTILE_BYTES = BM * BN * 2;
// After the ring's mbarriers and the abort word (16 bytes), two more
// mbarriers: cfull[cw], the TMA load of consumer warpgroup cw's half of C
// (beta ≠ 0).
constexpr int TS_SMEM_BYTES = 1024 + TS_STAGES * STAGE_BYTES + EPI_BYTES + CTILE_BYTES + 2 * TS_STAGES * 8 + 16 + 16;
static_assert(TS_SMEM_BYTES <= 227 * 1024, "the TMA-store kernels' ring and tile must fit an SM");
static_assert(SMEM_BYTES <= 227 * 1024, "the ring must fit the 227 KiB of an SM");
static_assert(BOX_MN_BYTES * (BN / 64) == B_BYTES && BOX_MN_BYTES * (BM / 64) == A_BYTES,
              "MN-major boxes tile the stage");
// Tiles of 128 × 192 (TBN = 192, the …_n192 kernels: tn only, no hooks, no
// TMA store): for the weight gradients whose outputs have a few tiles too
// many or too few for the SMs at 256 columns (gpt2's gate,up dW, 4096 ×
// 768, is 96 tiles of 256 columns on 132 SMs and 128 of 192). The stage is
// 40 KiB (a multiple of 1024); the accumulators 96 per thread.
constexpr int N192 = 192;
template <int TBN> __host__ __device__ constexpr int stage_bytes() { return A_BYTES + TBN * BK * 2; }
template <int TBN> __host__ __device__ constexpr int smem_bytes() { return 1024 + STAGES * stage_bytes<TBN>() + EPI_BYTES + 2 * STAGES * 8 + 16; }
static_assert(stage_bytes<BN>() == STAGE_BYTES && smem_bytes<BN>() == SMEM_BYTES, "one layout formula");
static_assert(stage_bytes<N192>() % 1024 == 0 && smem_bytes<N192>() <= 227 * 1024, "the 192-column ring fits");

// A CUtensorMap (cuda.h): 128 opaque bytes, 64-byte aligned. Declared here
// so that the file needs no cuda.h (CUDA 11.8 has none with it).
struct alignas(64) TmaDesc {
    unsigned long long opaque[16];
};

} // namespace gemm90
} // namespace atp

#define GEMM90_SMEM atp::gemm90::SMEM_BYTES
#define GEMM90_SMEM_N192 atp::gemm90::smem_bytes<atp::gemm90::N192>()

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATP_GEMM90_BODY 1
#endif

namespace atp {
namespace gemm90 {

#if defined(ATP_GEMM90_BODY)

// The wgmma primitives of wgmma.cuh (the same instructions).
using wg::desc;
using wg::fence_proxy_async_shared;
using wg::smem_u32;
using wg::wgmma_commit;
using wg::wgmma_fence;
using wg::wgmma_wait;

// ---- mbarrier ----------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// mbar_expect_tx arrives once and adds bytes to the transaction count the
// phase waits for (the TMA loads complete_tx them).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
    uint32_t ok;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
    return ok != 0;
}

__device__ __forceinline__ unsigned long long globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// mbar_wait waits for the phase of parity to complete. A pipeline bug (a
// phase that never completes) would hang the GPU; after watchdog_ns the
// kernel traps instead, so the launch fails at the next synchronisation.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity, long long watchdog_ns) {
    if (mbar_try(bar, parity)) return;
    unsigned long long t0 = globaltimer();
    for (uint32_t n = 1;; n++) {
        if (mbar_try(bar, parity)) return;
        if ((n & 1023) == 0 && (long long)(globaltimer() - t0) > watchdog_ns) __trap();
    }
}

// ---- TMA -------------------------------------------------------------------------

__device__ __forceinline__ void tma_prefetch(const TmaDesc& d) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&d)) : "memory");
}

// tma_load_2d copies the box at (c0 inner, c1 outer) element coordinates of
// the tensor map into shared memory at dst, completing bytes on bar.
// Out-of-bounds elements are written as zeros and count as transferred.
__device__ __forceinline__ void tma_load_2d(const TmaDesc& d, uint32_t dst, uint32_t bar, int c0,
                                            int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&d)), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

// ---- wgmma -------------------------------------------------------------------------

// The operands' shared memory descriptors (desc, wgmma.cuh: PTX ISA,
// "Matrix Descriptor Format": bits 0-13 start address >> 4, 16-29 leading
// byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset (0:
// every tile starts 1024-byte aligned), 62-63 swizzle mode (1 = 128-byte
// swizzle)).
//
// K-major operand, 128-byte swizzle (a TMA box (64 K, R rows)): row r of the
// tile is 128 bytes at r·128, 16-byte chunks XOR-swizzled by r mod 8. The
// 8-row core-matrix groups are 1024 bytes apart (SBO = 1024); LBO is unused
// for swizzled K-major layouts (1 as CUTLASS writes it). The k-th 16-wide K
// slice starts 32·k bytes into the rows: the hardware applies the swizzle to
// the computed addresses, so the start address simply advances.
//
// MN-major operand, 128-byte swizzle (TMA boxes (64 MN, 64 K), one after the
// other along MN, 8 KiB each): K row k of a box is 128 bytes (64 MN
// elements) at k·128. Canonical layout (in 16-byte units)
// ((8,n),(8,k)):((1,LBO),(8,SBO)): LBO = the distance between 64-element
// MN atoms (the next box: 8192), SBO = the distance between groups of 8 K
// rows (1024). The k-th 16-deep K slice starts 16·128 = 2048·k bytes in.
// The descriptor of 16-deep K slice k of an operand tile at addr.
template <bool MN> __device__ __forceinline__ uint64_t slice_desc(uint32_t addr, int k) {
    if (MN) return desc(addr + 2048u * k, BOX_MN_BYTES, 1024);
    return desc(addr + 32u * k, 16, 1024);
}

// The engine's wgmma instructions (m64n256k16, m64n192k16: A and B by
// descriptor, flat accumulator arrays) live in wgmma.cuh with the others.
using wg::wgmma_m64n192k16;
using wg::wgmma_m64n256k16;

// wgmma_k16 is the m64nTBNk16 instruction of a tile of TBN columns.
template <int TA, int TB, int TBN>
__device__ __forceinline__ void wgmma_k16(float (&d)[TBN / 2], uint64_t da, uint64_t db, int accumulate) {
    if constexpr (TBN == BN) wgmma_m64n256k16<TA, TB>(d, da, db, accumulate);
    else wgmma_m64n192k16<TA, TB>(d, da, db, accumulate);
}

// ---- the hooks' memory operations ------------------------------------------------

__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release_sys_add(unsigned long long* p, unsigned long long v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_sys() {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Order the generic-proxy acquire of a flag before the async-proxy (TMA)
// reads of the data it guards.
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

__device__ __forceinline__ void consumer_bar() {
    asm volatile("bar.sync 1, 256;" ::: "memory"); // the two consumer warpgroups
}

// wg_bar: consumer warpgroup cw's 128 threads (named barriers 2 and 3).
__device__ __forceinline__ void wg_bar(int cw) {
    asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
}

// ---- TMA stores (the …_ts kernels' epilogue) -----------------------------------

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
// tma_store_2d writes the box at src to element coordinates (c0 inner, c1
// outer) of the tensor map; what falls outside the tensor is not written.
__device__ __forceinline__ void tma_store_2d(const TmaDesc& d, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(&d)),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// The committed stores have read their shared memory (it may be rewritten).
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// The committed stores are complete.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

#endif // ATP_GEMM90_BODY

// The tile order: tile index t → (m-block, n-block). Grouped raster: group_m
// m-blocks at a time, all n-blocks of the group before the next group
// (group_m ≤ 1: row by row). Then the m-blocks rotate by m_rot (0 ≤ m_rot <
// num_m): the first tiles are those of m-block m_rot.
__device__ __forceinline__ void tile_of(int t, int num_m, int num_n, int group_m, int m_rot,
                                        int& mb, int& nb) {
    if (group_m <= 1) {
        mb = t / num_n;
        nb = t - mb * num_n;
    } else {
        int per = group_m * num_n;
        int g = t / per;
        int first = g * group_m;
        int gs = min(num_m - first, group_m);
        int r = t - g * per;
        mb = first + r % gs;
        nb = r / gs;
    }
    mb += m_rot;
    if (mb >= num_m) mb -= num_m;
}

// Four consecutive elements of C (16-byte aligned for fp32, 8 for bf16).
template <typename OutT> struct Out;
template <> struct Out<float> {
    static __device__ __forceinline__ float4 load4(const float* p) {
        return *reinterpret_cast<const float4*>(p);
    }
    static __device__ __forceinline__ void store4(float* p, float4 v) {
        *reinterpret_cast<float4*>(p) = v;
    }
};
template <> struct Out<bf16> {
    static __device__ __forceinline__ float4 load4(const bf16* p) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        return make_float4(bf16lo(u.x), __uint_as_float(u.x & 0xffff0000u), bf16lo(u.y),
                           __uint_as_float(u.y & 0xffff0000u));
    }
    static __device__ __forceinline__ void store4(bf16* p, float4 v) {
        *reinterpret_cast<uint2*>(p) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
};

// add_beta_c is v + beta·c per element with one rounding (an fma), the
// arithmetic of every epilogue and reduction of the engine: whichever path
// stores a tile, the bits are the same.
__device__ __forceinline__ float4 add_beta_c(float4 v, float beta, float4 c) {
    return make_float4(__fmaf_rn(beta, c.x, v.x), __fmaf_rn(beta, c.y, v.y), __fmaf_rn(beta, c.z, v.z),
                       __fmaf_rn(beta, c.w, v.w));
}

#if defined(ATP_GEMM90_BODY)
// store_slice: the epilogue of one consumer warp, its 16 rows × 256 columns
// of the tile: c[row][col] = alpha·acc + beta·c[row][col] (has = false: the
// product is 0, alpha·nothing), for row < row_end and col < col_end.
// row0 is the warp's first row (16·warp of its warpgroup's 64), col0 the
// tile's first column; ldc is c's row stride; col_end is a multiple of 8.
//
// The accumulators (wgmma_m64n256k16's layout) give a lane 2 adjacent
// columns of 2 rows per 8-column group: stored as they are, each warp
// instruction wrote 8 rows × 16 bytes (bf16), 8 half-used 32-byte sectors,
// and a 128 × 256 bf16 tile took 4096 such store transactions per SM
// (~2 µs, against a ~7 µs main loop at K 768: the engine's loss on short K,
// 0.67–0.82 × cuBLASLt). So the warp stages 32 columns at a time in fp32 in
// its 2 KiB of shared memory and reads them back a row-contiguous float4 per
// lane: a store instruction then writes 4 whole rows of 32 columns (64 bytes
// bf16, 128 bytes fp32), beta's loads likewise. Staging layout: row r,
// column k at word 32·r + 4·((k/4) XOR 2·(r mod 4)) + k mod 4 — the XOR
// spreads the float2 writes of a half-warp (rows r..r+3, columns 8j..8j+7 of
// 4 groups) over the 32 banks, and the float4 reads (8 lanes: one row's 8
// chunks) are conflict-free under any per-row chunk permutation.
// TBN: the tile's columns (the warp's accumulators, TBN / 2).
template <typename OutT, int TBN = BN>
__device__ __forceinline__ void store_slice(const float (&acc)[TBN / 2], float* stage, OutT* c,
                                            long long ldc, int row0, int row_end, int col0,
                                            int col_end, float alpha, float beta, bool has,
                                            int lane) {
    const int qr = lane >> 2, qc = 2 * (lane & 3);
#pragma unroll
    for (int ch = 0; ch < TBN / EPI_COLS; ch++) {
        if (col0 + EPI_COLS * ch >= col_end) break; // warp-uniform: the rest is past N
        __syncwarp(); // the previous chunk's reads are done
#pragma unroll
        for (int jj = 0; jj < EPI_COLS / 8; jj++) {
            const int j = (EPI_COLS / 8) * ch + jj;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = qr + 8 * h, k = 8 * jj + qc;
                const float2 v = has ? make_float2(alpha * acc[4 * j + 2 * h], alpha * acc[4 * j + 2 * h + 1])
                                     : make_float2(0.f, 0.f);
                *reinterpret_cast<float2*>(stage + 32 * r + 4 * ((k >> 2) ^ (2 * (r & 3))) + (k & 3)) = v;
            }
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 16 * EPI_COLS / 128; i++) {
            const int r = 4 * i + (lane >> 3), k4 = lane & 7; // row, float4 chunk
            float4 v = *reinterpret_cast<const float4*>(stage + 32 * r + 4 * (k4 ^ (2 * (r & 3))));
            const int row = row0 + r, col = col0 + EPI_COLS * ch + 4 * k4;
            if (row < row_end && col < col_end) { // col_end is a multiple of 8: all 4 in
                OutT* p = c + (long long)row * ldc + col;
                if (beta != 0.f) v = add_beta_c(v, beta, Out<OutT>::load4(p));
                Out<OutT>::store4(p, v);
            }
        }
    }
}

// load_c_tma: issued by the warpgroup's issuer thread during the main loop
// of a tile when beta ≠ 0: once the previous tile's stores have read the
// area, the boxes of C that store_tile_tma will write are loaded into it
// (the same (64, 64) boxes and swizzle), completing on cfull. Boxes wholly
// outside C are not loaded (their area is never stored either).
__device__ __forceinline__ void load_c_tma(const TmaDesc& tma_c, uint32_t cbase, uint32_t cfull, int cw,
                                           int m0, int n0, int M, int N) {
    bulk_wait_read();
    int boxes = 0;
    if (m0 + 64 * cw < M)
        for (int b = 0; b < 4; b++) boxes += n0 + 64 * b < N;
    mbar_expect_tx(cfull, boxes * 8192);
    for (int b = 0; b < boxes; b++) tma_load_2d(tma_c, cbase + b * 8192, cfull, n0 + 64 * b, m0 + 64 * cw);
}

// store_tile_tma: the epilogue of the …_ts kernels (bf16 C, no signal, no
// split). Consumer warpgroup cw writes its 64 × 256 rows of alpha·acc
// (LC, the …_tsc kernels, with_c: + beta·C, C loaded by load_c_tma, waited
// for on cfull with parity cphase), rounded to bf16, into its 32 KiB of the tile
// area at cbase as
// four (64 columns, 64 rows) boxes with the 128-byte swizzle (row r of a box
// at 128·r, its 16-byte chunk q at position q XOR r mod 8: a warp's 4-byte
// writes of one fragment register pair fall in 32 distinct banks), then one
// thread stores the boxes with cp.async.bulk.tensor (edges clipped by TMA)
// and the warpgroup goes on to its next tile while they drain: the stores
// overlap the next main loop, where store_slice's wait for its own stores'
// issue. Before it rewrites the area, the thread waits until the previous
// tile's stores have read it (long done by then).
template <bool LC>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[128], const TmaDesc& tma_c, uint32_t cbase,
                                               int cw, int warp, int lane, int m0, int n0, int M, int N,
                                               float alpha, float beta, bool with_c, uint32_t cfull,
                                               uint32_t cphase, long long watchdog_ns, bool issuer) {
    if (LC && with_c) {
        mbar_wait(cfull, cphase, watchdog_ns); // C is in the area (load_c_tma)
    } else if (issuer) {
        bulk_wait_read();
    }
    wg_bar(cw);
#pragma unroll
    for (int j = 0; j < 32; j++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * warp + (lane >> 2) + 8 * h;
            const uint32_t off = (j >> 3) * 8192 + r * 128 + (((j & 7) ^ (r & 7)) << 4) + (lane & 3) * 4;
            float v0 = alpha * acc[4 * j + 2 * h], v1 = alpha * acc[4 * j + 2 * h + 1];
            if (LC && with_c) { // store_slice's arithmetic (the fma is explicit: the same bits)
                const uint32_t o = ld_shared_u32(cbase + off);
                v0 = __fmaf_rn(beta, bf16lo(o), v0);
                v1 = __fmaf_rn(beta, __uint_as_float(o & 0xffff0000u), v1);
            }
            st_shared_u32(cbase + off, pack_bf16x2(v0, v1));
        }
    }
    fence_proxy_async_shared();
    wg_bar(cw);
    if (issuer && m0 + 64 * cw < M) {
#pragma unroll
        for (int b = 0; b < 4; b++)
            if (n0 + 64 * b < N) tma_store_2d(tma_c, cbase + b * 8192, n0 + 64 * b, m0 + 64 * cw);
        bulk_commit();
    }
}

#endif // ATP_GEMM90_BODY

// NST: the ring's stages (STAGES, or TS_STAGES with TS); TS: the kernel
// has the tile area and tma_c (store_tile_tma) for the calls it suits; LC
// (with TS): it loads C there for beta ≠ 0 (load_c_tma); TBN: the tile's
// columns (BN, or N192 without TS).
template <int TA, int TB, typename OutT, int NST, bool TS, bool LC, int TBN = BN>
__device__ __forceinline__ void gemm_body(const TmaDesc& tma_a, const TmaDesc& tma_b, const TmaDesc* tma_c, OutT* c,
                                          int M, int N, int K, float alpha, float beta,
                                          int group_m, int m_rot,
                                          const unsigned long long* wait_flags, int wait_rows,
                                          unsigned long long wait_target,
                                          long long wait_timeout_ns,
                                          unsigned long long* sig_flags, int sig_mode,
                                          unsigned long long sig_value, long long watchdog_ns,
                                          int* err, int ksplit, float* partial) {
#if defined(ATP_GEMM90_BODY)
    extern __shared__ __align__(1024) unsigned char gemm90_smem[];
    const uint32_t raw = smem_u32(gemm90_smem);
    const uint32_t ring = (raw + 1023u) & ~1023u;
    static_assert(!TS || sizeof(OutT) == 2, "the TMA-store epilogue writes bf16");
    static_assert(TBN == BN || (TBN == N192 && !TS), "tiles of 256 columns, or of 192 without the TMA store");
    constexpr int SB = stage_bytes<TBN>(); // a stage: A, then B
    float* const stage_all = reinterpret_cast<float*>(gemm90_smem + (ring - raw) + NST * SB);
    const uint32_t ctile = ring + NST * SB + EPI_BYTES; // TS: 1024-aligned (the swizzle's span)
    const uint32_t bars = ctile + (TS ? CTILE_BYTES : 0); // full[s] at +8s, empty[s] at +8(NST+s)
    volatile int* abort_word =
        reinterpret_cast<volatile int*>(gemm90_smem + (bars - raw) + 2 * NST * 8);
    const uint32_t cfull = bars + 2 * NST * 8 + 16; // TS: cfull[cw] at +8·cw

    const int num_m = (M + BM - 1) / BM, num_n = (N + TBN - 1) / TBN;
    const int tiles = num_m * num_n;
    const int kblocks = (K + BK - 1) / BK;
    // Split-K (ksplit > 1, no hooks): work unit u is K slice u / tiles of
    // tile u % tiles, k-blocks [kb0, kb1); its fp32 product goes to slice
    // u / tiles of partial (ksplit × M × N) and gemm_splitk_reduce sums them.
    const int units = tiles * ksplit;
    const int kper = (kblocks + ksplit - 1) / ksplit;

    if (threadIdx.x == 0) {
        for (int s = 0; s < NST; s++) {
            mbar_init(bars + 8 * s, 1);               // full: the producer's expect_tx
            mbar_init(bars + 8 * (NST + s), 2 * 4);  // empty: one arrive per consumer warp
        }
        if (LC) {
            mbar_init(cfull, 1); // the issuer's expect_tx (load_c_tma)
            mbar_init(cfull + 8, 1);
        }
        *abort_word = 0;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();

    // Warp-uniform for the compiler (a shuffle of a value it cannot prove
    // uniform), so the wgmma path is not divergent.
    const int wg = __shfl_sync(ATP_FULL_MASK, (int)(threadIdx.x / 128), 0);
    if (wg == 0) {
        // ---- producer ----
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0) return;
        tma_prefetch(tma_a);
        tma_prefetch(tma_b);
        int it = 0;
        bool aborted = false; // a flag wait timed out: feed the ring without data
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            int mb, nb;
            tile_of(u % tiles, num_m, num_n, group_m, m_rot, mb, nb);
            const int m0 = mb * BM, n0 = nb * TBN;
            const int kb0 = (u / tiles) * kper, kb1 = min(kblocks, kb0 + kper);
            for (int kb = kb0; kb < kb1; kb++, it++) {
                const int s = it % NST;
                const uint32_t ph = (it / NST) & 1;
                mbar_wait(bars + 8 * (NST + s), ph ^ 1, watchdog_ns);
                const uint32_t full = bars + 8 * s;
                if (kb == 0 && wait_flags != nullptr && !aborted) {
                    const int last = min(m0 + BM, M) - 1;
                    for (int ch = m0 / wait_rows; ch <= last / wait_rows; ch++) {
                        if (ld_acquire_sys(wait_flags + ch) >= wait_target) continue;
                        const unsigned long long t0 = globaltimer();
                        bool ok = false;
                        for (;;) {
                            if (ld_acquire_sys(wait_flags + ch) >= wait_target) {
                                ok = true;
                                break;
                            }
                            if ((long long)(globaltimer() - t0) > wait_timeout_ns) break;
                            __nanosleep(128);
                        }
                        if (!ok) {
                            report_error(err, ch);
                            *abort_word = 1;
                            aborted = true;
                            break;
                        }
                    }
                    if (!aborted) fence_proxy_async_global();
                }
                if (aborted) {
                    // Complete the phase without data (no TMA in flight when
                    // the CTA ends); the consumers run on stale tiles.
                    mbar_arrive(full);
                    continue;
                }
                mbar_expect_tx(full, SB);
                const uint32_t sa = ring + s * SB, sb = sa + A_BYTES;
                const int k0 = kb * BK;
                if (TA) { // (64 M, 64 K) boxes
                    tma_load_2d(tma_a, sa, full, m0, k0);
                    tma_load_2d(tma_a, sa + BOX_MN_BYTES, full, m0 + 64, k0);
                } else { // one (64 K, 128 M) box
                    tma_load_2d(tma_a, sa, full, k0, m0);
                }
                if (TB) { // (64 N, 64 K) boxes
#pragma unroll
                    for (int i = 0; i < TBN / 64; i++)
                        tma_load_2d(tma_b, sb + i * BOX_MN_BYTES, full, n0 + 64 * i, k0);
                } else { // one (64 K, TBN N) box
                    tma_load_2d(tma_b, sb, full, k0, n0);
                }
            }
        }
        return;
    }

    // ---- consumers ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1;                 // rows [64·cw, 64·cw + 64) of the tile
    const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31;
    float acc[TBN / 2];
#pragma unroll
    for (int i = 0; i < TBN / 2; i++) acc[i] = 0.f;
    // The TMA-store epilogue where it applies (uniform: kernel arguments);
    // the signal needs the tile's stores complete, beta needs C read first
    // (LC: the issuer loads the tile of C into the area during the main
    // loop, load_c_tma, and the epilogue adds it from there), split-K stores
    // fp32.
    const bool use_tma = TS && (LC || beta == 0.f) && sig_flags == nullptr && ksplit == 1;
    const bool load_c = LC && use_tma && beta != 0.f;
    const bool issuer = (threadIdx.x & 127) == 0; // one thread per consumer warpgroup
    uint32_t cphase = 0; // cfull[cw]'s parity
    int it = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
        int mb, nb;
        tile_of(u % tiles, num_m, num_n, group_m, m_rot, mb, nb);
        const int m0 = mb * BM, n0 = nb * TBN;
        const int split = u / tiles;
        const int kb0 = split * kper, kb1 = min(kblocks, kb0 + kper);
        int prev = 0;
        for (int kb = kb0; kb < kb1; kb++, it++) {
            const int s = it % NST;
            const uint32_t ph = (it / NST) & 1;
            mbar_wait(bars + 8 * s, ph, watchdog_ns);
            const uint32_t sa = ring + s * SB + cw * (64 * 128), sb = ring + s * SB + A_BYTES;
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; k++)
                wgmma_k16<TA, TB, TBN>(acc, slice_desc<TA>(sa, k), slice_desc<TB>(sb, k),
                                       (kb > kb0 || k > 0) ? 1 : 0);
            wgmma_commit();
            // The group before this one is complete: its stage can be refilled.
            wgmma_wait<1>();
            if (kb > kb0 && lane == 0) mbar_arrive(bars + 8 * (NST + prev));
            // The tile's C, while this k-block's wgmma runs.
            if (load_c && kb == kb0 && issuer)
                load_c_tma(*tma_c, ctile + cw * (CTILE_BYTES / 2), cfull + 8 * cw, cw, m0, n0, M, N);
            prev = s;
        }
        wgmma_wait<0>();
        if (kb1 > kb0 && lane == 0) mbar_arrive(bars + 8 * (NST + prev));

        // ---- epilogue: through the warp's staging area (store_slice) ----
        float* const stage = stage_all + (4 * cw + warp) * EPI_WARP_FLOATS;
        const int row0 = m0 + 64 * cw + 16 * warp;
        if (ksplit > 1) { // an empty last slice (kb1 = kb0) stores zeros
            store_slice<float, TBN>(acc, stage, partial + (long long)split * M * N, N, row0, M, n0, N,
                               alpha, 0.f, kb1 > kb0, lane);
        } else if (use_tma) {
            if constexpr (TS) { // (tiles of BN columns: store_tile_tma's accumulators)
                store_tile_tma<LC>(acc, *tma_c, ctile + cw * (CTILE_BYTES / 2), cw, warp, lane, m0, n0, M, N,
                                   alpha, beta, load_c, cfull + 8 * cw, cphase, watchdog_ns, issuer);
                cphase ^= load_c ? 1u : 0u;
            }
        } else
            store_slice<OutT, TBN>(acc, stage, c, N, row0, M, n0, N, alpha, beta, true, lane);
        if (sig_flags != nullptr) {
            // The barrier orders every consumer thread's stores before
            // thread 128's release, and a release is cumulative: one
            // system-scope fence per tile, by the signalling thread, instead
            // of one per thread (eight membar.sys per tile cost ~13 % of a
            // short-K GEMM: hooks/plain 1.13 at K 1024, measured). The
            // grid-sync pattern of cooperative groups, at system scope.
            consumer_bar();
            if (threadIdx.x == 128 && *abort_word == 0) { // no signal for a stale tile
                fence_acq_rel_sys();
                red_release_sys_add(sig_flags + (sig_mode == 0 ? (long long)mb * num_n + nb : mb),
                                    sig_value);
            }
        }
    }
    if (use_tma && issuer) bulk_wait(); // no store in flight when the CTA ends
#else
    // Not sm_90a: no wgmma, TMA or setmaxnreg. Say so instead of computing.
    if (threadIdx.x == 0 && blockIdx.x == 0) report_error(err, -1);
#endif
}

} // namespace gemm90
} // namespace atp

// One kernel per operand layout and output dtype (the transposes are
// immediates of the wgmma instruction).
// The parameters after C, and their names, shared by both kernel families.
#define GEMM90_PARAMS                                                                            \
    int M, int N, int K, float alpha, float beta, int group_m, int m_rot,                        \
        const unsigned long long *wait_flags, int wait_rows, unsigned long long wait_target,     \
        long long wait_timeout_ns, unsigned long long *sig_flags, int sig_mode,                  \
        unsigned long long sig_value, long long watchdog_ns, int *err, int ksplit, float *partial
#define GEMM90_ARGS                                                                              \
    M, N, K, alpha, beta, group_m, m_rot, wait_flags, wait_rows, wait_target, wait_timeout_ns,   \
        sig_flags, sig_mode, sig_value, watchdog_ns, err, ksplit, partial
// TBN: the tile's columns (BN; N192 for the …_n192 kernels, dynamic shared
// memory smem_bytes<N192>(), GEMM90_SMEM_N192).
#define GEMM90_KERNEL(name, TA, TB, OutT, TBN)                                                   \
    extern "C" __global__ void __launch_bounds__(atp::gemm90::THREADS, 1) name(                  \
        const __grid_constant__ atp::gemm90::TmaDesc tma_a,                                      \
        const __grid_constant__ atp::gemm90::TmaDesc tma_b, OutT* c, GEMM90_PARAMS) {            \
        atp::gemm90::gemm_body<TA, TB, OutT, atp::gemm90::STAGES, false, false, TBN>(           \
            tma_a, tma_b, nullptr, c, GEMM90_ARGS);                                              \
    }
// The TMA-store kernels (bf16 C): a tensor map of C after those of A and B,
// TS_STAGES stages, dynamic shared memory TS_SMEM_BYTES. LC: the …_tsc
// family (C loaded for beta ≠ 0). Calls that do not suit the TMA store (a
// signal, split-K; beta ≠ 0 without LC) take store_slice here too.
#define GEMM90_TS_KERNEL(name, TA, TB, LC)                                                        \
    extern "C" __global__ void __launch_bounds__(atp::gemm90::THREADS, 1) name(                  \
        const __grid_constant__ atp::gemm90::TmaDesc tma_a,                                      \
        const __grid_constant__ atp::gemm90::TmaDesc tma_b,                                      \
        const __grid_constant__ atp::gemm90::TmaDesc tma_c, bf16* c, GEMM90_PARAMS) {            \
        atp::gemm90::gemm_body<TA, TB, bf16, atp::gemm90::TS_STAGES, true, LC>(tma_a, tma_b,     \
                                                                               &tma_c, c,       \
                                                                               GEMM90_ARGS);    \
    }

GEMM90_KERNEL(gemm_sm90_nt_bf16, 0, 0, bf16, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_nt_f32, 0, 0, float, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_nn_bf16, 0, 1, bf16, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_nn_f32, 0, 1, float, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_tn_bf16, 1, 1, bf16, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_tn_f32, 1, 1, float, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_tt_bf16, 1, 0, bf16, atp::gemm90::BN)
GEMM90_KERNEL(gemm_sm90_tt_f32, 1, 0, float, atp::gemm90::BN)
// Tiles of 128 × 192 for the weight-gradient layout (see N192).
GEMM90_KERNEL(gemm_sm90_tn_bf16_n192, 1, 1, bf16, atp::gemm90::N192)
GEMM90_KERNEL(gemm_sm90_tn_f32_n192, 1, 1, float, atp::gemm90::N192)
GEMM90_TS_KERNEL(gemm_sm90_nt_bf16_ts, 0, 0, false)
GEMM90_TS_KERNEL(gemm_sm90_nn_bf16_ts, 0, 1, false)
GEMM90_TS_KERNEL(gemm_sm90_tn_bf16_ts, 1, 1, false)
GEMM90_TS_KERNEL(gemm_sm90_tt_bf16_ts, 1, 0, false)
GEMM90_TS_KERNEL(gemm_sm90_nt_bf16_tsc, 0, 0, true)
GEMM90_TS_KERNEL(gemm_sm90_nn_bf16_tsc, 0, 1, true)
GEMM90_TS_KERNEL(gemm_sm90_tn_bf16_tsc, 1, 1, true)
GEMM90_TS_KERNEL(gemm_sm90_tt_bf16_tsc, 1, 0, true)

// gemm_splitk_reduce_<out>: c = Σ_s partial[s] + beta·c over the n4 float4
// groups of an (M, N) output (M·N a multiple of 4), the slices added in
// order s = 0, 1, …: the same bits every run. Any architecture.
template <typename OutT>
__device__ __forceinline__ void splitk_reduce(const float* partial, int splits, long long n4, OutT* c,
                                              float beta) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 v = reinterpret_cast<const float4*>(partial)[i];
        for (int s = 1; s < splits; s++) {
            const float4 p = reinterpret_cast<const float4*>(partial + s * 4 * n4)[i];
            v.x += p.x;
            v.y += p.y;
            v.z += p.z;
            v.w += p.w;
        }
        if (beta != 0.f) v = atp::gemm90::add_beta_c(v, beta, atp::gemm90::Out<OutT>::load4(c + 4 * i));
        atp::gemm90::Out<OutT>::store4(c + 4 * i, v);
    }
}
extern "C" __global__ void gemm_splitk_reduce_bf16(const float* partial, int splits, long long n4,
                                                   bf16* c, float beta) {
    splitk_reduce<bf16>(partial, splits, n4, c, beta);
}
extern "C" __global__ void gemm_splitk_reduce_f32(const float* partial, int splits, long long n4,
                                                  float* c, float beta) {
    splitk_reduce<float>(partial, splits, n4, c, beta);
}

#endif // !ASYNCTP_EMU
