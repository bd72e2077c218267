// moe.cu: routing index, permute (gather tokens into expert-contiguous order)
// and unpermute (scatter back, weighted by gate values), with backward.
//
// Shapes: x, dx, y, dy (N, C) token rows; expert_ids, gates, slots (N, K)
// (top-k choice per token; gates fp32); permuted rows xp, eout (M, C) with
// M = N·K; src_rows (M); counts (E); offsets (E + 1).
//
// Routing (stable, deterministic, no float atomics):
//   moe_count:  counts[e] = #{(n, k) : expert_ids[n, k] = e}.
//   moe_index:  offsets = exclusive prefix sum of counts, offsets[E] = routed
//               total; the entries of expert e take slots offsets[e] ... in
//               (n, k) order: src_rows[slot] = n, slots[n, k] = slot. An entry
//               whose expert is outside [0, E) is dropped: slots[n, k] = −1.
// Data movement:
//   moe_permute:        xp[s] = x[src_rows[s]] for s < offsets[E]; rows
//                       [offsets[E], M) are zeroed.
//   moe_permute_bwd:    dx[n] = Σ_k dxp[slots[n, k]] (k in order, fp32).
//   moe_unpermute:      y[n] = Σ_k gates[n, k]·eout[slots[n, k]] (fp32).
//   moe_unpermute_bwd:  deout[slots[n, k]] = gates[n, k]·dy[n];
//                       dgates[n, k] = dy[n]·eout[slots[n, k]] (0 if dropped).
//                       Rows of deout that no entry owns are not written.
#include "common.cuh"

namespace atp {

// Launch: grid ceil(N / 8), block 256 (one warp per token row).
template <typename T>
__device__ void moe_permute_impl(T* xp, const T* x, const int* src_rows, const int* total, int M, int C) {
    int lane = threadIdx.x & 31;
    long long s = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (s >= M) return;
    T* outs[1] = {xp + s * C};
    if (s >= *total) {
        for (int c = lane; c < C; c += 32) outs[0][c] = cvt<T>(0.0f);
        return;
    }
    const T* ins[1] = {x + (long long)src_rows[s] * C};
    vmap<T, 1, 1>(outs, ins, C, lane, 32, [](long long, const float (&v)[1], float (&y)[1]) { y[0] = v[0]; });
}

template <typename T>
__device__ void moe_permute_bwd_impl(T* dx, const T* dxp, const int* slots, int N, int K, int C) {
    int lane = threadIdx.x & 31;
    long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int* sl = slots + n * K;
    for (int c = lane; c < C; c += 32) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            int s = sl[k];
            if (s >= 0) acc += f32(dxp[(long long)s * C + c]);
        }
        dx[n * C + c] = cvt<T>(acc);
    }
}

template <typename T>
__device__ void moe_unpermute_impl(T* y, const T* eout, const int* slots, const float* gates, int N, int K, int C) {
    int lane = threadIdx.x & 31;
    long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int* sl = slots + n * K;
    const float* g = gates + n * K;
    for (int c = lane; c < C; c += 32) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) {
            int s = sl[k];
            if (s >= 0) acc += g[k] * f32(eout[(long long)s * C + c]);
        }
        y[n * C + c] = cvt<T>(acc);
    }
}

// Launch: grid ceil(N·K / 8), block 256 (one warp per (n, k) entry).
template <typename T>
__device__ void moe_unpermute_bwd_impl(T* deout, float* dgates, const T* dy, const T* eout, const int* slots,
                                       const float* gates, int N, int K, int C) {
    int lane = threadIdx.x & 31;
    long long e = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (e >= (long long)N * K) return;
    long long n = e / K;
    int s = slots[e];
    if (s < 0) {
        if (lane == 0) dgates[e] = 0.0f;
        return;
    }
    float g = gates[e];
    T* outs[1] = {deout + (long long)s * C};
    const T* ins[2] = {dy + n * C, eout + (long long)s * C};
    float dot = 0.0f;
    vmap<T, 2, 1>(outs, ins, C, lane, 32, [&](long long, const float (&v)[2], float (&r)[1]) {
        dot += v[0] * v[1];
        r[0] = g * v[0];
    });
    dot = warp_sum(dot);
    if (lane == 0) dgates[e] = dot;
}

} // namespace atp

using namespace atp;

