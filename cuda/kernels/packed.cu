// packed.cu: the consumers of fused projections, which read (and write) the
// packed layout one GEMM produces for several weights: RoPE on [q | k | v]
// per token, SwiGLU on [gate | up] per row, and their backwards, which write
// the packed gradient one GEMM takes back to dx and dW.
//
// Same arithmetic as rope_* (attention.cu) and swiglu_* (activation.cu) on
// separate tensors (the fused and unfused layers agree to rounding).
#include "common.cuh"

namespace atp {

// rope_qkv: q (B, T, H, D), k, v (B, T, HKV, D) with HKV ≤ H (grouped-query
// attention; HKV = H for multi-head); qkv (B, T, (H + 2·HKV)·D) = [q | k |
// v] per token; cs (T, D/2, 2) fp32 as for rope. Thread per (token, head h
// < H, pair i): turns the pair (i, i + D/2) of q's head h by t·θ^(−2i/D),
// and when h < HKV, that of k's head h too and copies that pair of v's.
// Grid-stride over tokens·H·D/2; block 256.
template <typename T>
__device__ void rope_qkv_impl(T* q, T* k, T* v, const T* qkv, const float* cs, int Tn, int H, int HKV, int D,
                              long long tokens) {
    int half = D >> 1;
    long long hd = (long long)H * D, kd = (long long)HKV * D, w = hd + 2 * kd;
    long long n = tokens * H * half;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long row = idx / half; // token·H + head
        int i = (int)(idx - row * half);
        long long tok = row / H;
        int h = (int)(row - tok * H);
        int t = (int)(tok % Tn);
        float c = cs[((long long)t * half + i) * 2];
        float s = cs[((long long)t * half + i) * 2 + 1];
        long long src = tok * w + (long long)h * D + i;
        long long dst = row * D + i;
        float q1 = f32(qkv[src]), q2 = f32(qkv[src + half]);
        q[dst] = cvt<T>(q1 * c - q2 * s);
        q[dst + half] = cvt<T>(q2 * c + q1 * s);
        if (h >= HKV) continue;
        long long kdst = (tok * HKV + h) * D + i;
        float k1 = f32(qkv[src + hd]), k2 = f32(qkv[src + hd + half]);
        k[kdst] = cvt<T>(k1 * c - k2 * s);
        k[kdst + half] = cvt<T>(k2 * c + k1 * s);
        v[kdst] = qkv[src + hd + kd];
        v[kdst + half] = qkv[src + hd + kd + half];
    }
}

// rope_qkv_bwd: dqkv (B, T, (H + 2·HKV)·D) = [RoPE⁻¹(dq) | RoPE⁻¹(dk) | dv]
// per token, from dq (B, T, H, D), dk, dv (B, T, HKV, D). Geometry as
// rope_qkv.
template <typename T>
__device__ void rope_qkv_bwd_impl(T* dqkv, const T* dq, const T* dk, const T* dv, const float* cs, int Tn, int H,
                                  int HKV, int D, long long tokens) {
    int half = D >> 1;
    long long hd = (long long)H * D, kd = (long long)HKV * D, w = hd + 2 * kd;
    long long n = tokens * H * half;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long row = idx / half;
        int i = (int)(idx - row * half);
        long long tok = row / H;
        int h = (int)(row - tok * H);
        int t = (int)(tok % Tn);
        float c = cs[((long long)t * half + i) * 2];
        float s = -cs[((long long)t * half + i) * 2 + 1];
        long long dst = tok * w + (long long)h * D + i;
        long long src = row * D + i;
        float q1 = f32(dq[src]), q2 = f32(dq[src + half]);
        dqkv[dst] = cvt<T>(q1 * c - q2 * s);
        dqkv[dst + half] = cvt<T>(q2 * c + q1 * s);
        if (h >= HKV) continue;
        long long ksrc = (tok * HKV + h) * D + i;
        float k1 = f32(dk[ksrc]), k2 = f32(dk[ksrc + half]);
        dqkv[dst + hd] = cvt<T>(k1 * c - k2 * s);
        dqkv[dst + hd + half] = cvt<T>(k2 * c + k1 * s);
        dqkv[dst + hd + kd] = dv[ksrc];
        dqkv[dst + hd + kd + half] = dv[ksrc + half];
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

// ---------------------------------------------------------------------------
// Vectorised variants, taken by the host when the sizes and alignment allow
// (see tensor/cudabackend/packed.go): V = Pack<T>::N elements per 16-byte
// pack (8 bf16, 4 f32), 32-bit index math. Same arithmetic per element as the
// kernels above, so the two agree bit for bit.

// load_cs reads the (cos, sin) of V consecutive pairs from cs (16-byte
// aligned: the pair index is a multiple of V) as V/2 float4.
template <int V> __device__ __forceinline__ void load_cs(const float* p, float (&c)[V], float (&s)[V], float sign) {
    const float4* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int j = 0; j < V / 2; j++) {
        float4 w = p4[j];
        c[2 * j] = w.x;
        s[2 * j] = sign * w.y;
        c[2 * j + 1] = w.z;
        s[2 * j + 1] = sign * w.w;
    }
}

