// wgmma.cuh: Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) for kernels
// that keep their operand tiles in shared memory in the 128-byte-swizzled
// layout and may take A from registers (attention_wg.cu), with a CPU
// emulation of the same semantics (ASYNCTP_EMU), so those kernels run in
// the emulator too — asynchrony included: a result lands at the wait that
// retires its group, and the shared memory it read must be unchanged then
// (emu.h). bf16 inputs, fp32 accumulators.
//
// ATP_WG_BODY is defined where the kernels' bodies are built: sm_90a device
// code and the emulator. Elsewhere (compute_90 PTX, the host pass) a kernel
// that needs wgmma traps (the Go side launches it only on sm_90). The GEMM
// engine (gemm_sm90.cu) uses the same primitives (desc, fences, waits).
//
// The tile layout (wg_off): R rows × D bf16 columns (D a multiple of 64) as
// D/64 boxes of R × 64, box b at b·R·128 bytes; row r of a box is 128 bytes
// at r·128, its 16-byte chunks XOR-swizzled by r mod 8 — what a TMA box with
// CU_TENSOR_MAP_SWIZZLE_128B writes, and what the descriptors below describe
// (as gemm_sm90.cu's, whose K-major and MN-major forms are the same). Tiles
// start 1024-byte aligned (the swizzle pattern repeats every 1024 bytes and
// wgmma assumes it starts there); R is a multiple of 8.
//
// Fragment layouts (thread t of the warpgroup, warp w = t/32, lane l, g =
// l/4, q = l mod 4), the same as mma.sync m16n8k16's (mma.cuh), so the
// attention kernels share their softmax code with attention_fa2.cu:
//   accumulator of m64nN: float d[N/8][4], d[j][e] is row 16w + g + 8·(e/2),
//     column 8j + 2q + (e mod 2);
//   register A of m64k16: uint32_t a[4], bf16 pairs (row 16w + g + 8·(i mod
//     2), columns 2q + 8·(i/2) and the next), i.e. acc_to_a of two
//     accumulator column blocks.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#if defined(ASYNCTP_EMU) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define ATP_WG_BODY 1
#endif

