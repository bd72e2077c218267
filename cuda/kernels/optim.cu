// optim.cu: AdamW over a flat buffer in one launch, and the sum of squares
// behind the gradient norm.
#include "common.cuh"

namespace atp {

// adamw_elem: one element's update from its raw gradient g. Both paths
// below run this code, and every product and sum is rounded where written
// (no contraction left to the compiler, which fused differently in the two
// paths on the GPU), so an element's bits do not depend on the path.
__device__ __forceinline__ void adamw_elem(float g, float grad_scale, float& m, float& v, float& w, float lr,
                                           float b1, float b2, float eps, float wd, float bc1, float bc2) {
    float gr = __fmul_rn(g, grad_scale);
    m = __fmaf_rn(b1, m, __fmul_rn(1.0f - b1, gr));
    v = __fmaf_rn(b2, v, __fmul_rn(__fmul_rn(1.0f - b2, gr), gr));
    float mhat = m / bc1;
    float vhat = v / bc2;
    float step = __fmaf_rn(wd, w, mhat / __fadd_rn(sqrtf(vhat), eps));
    w = __fmaf_rn(-lr, step, w);
}

// load4/store4: four consecutive elements as one 16-byte (fp32) or 8-byte
// (bf16) access.
__device__ __forceinline__ void load4(const float* p, float (&f)[4]) {
    float4 u = *reinterpret_cast<const float4*>(p);
    f[0] = u.x, f[1] = u.y, f[2] = u.z, f[3] = u.w;
}
__device__ __forceinline__ void load4(const bf16* p, float (&f)[4]) {
    uint2 u = *reinterpret_cast<const uint2*>(p);
    const bf16* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) f[i] = f32(e[i]);
}
__device__ __forceinline__ void store4(float* p, const float (&f)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
}
__device__ __forceinline__ void store4(bf16* p, const float (&f)[4]) {
    uint2 u;
    bf16* e = reinterpret_cast<bf16*>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) e[i] = cvt<bf16>(f[i]);
    *reinterpret_cast<uint2*>(p) = u;
}

// adamw: for every i < n (grid-stride; block 256):
//   g' = g·grad_scale
//   m  = β1·m + (1 − β1)·g'            v = β2·v + (1 − β2)·g'²
//   w  = master ? master : p           (fp32)
//   w -= lr·(m/bc1 / (sqrt(v/bc2) + eps) + wd·w)
//   master = w (when present);  p = round(w)
// bc1 = 1 − β1^step and bc2 = 1 − β2^step come from the host (computed in
// float64). p (n) bf16 or f32; g (n) bf16 or f32; m, v, master (n) fp32;
// master may be null. normsq, when not null, is Σ g² of the whole gradient
// (one fp32, written by sumsq_finish earlier on the stream): the gradient is
// then clipped on the device, grad_scale ·= min(1, clip/(sqrt(normsq)+1e-6))
// (clip ≤ 0: no clipping), and a non-finite normsq skips the update
// entirely, so the host need not read the norm before the update.
template <typename TP, typename TG>
__device__ void adamw_impl(TP* p, const TG* g, float* m, float* v, float* master, long long n, float lr, float b1,
                           float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                           const float* normsq, float clip) {
    if (normsq != nullptr) {
        float ns = *normsq;
        if (!isfinite(ns)) return;
        if (clip > 0.0f) grad_scale *= fminf(1.0f, clip / (sqrtf(ns) + 1e-6f));
    }
    // Four elements per step when every buffer is 16-byte aligned (the flat
    // buffers are): more bytes in flight per thread, 3.9 TB/s at 64 Mi
    // elements against the scalar loop's 3.3 (BenchmarkAdamW on an H200).
    // The rest, or every element of unaligned views, one at a time.
    bool wide = (misalign16(p) | misalign16(g) | misalign16(m) | misalign16(v) |
                 (master != nullptr ? misalign16(master) : 0u)) == 0;
    long long n4 = wide ? n / 4 : 0;
    for (long long j = grid_thread(); j < n4; j += grid_threads()) {
        long long i = 4 * j;
        float gr[4], mi[4], vi[4], w[4];
        load4(g + i, gr);
        load4(m + i, mi);
        load4(v + i, vi);
        if (master != nullptr) load4(master + i, w);
        else load4(p + i, w);
#pragma unroll
        for (int e = 0; e < 4; e++) adamw_elem(gr[e], grad_scale, mi[e], vi[e], w[e], lr, b1, b2, eps, wd, bc1, bc2);
        store4(m + i, mi);
        store4(v + i, vi);
        if (master != nullptr) store4(master + i, w);
        store4(p + i, w);
    }
    for (long long i = 4 * n4 + grid_thread(); i < n; i += grid_threads()) {
        float mi = m[i], vi = v[i];
        float w = master != nullptr ? master[i] : f32(p[i]);
        adamw_elem(f32(g[i]), grad_scale, mi, vi, w, lr, b1, b2, eps, wd, bc1, bc2);
        m[i] = mi;
        v[i] = vi;
        if (master != nullptr) master[i] = w;
        p[i] = cvt<TP>(w);
    }
}

