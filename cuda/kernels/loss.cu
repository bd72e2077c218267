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
