// packed.cu: the consumers of fused projections, which read (and write) the
// packed layout one GEMM produces for several weights: RoPE on [q | k | v]
// per token, SwiGLU on [gate | up] per row, and their backwards, which write
// the packed gradient one GEMM takes back to dx and dW.
//
// Same arithmetic as rope_* (attention.cu) and swiglu_* (activation.cu) on
// separate tensors (the fused and unfused layers agree to rounding).
#include "common.cuh"

namespace atp {

// rope_qkv: q, k, v (B, T, H, D); qkv (B, T, 3·H·D) = [q | k | v] per token;
// cs (T, D/2, 2) fp32 as for rope. Thread per (token, head, pair i): turns
// the pair (i, i + D/2) of q and of k by t·θ^(−2i/D) and copies that pair of
// v. Grid-stride over tokens·H·D/2; block 256.
template <typename T>
__device__ void rope_qkv_impl(T* q, T* k, T* v, const T* qkv, const float* cs, int Tn, int H, int D, long long tokens) {
    int half = D >> 1;
    long long hd = (long long)H * D;
    long long n = tokens * H * half;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long row = idx / half; // token·H + head
        int i = (int)(idx - row * half);
        long long tok = row / H;
        int h = (int)(row - tok * H);
        int t = (int)(tok % Tn);
        float c = cs[((long long)t * half + i) * 2];
        float s = cs[((long long)t * half + i) * 2 + 1];
        long long src = tok * 3 * hd + (long long)h * D + i;
        long long dst = row * D + i;
        float q1 = f32(qkv[src]), q2 = f32(qkv[src + half]);
        q[dst] = cvt<T>(q1 * c - q2 * s);
        q[dst + half] = cvt<T>(q2 * c + q1 * s);
        float k1 = f32(qkv[src + hd]), k2 = f32(qkv[src + hd + half]);
        k[dst] = cvt<T>(k1 * c - k2 * s);
        k[dst + half] = cvt<T>(k2 * c + k1 * s);
        v[dst] = qkv[src + 2 * hd];
        v[dst + half] = qkv[src + 2 * hd + half];
    }
}

// rope_qkv_bwd: dqkv (B, T, 3·H·D) = [RoPE⁻¹(dq) | RoPE⁻¹(dk) | dv] per
// token, from dq, dk, dv (B, T, H, D). Geometry as rope_qkv.
template <typename T>
__device__ void rope_qkv_bwd_impl(T* dqkv, const T* dq, const T* dk, const T* dv, const float* cs, int Tn, int H, int D,
                                  long long tokens) {
    int half = D >> 1;
    long long hd = (long long)H * D;
    long long n = tokens * H * half;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long row = idx / half;
        int i = (int)(idx - row * half);
        long long tok = row / H;
        int h = (int)(row - tok * H);
        int t = (int)(tok % Tn);
        float c = cs[((long long)t * half + i) * 2];
        float s = -cs[((long long)t * half + i) * 2 + 1];
        long long dst = tok * 3 * hd + (long long)h * D + i;
        long long src = row * D + i;
        float q1 = f32(dq[src]), q2 = f32(dq[src + half]);
        dqkv[dst] = cvt<T>(q1 * c - q2 * s);
        dqkv[dst + half] = cvt<T>(q2 * c + q1 * s);
        float k1 = f32(dk[src]), k2 = f32(dk[src + half]);
        dqkv[dst + hd] = cvt<T>(k1 * c - k2 * s);
        dqkv[dst + hd + half] = cvt<T>(k2 * c + k1 * s);
        dqkv[dst + 2 * hd] = dv[src];
        dqkv[dst + 2 * hd + half] = dv[src + half];
    }
}

__device__ __forceinline__ float packed_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// swiglu_packed_fwd: out (N, F) = silu(gate)·up with gu (N, 2F) = [gate | up]
// per row. Thread per output element; grid-stride over N·F; block 256.
template <typename T> __device__ void swiglu_packed_fwd_impl(T* out, const T* gu, long long rows, int F) {
    long long n = rows * F;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long r = idx / F;
        long long j = idx - r * F;
        float g = f32(gu[r * 2 * F + j]), u = f32(gu[r * 2 * F + F + j]);
        out[idx] = cvt<T>(g * packed_sigmoid(g) * u);
    }
}

// swiglu_packed_bwd: dgu (N, 2F) = [dgate | dup] per row, dgate = dout·up·
// σ(g)·(1 + g·(1 − σ(g))), dup = dout·g·σ(g). Geometry as the forward.
template <typename T>
__device__ void swiglu_packed_bwd_impl(T* dgu, const T* dout, const T* gu, long long rows, int F) {
    long long n = rows * F;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long r = idx / F;
        long long j = idx - r * F;
        long long o = r * 2 * F + j;
        float d = f32(dout[idx]), g = f32(gu[o]), u = f32(gu[o + F]);
        float s = packed_sigmoid(g);
        dgu[o] = cvt<T>(d * u * s * (1.0f + g * (1.0f - s)));
        dgu[o + F] = cvt<T>(d * g * s);
    }
}

} // namespace atp

using namespace atp;

// q, k, v (B, T, H, D); qkv (B, T, 3·H·D); cs (T, D/2, 2); tokens = B·T.
KERNEL void rope_qkv_bf16(bf16* q, bf16* k, bf16* v, const bf16* qkv, const float* cs, int T, int H, int D,
                          long long tokens) {
    rope_qkv_impl(q, k, v, qkv, cs, T, H, D, tokens);
}
KERNEL void rope_qkv_f32(float* q, float* k, float* v, const float* qkv, const float* cs, int T, int H, int D,
                         long long tokens) {
    rope_qkv_impl(q, k, v, qkv, cs, T, H, D, tokens);
}
// dqkv (B, T, 3·H·D); dq, dk, dv (B, T, H, D); cs (T, D/2, 2); tokens = B·T.
KERNEL void rope_qkv_bwd_bf16(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv, const float* cs, int T,
                              int H, int D, long long tokens) {
    rope_qkv_bwd_impl(dqkv, dq, dk, dv, cs, T, H, D, tokens);
}
KERNEL void rope_qkv_bwd_f32(float* dqkv, const float* dq, const float* dk, const float* dv, const float* cs, int T,
                             int H, int D, long long tokens) {
    rope_qkv_bwd_impl(dqkv, dq, dk, dv, cs, T, H, D, tokens);
}
// out (N, F); gu (N, 2F).
KERNEL void swiglu_packed_fwd_bf16(bf16* out, const bf16* gu, long long rows, int F) {
    swiglu_packed_fwd_impl(out, gu, rows, F);
}
KERNEL void swiglu_packed_fwd_f32(float* out, const float* gu, long long rows, int F) {
    swiglu_packed_fwd_impl(out, gu, rows, F);
}
// dgu (N, 2F); dout (N, F); gu (N, 2F).
KERNEL void swiglu_packed_bwd_bf16(bf16* dgu, const bf16* dout, const bf16* gu, long long rows, int F) {
    swiglu_packed_bwd_impl(dgu, dout, gu, rows, F);
}
KERNEL void swiglu_packed_bwd_f32(float* dgu, const float* dout, const float* gu, long long rows, int F) {
    swiglu_packed_bwd_impl(dgu, dout, gu, rows, F);
}
