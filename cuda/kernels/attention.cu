// attention.cu: RoPE and causal multi-head attention (fused, flash style) on
// CUDA cores, forward and backward, for any head dim D ≤ 128. The tensor-core
// kernels for bf16 and D ∈ {64, 128} are in attention_fa2.cu and
// attention_wg.cu; these are the general path (f32, other head dims) and the
// reference the fast ones are tested against.
//
// Layouts: q, out, dq, dout (B, T, H, D), element ((b·T + t)·H + h)·D + d;
// k, v, dk, dv (B, T, HKV, D) likewise with HKV heads, HKV dividing H
// (grouped-query attention: query head h reads key/value head h / (H/HKV);
// HKV = H is multi-head attention); lse and delta (B, H, T) fp32, element
// (b·H + h)·T + t. Scores are s = scale·q·kᵀ; position t attends to [0, t];
// lse = log Σ exp(s) (natural log).
//
// Forward (attn_fwd): one block of 128 threads per (32 queries, b·H + h).
// Each query row is owned by a quad of 4 threads; thread p of the quad owns
// dims d = p + 4i (so a warp's shared-memory reads hit 4 consecutive words).
// Key/value tiles of 32 rows are staged in shared memory as fp32; scores of a
// tile are kept in registers, the online softmax rescales the fp32 output
// accumulator once per tile. Nothing of size T×T is stored.
//
// Backward, deterministic without atomics, in three launches:
//   attn_bwd_delta: delta = Σ_d dout·out per row (one warp per row).
//   attn_bwd_dkdv:  one block per (32 keys, b·HKV + kv head) walks the query
//                   tiles at or after its keys of each query head of the
//                   kv head's group in turn, recomputes p = exp(s − lse),
//                   and accumulates dk and dv in registers; each written once.
//   attn_bwd_dq:    one block per (32 queries, b·H + h) walks the key tiles at
//                   or before its queries and accumulates dq in registers.
// The probabilities are recomputed twice (once per pass) instead of adding
// dq into an fp32 buffer with atomics, whose order (and so whose rounding)
// would change from run to run.
#include "common.cuh"

namespace atp {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------
// RoPE. x, out (B, T, H, D); cs (T, D/2, 2) fp32 = (cos, sin) of t·θ^(−2i/D),
// computed by the host in float64. sign = +1: rotate (forward); −1: the
// inverse rotation (backward). Thread per pair (i, i + D/2); grid-stride over
// rows·D/2 with rows = B·T·H; block 256. out may alias x.
template <typename T>
__device__ void rope_impl(T* out, const T* x, const float* cs, int Tn, int H, int D, long long rows, float sign) {
    int half = D >> 1;
    long long n = rows * half;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long row = idx / half;
        int i = (int)(idx - row * half);
        int t = (int)((row / H) % Tn);
        float c = cs[((long long)t * half + i) * 2];
        float s = sign * cs[((long long)t * half + i) * 2 + 1];
        long long o = row * D + i;
        float x1 = f32(x[o]), x2 = f32(x[o + half]);
        out[o] = cvt<T>(x1 * c - x2 * s);
        out[o + half] = cvt<T>(x2 * c + x1 * s);
    }
}

// rope_v8: the same for bf16 with D % 16 == 0, 16-byte aligned x and out and
// rows·D < 2³¹: thread per 8 pairs (16-byte loads of both halves, the 8
// (cos, sin) pairs as four float4), 32-bit index math; grid-stride over
// rows·D/16 chunks, block 256.
__device__ void rope_v8_impl(bf16* out, const bf16* x, const float* cs, int Tn, int H, int D, int rows, float sign) {
    int half = D >> 1, cpr = half >> 3; // chunks of 8 pairs per row
    int n = rows * cpr;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x) {
        int row = idx / cpr;
        int i = (idx - row * cpr) * 8;
        int t = (row / H) % Tn;
        const float4* c4 = reinterpret_cast<const float4*>(cs + (t * half + i) * 2);
        float4 cw[4] = {c4[0], c4[1], c4[2], c4[3]};
        int o = row * D + i;
        uint4 a = *reinterpret_cast<const uint4*>(x + o), b = *reinterpret_cast<const uint4*>(x + o + half);
        uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w}, ra[4], rb[4];
