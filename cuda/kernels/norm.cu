// norm.cu: RMSNorm forward and backward.
//
//   out = x · rstd · w,  rstd = 1 / sqrt(mean(x²) + eps)           x, out (N, C); w (C); rstd (N) fp32
//   dx  = rstd · dout·w − rstd³ · x · Σ_c(dout·w·x) / C            (overwritten)
//   dw += Σ_n dout · x · rstd                                      (two deterministic stages)
//
// Fused with the residual stream's adds (AddRMSNorm, RMSNormBackwardAdd):
//
//   h   = x + r (rounded), then out, rstd of h as above                 one pass over x, r; h written once
//   dx  = (the dx above, at h) + dres                                 dres read in the same pass
//
// One warp per row for the row kernels (16-byte packs when the row and w are
// aligned alike; fp32 sums). dw: rmsnorm_dw_partial writes per-chunk partial
// sums (R, C) fp32, then colsum_finish (elementwise.cu) adds them, in chunk
// order, into dw. No atomics: runs are bit-for-bit repeatable.
#include "common.cuh"

namespace atp {

// Launch: grid ceil(N / 8), block 256 (8 warps, one row each).
template <typename T>
__device__ void rmsnorm_fwd_impl(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return; // the whole warp leaves; no block barrier follows
    const T* xr = x + row * C;
    T* orow = out + row * C;
    float ss = 0.0f;
    const T* in1[1] = {xr};
    vvisit<T, 1>(in1, C, lane, 32, [&](long long, const float (&v)[1]) { ss += v[0] * v[0]; });
    ss = warp_sum(ss);
    float r = rsqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[row] = r;
    T* outs[1] = {orow};
    const T* in2[2] = {xr, w};
    vmap<T, 2, 1>(outs, in2, C, lane, 32,
                  [r](long long, const float (&v)[2], float (&y)[1]) { y[0] = v[0] * r * v[1]; });
}

// Launch: grid ceil(N / 8), block 256 (8 warps, one row each).
template <typename T>
__device__ void rmsnorm_bwd_dx_impl(T* dx, const T* dout, const T* x, const T* w, const float* rstd, int N,
                                    int C) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* xr = x + row * C;
    const T* gr = dout + row * C;
    float s = 0.0f;
    const T* in3[3] = {gr, w, xr};
    vvisit<T, 3>(in3, C, lane, 32, [&](long long, const float (&v)[3]) { s += v[0] * v[1] * v[2]; });
    s = warp_sum(s);
    float r = rstd[row];
    float k = r * r * r * s / (float)C;
    T* outs[1] = {dx + row * C};
    vmap<T, 3, 1>(outs, in3, C, lane, 32,
                  [r, k](long long, const float (&v)[3], float (&y)[1]) { y[0] = r * v[0] * v[1] - k * v[2]; });
}

// add_rmsnorm_fwd: h = x + r, out = h·rstd·w with rstd of the rounded h
// (what Add then RMSNorm compute). Launch: grid ceil(N / 8), block 256 (8
// warps, one row each). h may alias x or r: each element is read and
// written by one lane; the second pass reads h back after __syncwarp (the
// lanes' shares of the two passes may differ when the pointers' alignments
// do).
template <typename T>
__device__ void add_rmsnorm_fwd_impl(T* h, T* out, float* rstd, const T* x, const T* r, const T* w, int N, int C,
                                     float eps) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    T* hr = h + row * C;
    float ss = 0.0f;
    T* outs1[1] = {hr};
    const T* in1[2] = {x + row * C, r + row * C};
    vmap<T, 2, 1>(outs1, in1, C, lane, 32, [&](long long, const float (&v)[2], float (&y)[1]) {
        float s = v[0] + v[1];
        float q = f32(cvt<T>(s)); // the value h holds
        ss += q * q;
        y[0] = s;
    });
    ss = warp_sum(ss);
    __syncwarp();
    float rs = rsqrtf(ss / (float)C + eps);
    if (lane == 0) rstd[row] = rs;
    T* outs2[1] = {out + row * C};
    const T* in2[2] = {hr, w};
    vmap<T, 2, 1>(outs2, in2, C, lane, 32,
                  [rs](long long, const float (&v)[2], float (&y)[1]) { y[0] = v[0] * rs * v[1]; });
}

// rmsnorm_bwd_dx_add: dx = rstd·dout·w − rstd³·h·Σ(dout·w·h)/C + dres, the
// dx of rmsnorm_bwd_dx with the residual gradient added in the same pass
// (rounded once, where RMSNormBackward then Add round twice). dx may alias
// dres. Launch: grid ceil(N / 8), block 256.
template <typename T>
__device__ void rmsnorm_bwd_dx_add_impl(T* dx, const T* dout, const T* h, const T* w, const float* rstd,
                                        const T* dres, int N, int C) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* xr = h + row * C;
    const T* gr = dout + row * C;
    float s = 0.0f;
    const T* in3[3] = {gr, w, xr};
    vvisit<T, 3>(in3, C, lane, 32, [&](long long, const float (&v)[3]) { s += v[0] * v[1] * v[2]; });
    s = warp_sum(s);
    float rs = rstd[row];
    float k = rs * rs * rs * s / (float)C;
    T* outs[1] = {dx + row * C};
    const T* in4[4] = {gr, w, xr, dres + row * C};
    vmap<T, 4, 1>(outs, in4, C, lane, 32, [rs, k](long long, const float (&v)[4], float (&y)[1]) {
        y[0] = rs * v[0] * v[1] - k * v[2] + v[3];
    });
}

