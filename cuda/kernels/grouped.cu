// grouped.cu: the grouped GEMMs of MoE experts (tensor.GroupedGEMM): one
// launch for all the experts of a rank, whose rows lie one group after the
// other in a buffer. The groups' row offsets are read from device memory
// (off (G+1) int32: group g has rows [off[g], off[g+1])), so the host never
// needs the counts.
//
//   grouped_mm   c[R_g] = alpha·a[R_g]·op(w[g]) + beta·c[R_g]
//                a (M, K), c (M, N), w (G, N, K) with transW (op = ᵀ), else (G, K, N)
//   grouped_mm_tn c[g] = alpha·a[R_g]ᵀ·b[R_g] + beta·c[g]
//                a (M, P), b (M, Q), c (G, P, Q)
//
// A tiled SIMT GEMM (64×64 tiles, k-steps of 16 staged in shared memory as
// fp32, 4×4 outputs per thread, fp32 accumulation in a fixed order; any M,
// N, K, no alignment needed). It is the correctness baseline of the grouped
// form; the wgmma engine (grouped_sm90.cu) replaces it where speed matters. Offsets
// that are not 0 ≤ off[0] ≤ … ≤ off[G] ≤ M are reported through err (the
// index of the first bad entry) and nothing is written.
#include "common.cuh"