// sumsq_partial: partial[blockIdx.x] = Σ x² (fp64) over this block's share of
// a grid-stride loop. Launch: grid G (the Go side picks G ≤ 1024 and adds the
// G partials on the host, in order), block 256.
template <typename T> __device__ void sumsq_partial_impl(double* partial, const T* x, long long n) {
    __shared__ double scratch[32];
    double acc = 0.0;
    const T* ins[1] = {x};
    vvisit<T, 1>(ins, n, grid_thread(), grid_threads(),
                 [&](long long, const float (&v)[1]) { acc += (double)v[0] * (double)v[0]; });
    acc = block_sum_d(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// sumsq_finish: dst[0] += Σ partial[0..G) (fp64, in order), rounded to fp32
// once. Launch: grid 1, block 1 (G ≤ 1024 values: a few µs, and the order
// is fixed, so the result is the same bits as the host's sum of the same
// partials).
__device__ void sumsq_finish_impl(float* dst, const double* partial, int G) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double acc = 0.0;
    for (int i = 0; i < G; i++) acc += partial[i];
    dst[0] = (float)((double)dst[0] + acc);
}

} // namespace atp

using namespace atp;

// p (n), g (n), m, v, master (n) fp32 (master may be null). Grid-stride,
// block 256.
// normsq (1) fp32 or null.
#define ATP_ADAMW(NAME, TP, TG)                                                                                   \
    KERNEL void NAME(TP* p, const TG* g, float* m, float* v, float* master, long long n, float lr, float b1,      \
                     float b2, float eps, float wd, float bc1, float bc2, float grad_scale, const float* normsq,  \
                     float clip) {                                                                                \
        adamw_impl(p, g, m, v, master, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale, normsq, clip);                \
    }
ATP_ADAMW(adamw_bf16_bf16, bf16, bf16) // p bf16, g bf16
ATP_ADAMW(adamw_bf16_f32, bf16, float) // p bf16, g f32
ATP_ADAMW(adamw_f32_bf16, float, bf16) // p f32, g bf16
ATP_ADAMW(adamw_f32_f32, float, float) // p f32, g f32
#undef ATP_ADAMW

// partial (G) fp64; x (n). Launch: grid G ≤ 1024, block 256.
KERNEL void sumsq_partial_bf16(double* partial, const bf16* x, long long n) { sumsq_partial_impl(partial, x, n); }
KERNEL void sumsq_partial_f32(double* partial, const float* x, long long n) { sumsq_partial_impl(partial, x, n); }

// dst (1) fp32; partial (G) fp64. Launch: grid 1, block 1.
KERNEL void sumsq_finish(float* dst, const double* partial, int G) { sumsq_finish_impl(dst, partial, G); }