// counts (E); expert_ids (NK). Launch: grid E, block 256.
KERNEL void moe_count(int* counts, const int* expert_ids, int NK, int E) {
    __shared__ int warp_tot[32];
    int e = blockIdx.x;
    int c = 0;
    for (int i = threadIdx.x; i < NK; i += blockDim.x) c += expert_ids[i] == e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(ATP_FULL_MASK, c, o);
    if ((threadIdx.x & 31) == 0) warp_tot[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += warp_tot[w];
        counts[e] = t;
    }
}

// src_rows (N·K), slots (N·K), offsets (E + 1); counts (E) from moe_count;
// expert_ids (N, K). Launch: grid E, block 256.
KERNEL void moe_index(int* src_rows, int* slots, int* offsets, const int* counts, const int* expert_ids, int N, int K,
                      int E) {
    __shared__ int warp_tot[32];
    __shared__ int base_s;
    int e = blockIdx.x;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
    if (tid == 0) {
        int off = 0;
        for (int j = 0; j < e; j++) off += counts[j];
        offsets[e] = off;
        if (e == E - 1) offsets[E] = off + counts[e];
        base_s = off;
    }
    __syncthreads();
    int NK = N * K;
    for (int i0 = 0; i0 < NK; i0 += blockDim.x) {
        int i = i0 + tid;
        int ex = i < NK ? expert_ids[i] : -1;
        if (e == 0 && i < NK && (ex < 0 || ex >= E)) slots[i] = -1; // dropped
        bool mine = ex == e;
        unsigned bal = __ballot_sync(ATP_FULL_MASK, mine);
        int before_in_warp = __popc(bal & ((1u << lane) - 1u));
        if (lane == 0) warp_tot[wid] = __popc(bal);
        __syncthreads();
        int before = 0, all = 0;
        for (int w = 0; w < nw; w++) {
            int t = warp_tot[w];
            if (w < wid) before += t;
            all += t;
        }
        int base = base_s;
        if (mine) {
            int slot = base + before + before_in_warp;
            src_rows[slot] = i / K;
            slots[i] = slot;
        }
        __syncthreads();
        if (tid == 0) base_s = base + all;
        __syncthreads();
    }
}

// xp (M, C); x (N, C); src_rows (M); total = offsets + E (1).
KERNEL void moe_permute_bf16(bf16* xp, const bf16* x, const int* src_rows, const int* total, int M, int C) {
    moe_permute_impl(xp, x, src_rows, total, M, C);
}
KERNEL void moe_permute_f32(float* xp, const float* x, const int* src_rows, const int* total, int M, int C) {
    moe_permute_impl(xp, x, src_rows, total, M, C);
}
// dx (N, C); dxp (M, C); slots (N, K). grid ceil(N / 8), block 256.
KERNEL void moe_permute_bwd_bf16(bf16* dx, const bf16* dxp, const int* slots, int N, int K, int C) {
    moe_permute_bwd_impl(dx, dxp, slots, N, K, C);
}
KERNEL void moe_permute_bwd_f32(float* dx, const float* dxp, const int* slots, int N, int K, int C) {
    moe_permute_bwd_impl(dx, dxp, slots, N, K, C);
}
// y (N, C); eout (M, C); slots, gates (N, K). grid ceil(N / 8), block 256.
KERNEL void moe_unpermute_bf16(bf16* y, const bf16* eout, const int* slots, const float* gates, int N, int K, int C) {
    moe_unpermute_impl(y, eout, slots, gates, N, K, C);
}
KERNEL void moe_unpermute_f32(float* y, const float* eout, const int* slots, const float* gates, int N, int K,
                              int C) {
    moe_unpermute_impl(y, eout, slots, gates, N, K, C);
}
// deout (M, C); dgates (N, K); dy (N, C); eout (M, C); slots, gates (N, K).
KERNEL void moe_unpermute_bwd_bf16(bf16* deout, float* dgates, const bf16* dy, const bf16* eout, const int* slots,
                                   const float* gates, int N, int K, int C) {
    moe_unpermute_bwd_impl(deout, dgates, dy, eout, slots, gates, N, K, C);
}
KERNEL void moe_unpermute_bwd_f32(float* deout, float* dgates, const float* dy, const float* eout, const int* slots,
                                  const float* gates, int N, int K, int C) {
    moe_unpermute_bwd_impl(deout, dgates, dy, eout, slots, gates, N, K, C);
}