#pragma unroll
        for (int j = 0; j < 4; j++) { // pairs i + 2j and i + 2j + 1: cw[j] = (c, s, c', s')
            float c0 = cw[j].x, s0 = sign * cw[j].y, c1 = cw[j].z, s1 = sign * cw[j].w;
            float x1l = bf16lo(av[j]), x1h = bf16hi(av[j]), x2l = bf16lo(bv[j]), x2h = bf16hi(bv[j]);
            ra[j] = pack_bf16x2(x1l * c0 - x2l * s0, x1h * c1 - x2h * s1);
            rb[j] = pack_bf16x2(x2l * c0 + x1l * s0, x2h * c1 + x1h * s1);
        }
        *reinterpret_cast<uint4*>(out + o) = make_uint4(ra[0], ra[1], ra[2], ra[3]);
        *reinterpret_cast<uint4*>(out + o + half) = make_uint4(rb[0], rb[1], rb[2], rb[3]);
    }
}

// ---------------------------------------------------------------------------
// Attention on CUDA cores.

constexpr int kBR = 32; // query rows per block
constexpr int kBC = 32; // key rows per tile
constexpr int kThreads = 128;
constexpr int kMaxD = 128;

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(ATP_FULL_MASK, v, 1);
    v += __shfl_xor_sync(ATP_FULL_MASK, v, 2);
    return v;
}

// stage_rows copies rows [r0, r0 + 32) of a (B, T, H, D) tensor at (b, h) into
// dst (32, D) fp32, zero past T. All threads of the block take part.
template <typename T>
__device__ __forceinline__ void stage_rows(float* dst, const T* src, int b, int h, int r0, int Tn, int H, int D) {
    for (int idx = threadIdx.x; idx < 32 * D; idx += blockDim.x) {
        int j = idx / D, d = idx - j * D;
        int r = r0 + j;
        dst[idx] = r < Tn ? f32(src[(((long long)b * Tn + r) * H + h) * D + d]) : 0.0f;
    }
}

// DPT: dims per thread, ≥ ceil(D / 4) (8, 16 or 32).
template <typename T, int DPT>
__device__ void attn_fwd_impl(T* out, float* lse, const T* q, const T* k, const T* v, int B, int Tn, int H, int HKV,
                              int D, float scale) {
    __shared__ float Ks[kBC * kMaxD];
    __shared__ float Vs[kBC * kMaxD];
    int bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / (H / HKV); // hk: h's key/value head
    int q0 = blockIdx.x * kBR;
    int tid = threadIdx.x, p = tid & 3;
    int r = q0 + (tid >> 2);
    bool valid = r < Tn;
    int rr = valid ? r : Tn - 1; // rows past T compute on the last row, never write
    const float sl2 = scale * kLog2e;

    float qr[DPT], o[DPT];
    const T* qrow = q + (((long long)b * Tn + rr) * H + h) * D;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = p + 4 * i;
        qr[i] = d < D ? f32(qrow[d]) * sl2 : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int kend = q0 + kBR < Tn ? q0 + kBR : Tn; // keys [0, kend) are needed by this block
    for (int k0 = 0; k0 < kend; k0 += kBC) {
        __syncthreads(); // the previous tile is consumed
        stage_rows(Ks, k, b, hk, k0, Tn, HKV, D);
        stage_rows(Vs, v, b, hk, k0, Tn, HKV, D);
        __syncthreads();
        float s[kBC];
        float mt = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBC; j++) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                int d = p + 4 * i;
                if (d < D) acc += qr[i] * Ks[j * D + d];
            }
            acc = quad_sum(acc);
            s[j] = (k0 + j <= rr) ? acc : -INFINITY;
            mt = fmaxf(mt, s[j]);
        }
        float mn = fmaxf(m, mt); // finite: key 0 ≤ rr is in the first tile
        float corr = exp2f(m - mn);
        l *= corr;
#pragma unroll
        for (int i = 0; i < DPT; i++) o[i] *= corr;