// partial (R, C) fp32: partial[r, c] = Σ dout[n, c]·x[n, c]·rstd[n] over the
// rows n of chunk r. Launch: grid (ceil(C / 32), R), block (32, 8), as
// colsum_partial.
template <typename T>
__device__ void rmsnorm_dw_partial_impl(float* partial, const T* dout, const T* x, const float* rstd, int N, int C,
                                        int rows_per_chunk) {
    __shared__ float s[8][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int r = blockIdx.y;
    long long n0 = (long long)r * rows_per_chunk;
    long long n1 = n0 + rows_per_chunk < N ? n0 + rows_per_chunk : N;
    float acc = 0.0f;
    if (c < C)
        for (long long n = n0 + ty; n < n1; n += 8) acc += f32(dout[n * C + c]) * f32(x[n * C + c]) * rstd[n];
    s[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < C) {
        float v = s[0][tx];
#pragma unroll
        for (int k = 1; k < 8; k++) v += s[k][tx];
        partial[(long long)r * C + c] = v;
    }
}

} // namespace atp

using namespace atp;

// out, x (N, C); w (C); rstd (N) fp32. Launch: grid ceil(N / 8), block 256.
KERNEL void rmsnorm_fwd_bf16(bf16* out, float* rstd, const bf16* x, const bf16* w, int N, int C, float eps) {
    rmsnorm_fwd_impl(out, rstd, x, w, N, C, eps);
}
KERNEL void rmsnorm_fwd_f32(float* out, float* rstd, const float* x, const float* w, int N, int C, float eps) {
    rmsnorm_fwd_impl(out, rstd, x, w, N, C, eps);
}
// dx, dout, x (N, C); w (C); rstd (N). Launch: grid ceil(N / 8), block 256.
KERNEL void rmsnorm_bwd_dx_bf16(bf16* dx, const bf16* dout, const bf16* x, const bf16* w, const float* rstd, int N,
                                int C) {
    rmsnorm_bwd_dx_impl(dx, dout, x, w, rstd, N, C);
}
KERNEL void rmsnorm_bwd_dx_f32(float* dx, const float* dout, const float* x, const float* w, const float* rstd,
                               int N, int C) {
    rmsnorm_bwd_dx_impl(dx, dout, x, w, rstd, N, C);
}
// h, out, x, r (N, C); w (C); rstd (N) fp32. Launch: grid ceil(N / 8), block 256.
KERNEL void add_rmsnorm_fwd_bf16(bf16* h, bf16* out, float* rstd, const bf16* x, const bf16* r, const bf16* w, int N,
                                 int C, float eps) {
    add_rmsnorm_fwd_impl(h, out, rstd, x, r, w, N, C, eps);
}
KERNEL void add_rmsnorm_fwd_f32(float* h, float* out, float* rstd, const float* x, const float* r, const float* w,
                                int N, int C, float eps) {
    add_rmsnorm_fwd_impl(h, out, rstd, x, r, w, N, C, eps);
}
// dx, dout, h, dres (N, C); w (C); rstd (N). Launch: grid ceil(N / 8), block 256.
KERNEL void rmsnorm_bwd_dx_add_bf16(bf16* dx, const bf16* dout, const bf16* h, const bf16* w, const float* rstd,
                                    const bf16* dres, int N, int C) {
    rmsnorm_bwd_dx_add_impl(dx, dout, h, w, rstd, dres, N, C);
}
KERNEL void rmsnorm_bwd_dx_add_f32(float* dx, const float* dout, const float* h, const float* w, const float* rstd,
                                   const float* dres, int N, int C) {
    rmsnorm_bwd_dx_add_impl(dx, dout, h, w, rstd, dres, N, C);
}
// partial (R, C) fp32; dout, x (N, C); rstd (N). Launch: grid (ceil(C / 32), R),
// block (32, 8); then colsum_finish (dw, partial, R, C).
KERNEL void rmsnorm_dw_partial_bf16(float* partial, const bf16* dout, const bf16* x, const float* rstd, int N, int C,
                                    int rows_per_chunk) {
    rmsnorm_dw_partial_impl(partial, dout, x, rstd, N, C, rows_per_chunk);
}
KERNEL void rmsnorm_dw_partial_f32(float* partial, const float* dout, const float* x, const float* rstd, int N,
                                   int C, int rows_per_chunk) {
    rmsnorm_dw_partial_impl(partial, dout, x, rstd, N, C, rows_per_chunk);
}
