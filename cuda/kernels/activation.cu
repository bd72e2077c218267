// activation.cu: SwiGLU, GELU (tanh approximation) and row softmax, forward
// and backward.
//
// SwiGLU and GELU are elementwise over n elements (grid-stride, 16-byte packs
// when the pointers are aligned alike; outputs may alias inputs). Launch:
// block 256, grid ≈ min(ceil(n / 8 / 256), a few waves).
//
// Softmax works on rows of (N, C): one block per row, blockDim.x a multiple of
// 32 (the Go side picks 32..1024 from C), fp32 online max/sum.
#include "common.cuh"

namespace atp {

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T> __device__ void swiglu_fwd_impl(T* out, const T* gate, const T* up, long long n) {
    T* outs[1] = {out};
    const T* ins[2] = {gate, up};
    vmap<T, 2, 1>(outs, ins, n, grid_thread(), grid_threads(), [](long long, const float (&x)[2], float (&y)[1]) {
        float g = x[0];
        y[0] = g * sigmoidf(g) * x[1];
    });
}

// dgate = dout · up · σ(g)·(1 + g·(1 − σ(g))),  dup = dout · g·σ(g).
template <typename T>
__device__ void swiglu_bwd_impl(T* dgate, T* dup, const T* dout, const T* gate, const T* up, long long n) {
    T* outs[2] = {dgate, dup};
    const T* ins[3] = {dout, gate, up};
    vmap<T, 3, 2>(outs, ins, n, grid_thread(), grid_threads(), [](long long, const float (&x)[3], float (&y)[2]) {
        float d = x[0], g = x[1], u = x[2];
        float s = sigmoidf(g);
        y[0] = d * u * s * (1.0f + g * (1.0f - s));
        y[1] = d * g * s;
    });
}

constexpr float kGeluC0 = 0.7978845608028654f; // sqrt(2/π)
constexpr float kGeluC1 = 0.044715f;

template <typename T> __device__ void gelu_fwd_impl(T* out, const T* x, long long n) {
    T* outs[1] = {out};
    const T* ins[1] = {x};
    vmap<T, 1, 1>(outs, ins, n, grid_thread(), grid_threads(), [](long long, const float (&v)[1], float (&y)[1]) {
        float a = v[0];
        float u = kGeluC0 * (a + kGeluC1 * a * a * a);
        y[0] = 0.5f * a * (1.0f + tanhf(u));
    });
}

// dx = dout · (0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·c0·(1 + 3·c1·x²)).
template <typename T> __device__ void gelu_bwd_impl(T* dx, const T* dout, const T* x, long long n) {
    T* outs[1] = {dx};
    const T* ins[2] = {dout, x};
    vmap<T, 2, 1>(outs, ins, n, grid_thread(), grid_threads(), [](long long, const float (&v)[2], float (&y)[1]) {
        float a = v[1];
        float u = kGeluC0 * (a + kGeluC1 * a * a * a);
        float th = tanhf(u);
        float du = kGeluC0 * (1.0f + 3.0f * kGeluC1 * a * a);
        y[0] = v[0] * (0.5f * (1.0f + th) + 0.5f * a * (1.0f - th * th) * du);
    });
}

// Launch: grid N, block 32..1024 (multiple of 32).
template <typename T> __device__ void softmax_fwd_impl(T* out, const T* x, int N, int C) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    if (row >= N) return; // uniform over the block
    const T* xr = x + row * C;
    float m = -INFINITY, s = 0.0f;
    const T* ins[1] = {xr};
    vvisit<T, 1>(ins, C, threadIdx.x, blockDim.x, [&](long long, const float (&v)[1]) {
        float a = v[0];
        if (a > m) {
            s = s * expf(m - a) + 1.0f;
            m = a;
        } else {
            s += expf(a - m);
        }
    });
    float M = block_max(m, scratch);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), scratch);
    float inv = 1.0f / S;
    T* outs[1] = {out + row * C};
    vmap<T, 1, 1>(outs, ins, C, threadIdx.x, blockDim.x,
                  [M, inv](long long, const float (&v)[1], float (&y)[1]) { y[0] = expf(v[0] - M) * inv; });
}

// dx = out · (dout − Σ dout·out). Launch: grid N, block 32..1024.
template <typename T> __device__ void softmax_bwd_impl(T* dx, const T* dout, const T* out, int N, int C) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    if (row >= N) return;
    const T* ins[2] = {dout + row * C, out + row * C};
    float d = 0.0f;
    vvisit<T, 2>(ins, C, threadIdx.x, blockDim.x, [&](long long, const float (&v)[2]) { d += v[0] * v[1]; });
    d = block_sum(d, scratch);
    T* outs[1] = {dx + row * C};
    vmap<T, 2, 1>(outs, ins, C, threadIdx.x, blockDim.x,
                  [d](long long, const float (&v)[2], float (&y)[1]) { y[0] = v[1] * (v[0] - d); });
}

} // namespace atp

using namespace atp;

// out, gate, up (n). Grid-stride, block 256.
KERNEL void swiglu_fwd_bf16(bf16* out, const bf16* gate, const bf16* up, long long n) {
    swiglu_fwd_impl(out, gate, up, n);
}
KERNEL void swiglu_fwd_f32(float* out, const float* gate, const float* up, long long n) {
    swiglu_fwd_impl(out, gate, up, n);
}
// dgate, dup, dout, gate, up (n). Grid-stride, block 256.
KERNEL void swiglu_bwd_bf16(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, long long n) {
    swiglu_bwd_impl(dgate, dup, dout, gate, up, n);
}
KERNEL void swiglu_bwd_f32(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                           long long n) {
    swiglu_bwd_impl(dgate, dup, dout, gate, up, n);
}
// out, x (n). Grid-stride, block 256.
KERNEL void gelu_fwd_bf16(bf16* out, const bf16* x, long long n) { gelu_fwd_impl(out, x, n); }
KERNEL void gelu_fwd_f32(float* out, const float* x, long long n) { gelu_fwd_impl(out, x, n); }
// dx, dout, x (n). Grid-stride, block 256.
KERNEL void gelu_bwd_bf16(bf16* dx, const bf16* dout, const bf16* x, long long n) { gelu_bwd_impl(dx, dout, x, n); }
KERNEL void gelu_bwd_f32(float* dx, const float* dout, const float* x, long long n) { gelu_bwd_impl(dx, dout, x, n); }
// out, x (N, C). Launch: grid N, block 32..1024 (a multiple of 32).
KERNEL void softmax_fwd_bf16(bf16* out, const bf16* x, int N, int C) { softmax_fwd_impl(out, x, N, C); }
KERNEL void softmax_fwd_f32(float* out, const float* x, int N, int C) { softmax_fwd_impl(out, x, N, C); }
// dx, dout, out (N, C). Launch: grid N, block 32..1024 (a multiple of 32).
KERNEL void softmax_bwd_bf16(bf16* dx, const bf16* dout, const bf16* out, int N, int C) {
    softmax_bwd_impl(dx, dout, out, N, C);
}
KERNEL void softmax_bwd_f32(float* dx, const float* dout, const float* out, int N, int C) {
    softmax_bwd_impl(dx, dout, out, N, C);
}