#pragma unroll
        for (int j = 0; j < kBC; j++) {
            float pj = exp2f(s[j] - mn);
            l += pj;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                int d = p + 4 * i;
                if (d < D) o[i] += pj * Vs[j * D + d];
            }
        }
        m = mn;
    }
    if (!valid) return;
    float inv = 1.0f / l;
    T* orow = out + (((long long)b * Tn + r) * H + h) * D;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = p + 4 * i;
        if (d < D) orow[d] = cvt<T>(o[i] * inv);
    }
    if (p == 0) lse[((long long)b * H + h) * Tn + r] = (m + log2f(l)) * kLn2;
}

// delta (B, H, T) = Σ_d dout·out. Launch: grid ceil(B·T·H / 8), block 256
// (one warp per row of (B·T·H, D)).
template <typename T>
__device__ void attn_bwd_delta_impl(float* delta, const T* dout, const T* out, int B, int Tn, int H, int D) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    long long rows = (long long)B * Tn * H;
    if (row >= rows) return;
    const T* ins[2] = {dout + row * D, out + row * D};
    float acc = 0.0f;
    vvisit<T, 2>(ins, D, lane, 32, [&](long long, const float (&x)[2]) { acc += x[0] * x[1]; });
    acc = warp_sum(acc);
    if (lane == 0) {
        int h = (int)(row % H);
        long long bt = row / H;
        int t = (int)(bt % Tn), b = (int)(bt / Tn);
        delta[((long long)b * H + h) * Tn + t] = acc;
    }
}

template <typename T, int DPT>
__device__ void attn_bwd_dkdv_impl(T* dk, T* dv, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                   const float* delta, int B, int Tn, int H, int HKV, int D, float scale) {
    __shared__ float Qs[kBR * kMaxD];
    __shared__ float Gs[kBR * kMaxD];
    __shared__ float Ls[kBR], Ds[kBR];
    int bk = blockIdx.y, b = bk / HKV, hk = bk - b * HKV, G = H / HKV; // query heads hk·G … hk·G + G − 1
    int k0 = blockIdx.x * kBC;
    int tid = threadIdx.x, p = tid & 3;
    int kr = k0 + (tid >> 2);
    bool valid = kr < Tn;
    int kk = valid ? kr : Tn - 1;
    float kreg[DPT], vreg[DPT], dkacc[DPT], dvacc[DPT];
    const T* krow = k + (((long long)b * Tn + kk) * HKV + hk) * D;
    const T* vrow = v + (((long long)b * Tn + kk) * HKV + hk) * D;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = p + 4 * i;
        kreg[i] = d < D ? f32(krow[d]) : 0.0f;
        vreg[i] = d < D ? f32(vrow[d]) : 0.0f;
        dkacc[i] = 0.0f;
        dvacc[i] = 0.0f;
    }
    for (int h = hk * G; h < hk * G + G; h++) { // the group's query heads in order
        const float* lse_bh = lse + ((long long)b * H + h) * Tn;
        const float* delta_bh = delta + ((long long)b * H + h) * Tn;
        for (int q0 = (k0 / kBR) * kBR; q0 < Tn; q0 += kBR) {
            __syncthreads();
            stage_rows(Qs, q, b, h, q0, Tn, H, D);
            stage_rows(Gs, dout, b, h, q0, Tn, H, D);
            if (tid < kBR) {
                int qi = q0 + tid;
                Ls[tid] = qi < Tn ? lse_bh[qi] : 0.0f;
                Ds[tid] = qi < Tn ? delta_bh[qi] : 0.0f;
            }
            __syncthreads();
#pragma unroll 4
            for (int j = 0; j < kBR; j++) {
                int qi = q0 + j;
                float sacc = 0.0f, dpacc = 0.0f;
#pragma unroll
                for (int i = 0; i < DPT; i++) {
                    int d = p + 4 * i;
                    if (d < D) {
                        sacc += Qs[j * D + d] * kreg[i];
                        dpacc += Gs[j * D + d] * vreg[i];
                    }
                }
                sacc = quad_sum(sacc);
                dpacc = quad_sum(dpacc);
                bool live = qi < Tn && qi >= kk;
                float pj = live ? expf(sacc * scale - Ls[j]) : 0.0f;
                float ds = pj * (dpacc - Ds[j]);
#pragma unroll
                for (int i = 0; i < DPT; i++) {
                    int d = p + 4 * i;
                    if (d < D) {
                        dvacc[i] += pj * Gs[j * D + d];
                        dkacc[i] += ds * Qs[j * D + d];
                    }
                }
            }
        }
    }
    if (!valid) return;
    T* dkrow = dk + (((long long)b * Tn + kr) * HKV + hk) * D;
    T* dvrow = dv + (((long long)b * Tn + kr) * HKV + hk) * D;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = p + 4 * i;
        if (d < D) {
            dkrow[d] = cvt<T>(dkacc[i] * scale);
            dvrow[d] = cvt<T>(dvacc[i]);
        }
    }
}

