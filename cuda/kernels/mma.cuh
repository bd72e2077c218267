// mma.cuh: thin wrappers over the warp-level tensor-core instructions of
// sm_80+ (also valid on sm_90): mma.sync m16n8k16 bf16 → fp32, ldmatrix and
// cp.async. Under ASYNCTP_EMU the same functions are emulated from the PTX
// ISA's fragment layouts (emu/emu.h gathers the warp's registers), so kernels
// written against them run in the CPU emulator.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), with g = lane / 4 and t = lane % 4; a register holds two
// bf16, the lower-indexed element in the low half:
//   A (16×16, row-major): a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..2t+1],
//                         a[2] = A[g][2t+8..+9],   a[3] = A[g+8][2t+8..+9]
//   B (16×8, k × n):      b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..+9][g]
//   C, D (16×8, fp32):    c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
// ldmatrix.x4 loads four 8×8 b16 matrices; lanes 8i..8i+7 give the row
// addresses of matrix i; lane l receives, of matrix i, register r[i] = row
// l/4, elements 2(l%4) and 2(l%4)+1 (with .trans: the transposed matrix, i.e.
// elements [2(l%4)][l/4] and [2(l%4)+1][l/4]).
#pragma once

#include "common.cuh"

namespace atp {

#if !defined(ASYNCTP_EMU)

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// cp_async16 copies 16 bytes global → shared asynchronously (L2 only), or
// writes 16 zero bytes when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#else // ASYNCTP_EMU: the same semantics, from the layouts above

inline float emu_bf16(uint32_t reg, int hi) { return hi ? bf16hi(reg) : bf16lo(reg); }

inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    struct Frag {
        uint32_t a[4], b[2];
    } mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[32];
    emu_warp_allgather(&mine, all, sizeof(Frag));
    int lane = emu_lane(), g = lane >> 2, t = lane & 3;
    auto A = [&](int r, int k) {
        int reg = (r < 8 ? 0 : 1) + (k < 8 ? 0 : 2);
        return emu_bf16(all[(r & 7) * 4 + ((k & 7) >> 1)].a[reg], k & 1);
    };
    auto Bm = [&](int k, int n) { return emu_bf16(all[n * 4 + ((k & 7) >> 1)].b[k < 8 ? 0 : 1], k & 1); };
    for (int e = 0; e < 4; e++) {
        int r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) acc += A(r, k) * Bm(k, n);
        d[e] += acc;
    }
}

inline void emu_require_aligned16(const void* p, const char* what) {
    if (reinterpret_cast<uintptr_t>(p) & 15) {
        std::fprintf(stderr, "emu: %s address %p is not 16-byte aligned\n", what, p);
        std::abort();
    }
}

inline void emu_ldmatrix(uint32_t (&r)[4], const void* p, bool trans) {
    emu_require_aligned16(p, "ldmatrix row");
    const uint16_t* rows[32];
    const uint16_t* mine = static_cast<const uint16_t*>(p);
    emu_warp_allgather(&mine, rows, sizeof(mine));
    int lane = emu_lane();
    for (int m = 0; m < 4; m++) {
        int i0, j0, i1, j1; // the two elements (row, col) of matrix m this lane gets
        if (!trans) {
            i0 = i1 = lane >> 2;
            j0 = 2 * (lane & 3);
            j1 = j0 + 1;
        } else {
            i0 = 2 * (lane & 3);
            i1 = i0 + 1;
            j0 = j1 = lane >> 2;
        }
        uint32_t lo = rows[m * 8 + i0][j0], hi = rows[m * 8 + i1][j1];
        r[m] = lo | (hi << 16);
    }
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) { emu_ldmatrix(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { emu_ldmatrix(r, p, true); }

inline void cp_async16(void* dst, const void* src, bool valid) {
    emu_require_aligned16(dst, "cp.async destination");
    if (valid) emu_require_aligned16(src, "cp.async source");
    if (valid)
        std::memcpy(dst, src, 16);
    else
        std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}

#endif

} // namespace atp