namespace atp {
namespace wg {

// wg_off is the element offset of 16-byte chunk ch (columns 8·ch ...) of row
// r in an R-row tile.
template <int R> __device__ __forceinline__ int wg_off(int r, int ch) {
    return (ch >> 3) * R * 64 + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
}

// wg_frag_a loads (ldmatrix) the register-A fragment of rows [r0, r0 + 16)
// × columns [c0, c0 + 16) of an R-row tile; r0 is the warp's first row.
template <int R> __device__ __forceinline__ void wg_frag_a(uint32_t (&a)[4], const bf16* tile, int r0, int c0) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4(a, tile + wg_off<R>(r0 + (lane & 15), (c0 >> 3) + (lane >> 4)));
}

#if defined(ATP_WG_BODY)

// smem_u32: the shared-memory address of p (the emulator: its offset into
// the block's dynamic shared memory, the only shared memory these kernels
// give wgmma).
#if defined(ASYNCTP_EMU)
inline uint32_t smem_u32(const void* p) {
    ptrdiff_t off = static_cast<const unsigned char*>(p) - static_cast<const unsigned char*>(emu_dynamic_smem());
    if (off < 0 || (size_t)off > emu_dynamic_smem_size()) {
        std::fprintf(stderr, "emu: wgmma operand %p is not in the dynamic shared memory\n", p);
        std::abort();
    }
    return (uint32_t)off;
}
#else
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// desc: wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix
// Descriptor Format"; see gemm_sm90.cu): start address, leading and stride
// byte offsets (>> 4 each), base offset 0, 128-byte swizzle.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

// kmajor: the R-row tile at addr as a K-major operand whose K is the
// tile's columns (rows are M or N): 16-column slice kk. Rows in 8-row groups
// 1024 bytes apart (SBO); the slice starts 32·(kk mod 4) bytes into box kk/4.
template <int R> __device__ __forceinline__ uint64_t kmajor(uint32_t addr, int kk) {
    return desc(addr + (uint32_t)((kk >> 2) * R * 128 + 32 * (kk & 3)), 16, 1024);
}
// mnmajor: the R-row tile at addr as an MN-major B whose K is the tile's
// rows and N its columns: 16-row slice kk. N atoms of 64 columns one box
// (R·128 bytes) apart (LBO), K rows in 8-row groups 1024 bytes apart (SBO).
template <int R> __device__ __forceinline__ uint64_t mnmajor(uint32_t addr, int kk) {
    return desc(addr + 2048u * kk, R * 128, 1024);
}

#if defined(ASYNCTP_EMU)

// wgmma's asynchrony as the emulator models it (emu.h): results land at
// the wait that retires their group, NaN until then.
inline void wgmma_fence() {}
inline void wgmma_commit() { emu_wg_commit(); }
template <int N> inline void wgmma_wait() { emu_wg_wait(N); }
inline void fence_proxy_async_shared() {}
template <int N, typename T> inline void wg_keep(T (&)[N][4]) {}

// emu_desc_elem: element (k, n) of the operand a descriptor describes —
// K-major (mn false): row n, column k; MN-major: K row k, column n — read
// where the hardware would: the canonical layout's byte address, then the
// 128-byte swizzle (bits 4–6 XOR bits 7–9).
inline float emu_desc_elem(uint64_t d, bool mn, int k, int n) {
    uint32_t start = (uint32_t)(d & 0x3FFF) << 4, lbo = (uint32_t)((d >> 16) & 0x3FFF) << 4,
             sbo = (uint32_t)((d >> 32) & 0x3FFF) << 4;
    if ((d >> 62) != 1 || ((d >> 49) & 7) != 0) {
        std::fprintf(stderr, "emu: wgmma descriptor %#llx: only the 128-byte swizzle with base offset 0\n",
                     (unsigned long long)d);
        std::abort();
    }
    uint32_t a = mn ? start + (uint32_t)(n >> 6) * lbo + (uint32_t)(k >> 3) * sbo + (uint32_t)(k & 7) * 128 +
                          (uint32_t)(n & 63) * 2
                    : start + (uint32_t)(n >> 3) * sbo + (uint32_t)(n & 7) * 128 + (uint32_t)k * 2;
    a ^= ((a >> 7) & 7) << 4;
    if ((size_t)a + 2 > emu_dynamic_smem_size()) {
        std::fprintf(stderr, "emu: wgmma reads byte %u of %zu of shared memory\n", a, emu_dynamic_smem_size());
        std::abort();
    }
    uint16_t bits;
    std::memcpy(&bits, static_cast<const unsigned char*>(emu_dynamic_smem()) + a, 2);
    return __uint_as_float((uint32_t)bits << 16);
}

// emu_operand_sum: a checksum (FNV-1a) of the shared-memory operands of a
// wgmma: args[0] B's descriptor, args[1] whether B is MN-major, args[2] N,
// args[3] A's descriptor (0: A in registers). emu_wgmma passes it to
// emu_wg_issue for lane 0 of each warp (the hardware's wgmma is per warp
// quarter of the warpgroup; one check per warp is enough).
inline uint64_t emu_operand_sum(const uint64_t* args) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](float v) {
        uint32_t b;
        std::memcpy(&b, &v, 4);
        h = (h ^ b) * 1099511628211ull;
    };
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < (int)args[2]; n++) mix(emu_desc_elem(args[0], args[1] != 0, k, n));
    if (args[3] != 0)
        for (int row = 0; row < 64; row++)
            for (int k = 0; k < 16; k++) mix(emu_desc_elem(args[3], false, k, row));
    return h;
}

