// attention_mma.cuh: the pieces the tensor-core attention kernels
// (attention_fa2.cu on mma.sync, attention_wg.cu on wgmma) share: fragment
// loads from shared tiles by ldmatrix, accumulators turned into A operands,
// the row rescale of the online softmax, quad reductions, the log2 constants.
// First written for the first-generation kernels (experimental/attention_tc.cu).
#pragma once
#include "common.cuh" // defines: bf16, pack_bf16x2, ATP_FULL_MASK
#include "mma.cuh"    // defines: ldmatrix_x4, ldmatrix_x4_trans

namespace atp {

constexpr float kTcLog2e = 1.4426950408889634f;
constexpr float kTcLn2 = 0.6931471805599453f;

// Fragment loads (see mma.cuh for the layouts). ld is the row stride in
// elements of the shared tile; all addresses are 16-byte aligned.
//
// frag_a: the A operand, rows [r0, r0+16) × cols [c0, c0+16) of a row-major
// tile.
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16* tile, int ld, int r0, int c0) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4(a, tile + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8);
}
// frag_b_rows: B operands for two n-tiles where B[k][n] = tile[n][k] (the
// tile's rows are n): rows [n0, n0+16) × cols [k0, k0+16). Returns
// b[0..1] for n-tile n0 and b[2..3] for n-tile n0 + 8.
__device__ __forceinline__ void frag_b_rows(uint32_t (&b)[4], const bf16* tile, int ld, int n0, int k0) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4(b, tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
}
// frag_b_cols: B operands for two n-tiles where B[k][n] = tile[k][n] (the
// tile's rows are k): rows [k0, k0+16) × cols [n0, n0+16). Returns b[0..1]
// for n-tile n0 and b[2..3] for n-tile n0 + 8.
__device__ __forceinline__ void frag_b_cols(uint32_t (&b)[4], const bf16* tile, int ld, int k0, int n0) {
    int lane = threadIdx.x & 31;
    ldmatrix_x4_trans(b, tile + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + n0 + (lane >> 4) * 8);
}

// acc_to_a packs the fp32 accumulators of n-tiles 2s and 2s+1 (16 columns)
// into the A operand of a product over those 16 columns (as k).
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}

// acc_scale_rows scales a warp's accumulators of D/8 n-tiles by row: rows
// g by c0, rows g + 8 by c1 (the online softmax's rescale of O).
template <int DT> __device__ __forceinline__ void acc_scale_rows(float (&o)[DT][4], float c0, float c1) {
#pragma unroll
    for (int j = 0; j < DT; j++) {
        o[j][0] *= c0;
        o[j][1] *= c0;
        o[j][2] *= c1;
        o[j][3] *= c1;
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(ATP_FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(ATP_FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_add(float v) {
    v += __shfl_xor_sync(ATP_FULL_MASK, v, 1);
    return v + __shfl_xor_sync(ATP_FULL_MASK, v, 2);
}

} // namespace atp