// rope_pack turns V pairs (x1[e], x2[e]) read from a and a + half into out
// and out + half.
template <typename T, int V>
__device__ __forceinline__ void rope_pack(T* out, const T* a, int half, const float (&c)[V], const float (&s)[V]) {
    float x1[V], x2[V], y1[V], y2[V];
    load_pack<T>(a, x1);
    load_pack<T>(a + half, x2);
#pragma unroll
    for (int e = 0; e < V; e++) {
        y1[e] = x1[e] * c[e] - x2[e] * s[e];
        y2[e] = x2[e] * c[e] + x1[e] * s[e];
    }
    store_pack<T>(out, y1);
    store_pack<T>(out + half, y2);
}

__device__ __forceinline__ void copy16(void* dst, const void* src) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}

// rope_qkv_vec: rope_qkv for (D/2) % V == 0, q, k, v, qkv and cs 16-byte
// aligned and tokens·(H + 2·HKV)·D < 2³¹. Thread per V pairs of one (token,
// head): 16-byte loads of both halves of q (and of k and v for a head <
// HKV), the V (cos, sin) pairs as V/2 float4; grid-stride over
// tokens·H·D/(2V) chunks, block 256.
template <typename T>
__device__ void rope_qkv_vec_impl(T* q, T* k, T* v, const T* qkv, const float* cs, int Tn, int H, int HKV, int D,
                                  int tokens) {
    constexpr int V = Pack<T>::N;
    int half = D >> 1, cpr = half / V; // chunks of V pairs per head
    int hd = H * D, kd = HKV * D, w = hd + 2 * kd;
    int n = tokens * H * cpr;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        int row = idx / cpr; // token·H + head
        int i = (idx - row * cpr) * V;
        int tok = row / H;
        int h = row - tok * H;
        int t = tok % Tn;
        float c[V], s[V];
        load_cs<V>(cs + (t * half + i) * 2, c, s, 1.0f);
        int src = tok * w + h * D + i, dst = row * D + i;
        rope_pack<T, V>(q + dst, qkv + src, half, c, s);
        if (h >= HKV) continue;
        int kdst = (tok * HKV + h) * D + i;
        rope_pack<T, V>(k + kdst, qkv + src + hd, half, c, s);
        copy16(v + kdst, qkv + src + hd + kd);
        copy16(v + kdst + half, qkv + src + hd + kd + half);
    }
}

// rope_qkv_bwd_vec: rope_qkv_bwd under the conditions of rope_qkv_vec (on
// dqkv, dq, dk, dv), same geometry.
template <typename T>
__device__ void rope_qkv_bwd_vec_impl(T* dqkv, const T* dq, const T* dk, const T* dv, const float* cs, int Tn, int H,
                                      int HKV, int D, int tokens) {
    constexpr int V = Pack<T>::N;
    int half = D >> 1, cpr = half / V;
    int hd = H * D, kd = HKV * D, w = hd + 2 * kd;
    int n = tokens * H * cpr;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        int row = idx / cpr;
        int i = (idx - row * cpr) * V;
        int tok = row / H;
        int h = row - tok * H;
        int t = tok % Tn;
        float c[V], s[V];
        load_cs<V>(cs + (t * half + i) * 2, c, s, -1.0f);
        int dst = tok * w + h * D + i, src = row * D + i;
        rope_pack<T, V>(dqkv + dst, dq + src, half, c, s);
        if (h >= HKV) continue;
        int ksrc = (tok * HKV + h) * D + i;
        rope_pack<T, V>(dqkv + dst + hd, dk + ksrc, half, c, s);
        copy16(dqkv + dst + hd + kd, dv + ksrc);
        copy16(dqkv + dst + hd + kd + half, dv + ksrc + half);
    }
}

// swiglu_packed_fwd_vec: swiglu_packed_fwd for F % V == 0, out and gu 16-byte
// aligned and rows·2F < 2³¹. Thread per V outputs (a pack of gate, one of up,
// one of out); grid-stride over rows·F/V, block 256.
template <typename T> __device__ void swiglu_packed_fwd_vec_impl(T* out, const T* gu, int rows, int F) {
    constexpr int V = Pack<T>::N;
    int cpr = F / V;
    int n = rows * cpr;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        int r = idx / cpr;
        int j = (idx - r * cpr) * V;
        int o = r * 2 * F + j;
        float g[V], u[V], y[V];
        load_pack<T>(gu + o, g);
        load_pack<T>(gu + o + F, u);
#pragma unroll
        for (int e = 0; e < V; e++) y[e] = g[e] * packed_sigmoid(g[e]) * u[e];
        store_pack<T>(out + idx * V, y);
    }
}

