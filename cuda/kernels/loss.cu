// loss.cu: softmax cross-entropy over the LM head's logits, fused with its
// gradient.
//
//   losses[n]    = logsumexp(logits[n, :]) − logits[n, target[n]]      (fp32)
//   dlogits[n,:] = (softmax(logits[n, :]) − onehot(target[n])) · gradScale
//
// logits, dlogits (N, V); targets (N) int32; losses (N) fp32. A negative
// target ignores its row (loss 0, gradient 0); a target ≥ V is reported
// through err (err[0] |= 1, err[1] = the target) and treated as ignored.
// dlogits may be null (loss only) or equal to logits (in place: every thread
// reads the target's logit before the first barrier, and each element is read
// before it is written by the same thread).
//
// Launch: grid N, block 32..1024 (the Go side uses 512 for large V). Two
// passes over the row: an online max/sum (16-byte packs where the row is
// aligned), then the gradient.
#include "common.cuh"

namespace atp {

template <typename T>
__device__ void cross_entropy_impl(float* losses, T* dlogits, const T* logits, const int* targets, int N, int V,
                                   float grad_scale, int* err) {
    __shared__ float scratch[32];
    long long row = blockIdx.x;
    if (row >= N) return; // uniform over the block
    const T* xr = logits + row * V;
    int tgt = targets[row];
    bool bad = tgt >= V;
    if (bad && threadIdx.x == 0) report_error(err, tgt);
    const T* ins[1] = {xr};
    if (tgt < 0 || bad) {
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (dlogits != nullptr) {
            T* outs[1] = {dlogits + row * V};
            vmap<T, 1, 1>(outs, ins, V, threadIdx.x, blockDim.x,
                          [](long long, const float (&)[1], float (&y)[1]) { y[0] = 0.0f; });
        }
        return;
    }
    float xt = f32(xr[tgt]);
    float m = -INFINITY, s = 0.0f;
    vvisit<T, 1>(ins, V, threadIdx.x, blockDim.x, [&](long long, const float (&v)[1]) {
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
    if (threadIdx.x == 0) losses[row] = M + logf(S) - xt;
    if (dlogits == nullptr) return;
    float inv = 1.0f / S;
    T* outs[1] = {dlogits + row * V};
    vmap<T, 1, 1>(outs, ins, V, threadIdx.x, blockDim.x,
                  [M, inv, tgt, grad_scale](long long i, const float (&v)[1], float (&y)[1]) {
                      float p = expf(v[0] - M) * inv;
                      y[0] = (p - (i == tgt ? 1.0f : 0.0f)) * grad_scale;
                  });
}

// cross_entropy_smem: the same contract for rows that fit in shared memory
// (V·sizeof(T) ≤ the dynamic shared memory the Go side sets, V a multiple of
// the 16-byte pack, rows 16-byte aligned). The row is read from global memory
// once: the first pass copies it into shared memory while it keeps the
// online max/sum, and the gradient pass reads it back from there — 2 bytes
// moved per logit each way instead of 3 (the LM head's logits are the
// largest tensor of a step: 1.6 GB at gpt2-124m, batch 16). Each thread
// reads back only the packs it wrote, so the passes need no barrier beyond
// the block reductions' (which also order every global read before the
// first write when dlogits == logits).
template <typename T>
__device__ void cross_entropy_smem_impl(float* losses, T* dlogits, const T* logits, const int* targets, int N, int V,
                                        float grad_scale, int* err) {
    ATP_DYN_SMEM(uint4, row_s);
    __shared__ float scratch[32];
    constexpr int P = Pack<T>::N;
    long long row = blockIdx.x;
    if (row >= N) return; // uniform over the block
    const uint4* xr = reinterpret_cast<const uint4*>(logits + row * V);
    uint4* dr = dlogits == nullptr ? nullptr : reinterpret_cast<uint4*>(dlogits + row * V);
    int npk = V / P;
    int tgt = targets[row];
    bool bad = tgt >= V;
    if (bad && threadIdx.x == 0) report_error(err, tgt);
    if (tgt < 0 || bad) {
        if (threadIdx.x == 0) losses[row] = 0.0f;
        if (dr != nullptr) {
            float z[P];
#pragma unroll
            for (int j = 0; j < P; j++) z[j] = 0.0f;
            for (int i = threadIdx.x; i < npk; i += blockDim.x) store_pack(reinterpret_cast<T*>(dr + i), z);
        }
        return;
    }
    float xt = f32(logits[row * V + tgt]);
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < npk; i += blockDim.x) {
        uint4 u = xr[i];
        row_s[i] = u;
        float f[P];
        load_pack(reinterpret_cast<const T*>(&u), f);
        float lm = f[0];
#pragma unroll
        for (int j = 1; j < P; j++) lm = fmaxf(lm, f[j]);
        if (lm == -INFINITY) continue; // nothing to add; keeps exp(−inf − −inf) out
        if (lm > m) {
            s *= expf(m - lm); // m = −inf: s is 0 and stays 0
            m = lm;
        }
#pragma unroll
        for (int j = 0; j < P; j++) s += expf(f[j] - m);
    }
    float M = block_max(m, scratch);
    float S = block_sum(m == -INFINITY ? 0.0f : s * expf(m - M), scratch);
    if (threadIdx.x == 0) losses[row] = M + logf(S) - xt;
    if (dr == nullptr) return;
    float inv = 1.0f / S;
    for (int i = threadIdx.x; i < npk; i += blockDim.x) {
        uint4 u = row_s[i];
        float f[P];
        load_pack(reinterpret_cast<const T*>(&u), f);
#pragma unroll
        for (int j = 0; j < P; j++) {
            float p = expf(f[j] - M) * inv;
            f[j] = (p - (i * P + j == tgt ? 1.0f : 0.0f)) * grad_scale;
        }
        store_pack(reinterpret_cast<T*>(dr + i), f);
    }
}

} // namespace atp

using namespace atp;

// losses (N) fp32; dlogits (N, V) or null; logits (N, V); targets (N); err (2) int32.
// Launch: grid N, block 32..1024 (a multiple of 32).
KERNEL void cross_entropy_bf16(float* losses, bf16* dlogits, const bf16* logits, const int* targets, int N, int V,
                               float grad_scale, int* err) {
    cross_entropy_impl(losses, dlogits, logits, targets, N, V, grad_scale, err);
}
KERNEL void cross_entropy_f32(float* losses, float* dlogits, const float* logits, const int* targets, int N, int V,
                              float grad_scale, int* err) {
    cross_entropy_impl(losses, dlogits, logits, targets, N, V, grad_scale, err);
}
// As cross_entropy_*; dynamic shared memory V·sizeof(T) bytes; V a multiple
// of 16 / sizeof(T); logits and dlogits 16-byte aligned.
KERNEL void cross_entropy_smem_bf16(float* losses, bf16* dlogits, const bf16* logits, const int* targets, int N,
                                    int V, float grad_scale, int* err) {
    cross_entropy_smem_impl(losses, dlogits, logits, targets, N, V, grad_scale, err);
}
KERNEL void cross_entropy_smem_f32(float* losses, float* dlogits, const float* logits, const int* targets, int N,
                                   int V, float grad_scale, int* err) {
    cross_entropy_smem_impl(losses, dlogits, logits, targets, N, V, grad_scale, err);
}