// emu_wgmma: d (this thread's part of 64 × N) = (accumulate ? d : 0) + A·B,
// A(row, k) and B(k, n) as the callers give them; row is the warpgroup row.
// The operands are read at issue; the result is pending until its wait
// (emu_wg_issue; a (nullable): the A registers, which must not change
// before then). d's input is the latest pending result for d if there is
// one (a chained wgmma of the same group), else its registers.
template <int N, typename FA, typename FB>
inline void emu_wgmma(float (&d)[N / 8][4], FA A, FB Bm, int accumulate, const uint32_t* a, const uint64_t (&sum_args)[4]) {
    int t = (int)threadIdx.x & 127, w = t >> 5, l = t & 31, g = l >> 2, q = l & 3;
    const float* prev = emu_wg_pending(&d[0][0]);
    float r[N / 2];
    for (int j = 0; j < N / 8; j++)
        for (int e = 0; e < 4; e++) {
            int row = 16 * w + g + 8 * (e >> 1), n = 8 * j + 2 * q + (e & 1);
            float acc = 0.0f;
            for (int k = 0; k < 16; k++) acc += A(row, k) * Bm(k, n);
            float in = prev ? prev[4 * j + e] : d[j][e];
            r[4 * j + e] = (accumulate ? in : 0.0f) + acc;
        }
    bool check = (threadIdx.x & 31) == 0;
    emu_wg_issue(&d[0][0], N / 2, r, a, check ? emu_operand_sum : nullptr, sum_args,
                 check ? emu_operand_sum(sum_args) : 0);
}

// wgmma_rs: d += A·B, A (64 × 16) in registers, B (16 × N) by descriptor,
// K-major (TB 0) or MN-major (TB 1).
template <int N, int TB>
inline void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    struct Frag {
        uint32_t a[4];
    } mine = {{a[0], a[1], a[2], a[3]}}, all[32];
    emu_warp_allgather(&mine, all, sizeof(Frag));
    auto A = [&](int row, int k) {
        int r = row & 15, reg = (r < 8 ? 0 : 1) + (k < 8 ? 0 : 2);
        return emu_bf16(all[(r & 7) * 4 + ((k & 7) >> 1)].a[reg], k & 1);
    };
    const uint64_t args[4] = {db, TB != 0, (uint64_t)N, 0};
    emu_wgmma<N>(d, A, [&](int k, int n) { return emu_desc_elem(db, TB != 0, k, n); }, accumulate, &a[0], args);
}

// wgmma_ss: d += A·B, A (64 × 16) K-major by descriptor, B as wgmma_rs.
template <int N, int TB> inline void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, int accumulate) {
    const uint64_t args[4] = {db, TB != 0, (uint64_t)N, da};
    emu_wgmma<N>(
        d, [&](int row, int k) { return emu_desc_elem(da, false, k, row); },
        [&](int k, int n) { return emu_desc_elem(db, TB != 0, k, n); }, accumulate, nullptr, args);
}

#else // sm_90a

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// This thread's generic-proxy writes to shared memory (cp.async included),
// made visible to the async proxy (TMA stores, wgmma's operand reads).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// wg_keep is a compiler barrier on registers (CUTLASS's
// warpgroup_fence_operand): the compiler may not move this thread's reads
// or writes of x across it. wgmma runs asynchronously, but to the compiler
// its asm statement has produced its outputs when it returns, and
// wgmma_fence / wgmma_wait name no registers; so every wgmma group is
// bracketed by wg_keep of the registers it touches — before wgmma_fence for
// the accumulators and A fragments (their writes land before the fence, as
// wgmma requires) and after wgmma_wait for the same (no read of a result
// before the wait, no reuse of an A register while the group may still read
// it). wg_group, below, issues a group with those brackets.
template <int N> __device__ __forceinline__ void wg_keep(float (&x)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(x[j][e])::"memory");
}
template <int N> __device__ __forceinline__ void wg_keep(uint32_t (&x)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(x[j][e])::"memory");
}

// Accumulator operands, four per column block j.
#define ATP_WG_ACC4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define ATP_WG_ACC16(j) ATP_WG_ACC4(j), ATP_WG_ACC4(j + 1), ATP_WG_ACC4(j + 2), ATP_WG_ACC4(j + 3)
#define ATP_WG_A "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])