// swiglu_packed_bwd_vec: swiglu_packed_bwd under the conditions of the
// forward's (on dgu, dout, gu), same geometry.
template <typename T> __device__ void swiglu_packed_bwd_vec_impl(T* dgu, const T* dout, const T* gu, int rows, int F) {
    constexpr int V = Pack<T>::N;
    int cpr = F / V;
    int n = rows * cpr;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        int r = idx / cpr;
        int j = (idx - r * cpr) * V;
        int o = r * 2 * F + j;
        float d[V], g[V], u[V], dg[V], du[V];
        load_pack<T>(dout + idx * V, d);
        load_pack<T>(gu + o, g);
        load_pack<T>(gu + o + F, u);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float s = packed_sigmoid(g[e]);
            dg[e] = d[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
            du[e] = d[e] * g[e] * s;
        }
        store_pack<T>(dgu + o, dg);
        store_pack<T>(dgu + o + F, du);
    }
}

} // namespace atp

using namespace atp;

// q (B, T, H, D), k, v (B, T, HKV, D); qkv (B, T, (H + 2·HKV)·D); cs (T,
// D/2, 2); tokens = B·T.
KERNEL void rope_qkv_bf16(bf16* q, bf16* k, bf16* v, const bf16* qkv, const float* cs, int T, int H, int HKV, int D,
                          long long tokens) {
    rope_qkv_impl(q, k, v, qkv, cs, T, H, HKV, D, tokens);
}
KERNEL void rope_qkv_f32(float* q, float* k, float* v, const float* qkv, const float* cs, int T, int H, int HKV, int D,
                         long long tokens) {
    rope_qkv_impl(q, k, v, qkv, cs, T, H, HKV, D, tokens);
}
// dqkv (B, T, (H + 2·HKV)·D); dq (B, T, H, D), dk, dv (B, T, HKV, D); cs
// (T, D/2, 2); tokens = B·T.
KERNEL void rope_qkv_bwd_bf16(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv, const float* cs, int T,
                              int H, int HKV, int D, long long tokens) {
    rope_qkv_bwd_impl(dqkv, dq, dk, dv, cs, T, H, HKV, D, tokens);
}
KERNEL void rope_qkv_bwd_f32(float* dqkv, const float* dq, const float* dk, const float* dv, const float* cs, int T,
                             int H, int HKV, int D, long long tokens) {
    rope_qkv_bwd_impl(dqkv, dq, dk, dv, cs, T, H, HKV, D, tokens);
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

// Vectorised variants (conditions above; the host falls back to the kernels
// before when they do not hold). tokens = B·T and rows in 32 bits.
KERNEL void rope_qkv_vec_bf16(bf16* q, bf16* k, bf16* v, const bf16* qkv, const float* cs, int T, int H, int HKV, int D,
                              int tokens) {
    rope_qkv_vec_impl(q, k, v, qkv, cs, T, H, HKV, D, tokens);
}
KERNEL void rope_qkv_vec_f32(float* q, float* k, float* v, const float* qkv, const float* cs, int T, int H, int HKV, int D,
                             int tokens) {
    rope_qkv_vec_impl(q, k, v, qkv, cs, T, H, HKV, D, tokens);
}
KERNEL void rope_qkv_bwd_vec_bf16(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv, const float* cs, int T,
                                  int H, int HKV, int D, int tokens) {
    rope_qkv_bwd_vec_impl(dqkv, dq, dk, dv, cs, T, H, HKV, D, tokens);
}
KERNEL void rope_qkv_bwd_vec_f32(float* dqkv, const float* dq, const float* dk, const float* dv, const float* cs,
                                 int T, int H, int HKV, int D, int tokens) {
    rope_qkv_bwd_vec_impl(dqkv, dq, dk, dv, cs, T, H, HKV, D, tokens);
}
KERNEL void swiglu_packed_fwd_vec_bf16(bf16* out, const bf16* gu, int rows, int F) {
    swiglu_packed_fwd_vec_impl(out, gu, rows, F);
}
KERNEL void swiglu_packed_fwd_vec_f32(float* out, const float* gu, int rows, int F) {
    swiglu_packed_fwd_vec_impl(out, gu, rows, F);
}
KERNEL void swiglu_packed_bwd_vec_bf16(bf16* dgu, const bf16* dout, const bf16* gu, int rows, int F) {
    swiglu_packed_bwd_vec_impl(dgu, dout, gu, rows, F);
}
KERNEL void swiglu_packed_bwd_vec_f32(float* dgu, const float* dout, const float* gu, int rows, int F) {
    swiglu_packed_bwd_vec_impl(dgu, dout, gu, rows, F);
}