namespace atp {

constexpr int GG_BM = 64, GG_BN = 64, GG_BK = 16, GG_THREADS = 256;

__device__ __forceinline__ int gg_min(int a, int b) { return a < b ? a : b; }

// gg_bad_offset returns the index of the first entry of off (G+1) that
// breaks 0 ≤ off[0] ≤ … ≤ off[G] ≤ M, or −1.
__device__ int gg_bad_offset(const int* off, int G, int M) {
    int prev = 0;
    for (int i = 0; i <= G; i++) {
        int v = off[i];
        if (v < prev || v > M) return i;
        prev = v;
    }
    return -1;
}

// gg_tile accumulates one 64×64 output tile of a product of depth terms:
// acc[i][j] += Σ_k A(ty + 16i, k)·B(k, tx + 16j) for the thread (ty, tx) =
// (tid / 16, tid % 16), with A(i, k) = A[i·sai + k·sak] for i < rows and
// B(k, j) = B[k·sbk + j·sbn] for j < cols (zero outside). Every thread of the
// block calls it (it has block barriers).
template <typename T>
__device__ void gg_tile(float (&acc)[4][4], const T* A, long long sai, long long sak, int rows, const T* B,
                        long long sbk, long long sbn, int cols, int depth) {
    __shared__ float As[GG_BK][GG_BM + 1];
    __shared__ float Bs[GG_BK][GG_BN + 1];
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    for (int k0 = 0; k0 < depth; k0 += GG_BK) {
        // Loads: the contiguous index of each operand runs fastest.
        for (int e = tid; e < GG_BK * GG_BM; e += GG_THREADS) {
            int kk = sak == 1 ? e % GG_BK : e / GG_BM;
            int ii = sak == 1 ? e / GG_BK : e % GG_BM;
            int k = k0 + kk;
            As[kk][ii] = (ii < rows && k < depth) ? f32(A[ii * sai + k * sak]) : 0.0f;
        }
        for (int e = tid; e < GG_BK * GG_BN; e += GG_THREADS) {
            int kk = sbn == 1 ? e / GG_BN : e % GG_BK;
            int jj = sbn == 1 ? e % GG_BN : e / GG_BK;
            int k = k0 + kk;
            Bs[kk][jj] = (jj < cols && k < depth) ? f32(B[k * sbk + jj * sbn]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk++) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) av[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
}

// gg_store writes the tile: C(i, j) = alpha·acc + beta·C(i, j) at
// C + i·ldc + j for i < rows, j < cols (beta = 0 ignores the old value).
template <typename T>
__device__ void gg_store(T* C, long long ldc, int rows, int cols, const float (&acc)[4][4], float alpha, float beta) {
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = ty + 16 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int col = tx + 16 * j;
            if (col >= cols) continue;
            T* p = C + r * ldc + col;
            float v = alpha * acc[i][j];
            if (beta != 0.0f) v += beta * f32(*p);
            *p = cvt<T>(v);
        }
    }
}

// Launch: grid (ceil(M / 64) + G, ceil(N / 64)), block 256. Block x is the
// x-th 64-row tile of the groups taken in order (each group starts a new
// tile; Σ_g ceil(rows_g / 64) ≤ ceil(M / 64) + G), block y a 64-column tile.
template <typename T>
__device__ void grouped_mm_impl(T* c, const T* a, const T* w, const int* off, int G, int M, int N, int K, int transW,
                                float alpha, float beta, int* err) {
    __shared__ int info[3]; // group, first row, rows of this tile (group −1: none)
    if (threadIdx.x == 0) {
        int g = -1, r0 = 0, rows = 0;
        int bad = gg_bad_offset(off, G, M);
        if (bad >= 0) {
            report_error(err, bad);
        } else {
            long long t = blockIdx.x, seen = 0;
            for (int i = 0; i < G; i++) {
                long long nt = (off[i + 1] - off[i] + GG_BM - 1) / GG_BM;
                if (t < seen + nt) {
                    g = i;
                    r0 = off[i] + (int)(t - seen) * GG_BM;
                    rows = gg_min(GG_BM, off[i + 1] - r0);
                    break;
                }
                seen += nt;
            }
        }
        info[0] = g;
        info[1] = r0;
        info[2] = rows;
    }
    __syncthreads();
    int g = info[0], r0 = info[1], rows = info[2];
    if (g < 0) return; // the whole block: no barrier follows
    int c0 = blockIdx.y * GG_BN, cols = gg_min(GG_BN, N - c0);
    const T* wg = w + (long long)g * N * K;
    float acc[4][4] = {};
    if (transW) // B(k, j) = w[g][c0 + j][k]
        gg_tile(acc, a + (long long)r0 * K, K, 1, rows, wg + (long long)c0 * K, 1, K, cols, K);
    else // B(k, j) = w[g][k][c0 + j]
        gg_tile(acc, a + (long long)r0 * K, K, 1, rows, wg + c0, N, 1, cols, K);
    gg_store(c + (long long)r0 * N + c0, N, rows, cols, acc, alpha, beta);
}

// Launch: grid (ceil(Q / 64), ceil(P / 64), G), block 256: block (x, y, g)
// computes the tile (y, x) of c[g], summing over the group's rows in order.
template <typename T>
__device__ void grouped_mm_tn_impl(T* c, const T* a, const T* b, const int* off, int G, int M, int P, int Q,
                                   float alpha, float beta, int* err) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        int bad = gg_bad_offset(off, G, M);
        if (bad >= 0) report_error(err, bad);
        ok = bad < 0;
    }
    __syncthreads();
    if (!ok) return;
    int g = blockIdx.z, p0 = blockIdx.y * GG_BM, q0 = blockIdx.x * GG_BN;
    int lo = off[g], depth = off[g + 1] - lo;
    int rows = gg_min(GG_BM, P - p0), cols = gg_min(GG_BN, Q - q0);
    float acc[4][4] = {};
    // A(i, k) = a[lo + k][p0 + i], B(k, j) = b[lo + k][q0 + j]
    gg_tile(acc, a + (long long)lo * P + p0, 1, P, rows, b + (long long)lo * Q + q0, Q, 1, cols, depth);
    gg_store(c + ((long long)g * P + p0) * Q + q0, Q, rows, cols, acc, alpha, beta);
}

} // namespace atp

using namespace atp;

KERNEL void grouped_mm_bf16(bf16* c, const bf16* a, const bf16* w, const int* off, int G, int M, int N, int K,
                            int transW, float alpha, float beta, int* err) {
    grouped_mm_impl(c, a, w, off, G, M, N, K, transW, alpha, beta, err);
}
KERNEL void grouped_mm_f32(float* c, const float* a, const float* w, const int* off, int G, int M, int N, int K,
                           int transW, float alpha, float beta, int* err) {
    grouped_mm_impl(c, a, w, off, G, M, N, K, transW, alpha, beta, err);
}
KERNEL void grouped_mm_tn_bf16(bf16* c, const bf16* a, const bf16* b, const int* off, int G, int M, int P, int Q,
                               float alpha, float beta, int* err) {
    grouped_mm_tn_impl(c, a, b, off, G, M, P, Q, alpha, beta, err);
}
KERNEL void grouped_mm_tn_f32(float* c, const float* a, const float* b, const int* off, int G, int M, int P, int Q,
                              float alpha, float beta, int* err) {
    grouped_mm_tn_impl(c, a, b, off, G, M, P, Q, alpha, beta, err);
}
