// elementwise.cu: bf16↔f32 casts, Add, Scale, Axpy, AddBias, and the
// deterministic column sums behind SumRows (and RMSNorm's dw).
//
// Launch geometry of the 1-D kernels (cast, add, scale, axpy, add_bias): a
// grid-stride loop; the Go side uses blocks of 256 threads and enough blocks
// to cover n / 8 packs, capped at a few waves of the SMs. Every
// pointer may be unaligned: 16-byte packs are used only when all pointers of
// the call share one alignment (common.cuh, vmap).
#include "common.cuh"

namespace atp {

template <typename T> __device__ void add_impl(T* dst, const T* a, const T* b, long long n) {
    T* outs[1] = {dst};
    const T* ins[2] = {a, b};
    vmap<T, 2, 1>(outs, ins, n, grid_thread(), grid_threads(),
                  [](long long, const float (&x)[2], float (&y)[1]) { y[0] = x[0] + x[1]; });
}

template <typename T> __device__ void scale_impl(T* dst, const T* a, float s, long long n) {
    T* outs[1] = {dst};
    const T* ins[1] = {a};
    vmap<T, 1, 1>(outs, ins, n, grid_thread(), grid_threads(),
                  [s](long long, const float (&x)[1], float (&y)[1]) { y[0] = s * x[0]; });
}

template <typename T> __device__ void axpy_impl(T* y, float alpha, const T* x, long long n) {
    T* outs[1] = {y};
    const T* ins[2] = {y, x};
    vmap<T, 2, 1>(outs, ins, n, grid_thread(), grid_threads(),
                  [alpha](long long, const float (&v)[2], float (&r)[1]) { r[0] = v[0] + alpha * v[1]; });
}

// add_bias: x (N, C) += bias (C). Packs are used when C is a multiple of the
// pack and the pointers are aligned alike (then bias[i % C] is a pack too).
template <typename T> __device__ void add_bias_impl(T* x, const T* bias, long long N, int C) {
    constexpr int V = Pack<T>::N;
    long long n = N * (long long)C;
    long long t = grid_thread(), nt = grid_threads();
    if (C % V == 0 && misalign16(x) == 0 && misalign16(bias) == 0) {
        for (long long j = t; j < n / V; j += nt) {
            long long i0 = j * V;
            float a[V], b[V];
            load_pack<T>(x + i0, a);
            load_pack<T>(bias + (int)(i0 % C), b);
#pragma unroll
            for (int e = 0; e < V; e++) a[e] += b[e];
            store_pack<T>(x + i0, a);
        }
        return;
    }
    for (long long i = t; i < n; i += nt) x[i] = cvt<T>(f32(x[i]) + f32(bias[(int)(i % C)]));
}

// colsum_partial: partial (R, C) fp32, partial[r, c] = Σ x[n, c] over the rows
// n of chunk r: [r·rows_per_chunk, min(N, (r+1)·rows_per_chunk)).
// Launch: grid (ceil(C / 32), R), block (32, 8). Thread (tx, ty) of block
// (bx, r) sums column c = 32·bx + tx over rows r·rpc + ty, + 8, ...; the 8
// partial sums are then added in ty order. Deterministic for a given R.
template <typename T>
__device__ void colsum_partial_impl(float* partial, const T* x, int N, int C, int rows_per_chunk) {
    __shared__ float s[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int r = blockIdx.y;
    long long n0 = (long long)r * rows_per_chunk;
    long long n1 = n0 + rows_per_chunk < N ? n0 + rows_per_chunk : N;
    float acc = 0.0f;
    if (c < C)
        for (long long n = n0 + ty; n < n1; n += 8) acc += f32(x[n * C + c]);
    s[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < C) {
        float v = s[0][tx];
#pragma unroll
        for (int k = 1; k < 8; k++) v += s[k][tx];
        partial[(long long)r * C + c] = v;
    }
}

// colsum_finish: dst (C) += Σ_r partial[r, :] (r in order), rounding once.
// Launch: grid ceil(C / 256), block 256.
template <typename T> __device__ void colsum_finish_impl(T* dst, const float* partial, int R, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float v = 0.0f;
    for (int r = 0; r < R; r++) v += partial[(long long)r * C + c];
    dst[c] = cvt<T>(f32(dst[c]) + v);
}

} // namespace atp

using namespace atp;

// ---- casts: dst (n) = src (n) (same-dtype copies and fills use cuMemcpy/cuMemset) ----
KERNEL void cast_bf16_f32(float* dst, const bf16* src, long long n) {
    for (long long i = grid_thread(); i < n; i += grid_threads()) dst[i] = f32(src[i]);
}
KERNEL void cast_f32_bf16(bf16* dst, const float* src, long long n) {
    for (long long i = grid_thread(); i < n; i += grid_threads()) dst[i] = cvt<bf16>(src[i]);
}

// ---- dst (n) = a + b --------------------------------------------------------
KERNEL void add_bf16(bf16* dst, const bf16* a, const bf16* b, long long n) { add_impl(dst, a, b, n); }
KERNEL void add_f32(float* dst, const float* a, const float* b, long long n) { add_impl(dst, a, b, n); }

// ---- dst (n) = s · a --------------------------------------------------------
KERNEL void scale_bf16(bf16* dst, const bf16* a, float s, long long n) { scale_impl(dst, a, s, n); }
KERNEL void scale_f32(float* dst, const float* a, float s, long long n) { scale_impl(dst, a, s, n); }

// ---- y (n) += alpha · x -------------------------------------------------------
KERNEL void axpy_bf16(bf16* y, float alpha, const bf16* x, long long n) { axpy_impl(y, alpha, x, n); }
KERNEL void axpy_f32(float* y, float alpha, const float* x, long long n) { axpy_impl(y, alpha, x, n); }

// ---- x (N, C) += bias (C) -----------------------------------------------------
KERNEL void add_bias_bf16(bf16* x, const bf16* bias, long long N, int C) { add_bias_impl(x, bias, N, C); }
KERNEL void add_bias_f32(float* x, const float* bias, long long N, int C) { add_bias_impl(x, bias, N, C); }

// ---- SumRows, stage 1: partial (R, C) fp32 -------------------------------------
KERNEL void colsum_partial_bf16(float* partial, const bf16* x, int N, int C, int rows_per_chunk) {
    colsum_partial_impl(partial, x, N, C, rows_per_chunk);
}
KERNEL void colsum_partial_f32(float* partial, const float* x, int N, int C, int rows_per_chunk) {
    colsum_partial_impl(partial, x, N, C, rows_per_chunk);
}

// ---- SumRows (and RMSNorm dw), stage 2: dst (C) += Σ_r partial (R, C) ----------
KERNEL void colsum_finish_bf16(bf16* dst, const float* partial, int R, int C) {
    colsum_finish_impl(dst, partial, R, C);
}
KERNEL void colsum_finish_f32(float* dst, const float* partial, int R, int C) {
    colsum_finish_impl(dst, partial, R, C);
}