template <typename T, int DPT>
__device__ void attn_bwd_dq_impl(T* dq, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                 const float* delta, int B, int Tn, int H, int HKV, int D, float scale) {
    __shared__ float Ks[kBC * kMaxD];
    __shared__ float Vs[kBC * kMaxD];
    int bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / (H / HKV); // hk: h's key/value head
    int q0 = blockIdx.x * kBR;
    int tid = threadIdx.x, p = tid & 3;
    int r = q0 + (tid >> 2);
    bool valid = r < Tn;
    int rr = valid ? r : Tn - 1;
    float qreg[DPT], greg[DPT], dqacc[DPT];
    const T* qrow = q + (((long long)b * Tn + rr) * H + h) * D;
    const T* grow = dout + (((long long)b * Tn + rr) * H + h) * D;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = p + 4 * i;
        qreg[i] = d < D ? f32(qrow[d]) : 0.0f;
        greg[i] = d < D ? f32(grow[d]) : 0.0f;
        dqacc[i] = 0.0f;
    }
    float L = lse[(long long)bh * Tn + rr];
    float Dl = delta[(long long)bh * Tn + rr];
    int kend = q0 + kBR < Tn ? q0 + kBR : Tn;
    for (int k0 = 0; k0 < kend; k0 += kBC) {
        __syncthreads();
        stage_rows(Ks, k, b, hk, k0, Tn, HKV, D);
        stage_rows(Vs, v, b, hk, k0, Tn, HKV, D);
        __syncthreads();
#pragma unroll 4
        for (int j = 0; j < kBC; j++) {
            float sacc = 0.0f, dpacc = 0.0f;
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                int d = p + 4 * i;
                if (d < D) {
                    sacc += qreg[i] * Ks[j * D + d];
                    dpacc += greg[i] * Vs[j * D + d];
                }
            }
            sacc = quad_sum(sacc);
            dpacc = quad_sum(dpacc);
            float pj = (k0 + j <= rr) ? expf(sacc * scale - L) : 0.0f;
            float ds = pj * (dpacc - Dl);
#pragma unroll
            for (int i = 0; i < DPT; i++) {
                int d = p + 4 * i;
                if (d < D) dqacc[i] += ds * Ks[j * D + d];
            }
        }
    }
    if (!valid) return;
    T* dqrow = dq + (((long long)b * Tn + r) * H + h) * D;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
        int d = p + 4 * i;
        if (d < D) dqrow[d] = cvt<T>(dqacc[i] * scale);
    }
}

} // namespace atp

using namespace atp;

// ---- RoPE: out, x (B, T, H, D); cs (T, D/2, 2); rows = B·T·H ----------------
// Grid-stride over rows·D/2 pairs, block 256.
KERNEL void rope_bf16(bf16* out, const bf16* x, const float* cs, int T, int H, int D, long long rows, float sign) {
    rope_impl(out, x, cs, T, H, D, rows, sign);
}
// bf16, D % 16 == 0, 16-byte aligned, rows·D < 2³¹: 8 pairs per thread.
KERNEL void rope_v8_bf16(bf16* out, const bf16* x, const float* cs, int T, int H, int D, int rows, float sign) {
    rope_v8_impl(out, x, cs, T, H, D, rows, sign);
}
KERNEL void rope_f32(float* out, const float* x, const float* cs, int T, int H, int D, long long rows, float sign) {
    rope_impl(out, x, cs, T, H, D, rows, sign);
}