template <int TB>
__device__ __forceinline__ void wgmma_rs64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, "
                 "%38;\n}\n"
                 : ATP_WG_ACC16(0), ATP_WG_ACC16(4)
                 : ATP_WG_A, "l"(db), "r"(accumulate), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgmma_rs128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, "
                 "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
                 "%58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : ATP_WG_ACC16(0), ATP_WG_ACC16(4), ATP_WG_ACC16(8), ATP_WG_ACC16(12)
                 : ATP_WG_A, "l"(db), "r"(accumulate), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgmma_ss32(float (&d)[4][4], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, "
                 "%19;\n}\n"
                 : ATP_WG_ACC16(0)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgmma_ss64(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
                 : ATP_WG_ACC16(0), ATP_WG_ACC16(4)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}
#undef ATP_WG_ACC4
#undef ATP_WG_ACC16
#undef ATP_WG_A

// The GEMM engine's instructions (gemm_sm90.cu, grouped_sm90.cu): A and B
// by descriptor, N 256 or 192, the accumulators as one flat array (the
// engine's epilogue indexes d[r]). Their accumulator operands, eight at a
// time.
#define ATP_ACC8(i)                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),  \
        "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 × 256 per warpgroup, fp32) += A (64 × 16) · B (16 × 256), or = with
// accumulate 0. TA / TB: A / B MN-major (imm-trans-a / imm-trans-b).
// Accumulator layout (thread t of the warpgroup, warp w = t/32, lane l):
// d[r] is row 16·w + l/4 + 8·((r/2) mod 2), column 8·(r/4) + 2·(l mod 4) +
// (r mod 2).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db,
                                                 int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, %131, %132;\n"
        "}\n"
        : ATP_ACC8(0), ATP_ACC8(8), ATP_ACC8(16), ATP_ACC8(24), ATP_ACC8(32), ATP_ACC8(40), ATP_ACC8(48), ATP_ACC8(56),
          ATP_ACC8(64), ATP_ACC8(72), ATP_ACC8(80), ATP_ACC8(88), ATP_ACC8(96), ATP_ACC8(104), ATP_ACC8(112), ATP_ACC8(120)
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
}

// The same with B 16 × 192 (96 accumulators per thread, the same layout).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n192k16(float (&d)[96], uint64_t da, uint64_t db,
                                                 int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
        "}, %96, %97, p, 1, 1, %99, %100;\n"
        "}\n"
        : ATP_ACC8(0), ATP_ACC8(8), ATP_ACC8(16), ATP_ACC8(24), ATP_ACC8(32), ATP_ACC8(40), ATP_ACC8(48), ATP_ACC8(56),
          ATP_ACC8(64), ATP_ACC8(72), ATP_ACC8(80), ATP_ACC8(88)
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
}
#undef ATP_ACC8

// wgmma_rs: d (64 × N) += A·B, A (64 × 16) in registers, B (16 × N) by
// descriptor, K-major (TB 0) or MN-major (TB 1); N 64 or 128.
template <int N, int TB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    static_assert(N == 64 || N == 128, "wgmma_rs: N 64 or 128");
    if constexpr (N == 64) wgmma_rs64<TB>(d, a, db, accumulate);
    else wgmma_rs128<TB>(d, a, db, accumulate);
}
// wgmma_ss: d (64 × N) += A·B, A (64 × 16) K-major by descriptor; N 32 or 64.
template <int N, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t da, uint64_t db, int accumulate) {
    static_assert(N == 32 || N == 64, "wgmma_ss: N 32 or 64");
    if constexpr (N == 32) wgmma_ss32<TB>(d, da, db, accumulate);
    else wgmma_ss64<TB>(d, da, db, accumulate);
}

#endif // ASYNCTP_EMU

// wg_group issues one wgmma group (issue: its wgmma_rs / wgmma_ss calls)
// and waits for it, with wg_keep on the registers the group touches (regs:
// its accumulators and register A fragments) before the fence and after the
// wait: the ordering every group needs (see wg_keep), in one place.
template <typename Issue, typename... Regs>
__device__ __forceinline__ void wg_group(Issue&& issue, Regs&... regs) {
    (wg_keep(regs), ...);
    wgmma_fence();
    issue();
    wgmma_commit();
    wgmma_wait<0>();
    (wg_keep(regs), ...);
}
#endif // ATP_WG_BODY

} // namespace wg
} // namespace atp