// ---- forward: grid (ceil(T / 32), B·H), block 128 -----------------------------
// out, q (B, T, H, D); k, v (B, T, HKV, D); lse (B, H, T) fp32. Suffix _dN:
// D ≤ N.
#define ATP_ATTN_FWD(NAME, TY, DPT)                                                                               \
    KERNEL void NAME(TY* out, float* lse, const TY* q, const TY* k, const TY* v, int B, int T, int H, int HKV,   \
                     int D, float scale) {                                                                       \
        attn_fwd_impl<TY, DPT>(out, lse, q, k, v, B, T, H, HKV, D, scale);                                       \
    }
ATP_ATTN_FWD(attn_fwd_d32_bf16, bf16, 8)
ATP_ATTN_FWD(attn_fwd_d64_bf16, bf16, 16)
ATP_ATTN_FWD(attn_fwd_d128_bf16, bf16, 32)
ATP_ATTN_FWD(attn_fwd_d32_f32, float, 8)
ATP_ATTN_FWD(attn_fwd_d64_f32, float, 16)
ATP_ATTN_FWD(attn_fwd_d128_f32, float, 32)
#undef ATP_ATTN_FWD

// ---- backward, 1: delta (B, H, T); dout, out (B, T, H, D) ----------------------
// Launch: grid ceil(B·T·H / 8), block 256.
KERNEL void attn_bwd_delta_bf16(float* delta, const bf16* dout, const bf16* out, int B, int T, int H, int D) {
    attn_bwd_delta_impl(delta, dout, out, B, T, H, D);
}
KERNEL void attn_bwd_delta_f32(float* delta, const float* dout, const float* out, int B, int T, int H, int D) {
    attn_bwd_delta_impl(delta, dout, out, B, T, H, D);
}

// ---- backward, 2: dk, dv (B, T, HKV, D); grid (ceil(T / 32), B·HKV), block 128 -----
#define ATP_ATTN_DKDV(NAME, TY, DPT)                                                                              \
    KERNEL void NAME(TY* dk, TY* dv, const TY* q, const TY* k, const TY* v, const TY* dout, const float* lse,    \
                     const float* delta, int B, int T, int H, int HKV, int D, float scale) {                     \
        attn_bwd_dkdv_impl<TY, DPT>(dk, dv, q, k, v, dout, lse, delta, B, T, H, HKV, D, scale);                  \
    }
ATP_ATTN_DKDV(attn_bwd_dkdv_d32_bf16, bf16, 8)
ATP_ATTN_DKDV(attn_bwd_dkdv_d64_bf16, bf16, 16)
ATP_ATTN_DKDV(attn_bwd_dkdv_d128_bf16, bf16, 32)
ATP_ATTN_DKDV(attn_bwd_dkdv_d32_f32, float, 8)
ATP_ATTN_DKDV(attn_bwd_dkdv_d64_f32, float, 16)
ATP_ATTN_DKDV(attn_bwd_dkdv_d128_f32, float, 32)
#undef ATP_ATTN_DKDV

// ---- backward, 3: dq; grid (ceil(T / 32), B·H), block 128 -------------------------
#define ATP_ATTN_DQ(NAME, TY, DPT)                                                                                \
    KERNEL void NAME(TY* dq, const TY* q, const TY* k, const TY* v, const TY* dout, const float* lse,            \
                     const float* delta, int B, int T, int H, int HKV, int D, float scale) {                     \
        attn_bwd_dq_impl<TY, DPT>(dq, q, k, v, dout, lse, delta, B, T, H, HKV, D, scale);                        \
    }
ATP_ATTN_DQ(attn_bwd_dq_d32_bf16, bf16, 8)
ATP_ATTN_DQ(attn_bwd_dq_d64_bf16, bf16, 16)
ATP_ATTN_DQ(attn_bwd_dq_d128_bf16, bf16, 32)
ATP_ATTN_DQ(attn_bwd_dq_d32_f32, float, 8)
ATP_ATTN_DQ(attn_bwd_dq_d64_f32, float, 16)
ATP_ATTN_DQ(attn_bwd_dq_d128_f32, float, 32)
#undef ATP_ATTN_DQ
