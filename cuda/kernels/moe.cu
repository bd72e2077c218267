// moe.cu: the ops of mixture-of-experts layers (tensor.MoEOps): router
// top-k, log-sum-exp (z-loss), gathering token rows into expert-contiguous
// order, combining expert outputs back weighted by the gates, their
// backwards; and the routing plan (expert-contiguous positions) on the GPU.
//
// Shapes (N tokens, K choices, E experts, C features, M expert rows):
//   x (N, E) router probabilities or logits; vals, idx (N, K);
//   src (R, C) token rows, dst (M, C) gathered rows, idx (M);
//   out (N, C), src (M, C), pos (N, K) the expert row of each slot (−1 dropped),
//   weights (N, K) or null.
// Index errors (an index ≥ its range, a duplicate row in pos) are reported
// through err (common.cuh) and the offending entries skipped.
//
// All kernels are one warp per row (block 256 = 8 rows; grid ceil(rows/8)),
// fp32 accumulation in a fixed order, no float atomics.
#include "common.cuh"

namespace atp {

// ---- TopK -------------------------------------------------------------------
// vals, idx (N, K): the K largest of each row of x (N, E), largest first,
// ties to the lower column; normalize divides vals by their sum. Pass j takes
// the warp-wide best of the elements that come after pass j−1's choice in
// the order (value descending, column ascending).
template <typename T>
__device__ void topk_impl(T* vals, int* idx, const T* x, int N, int E, int K, int normalize) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* xr = x + row * E;
    float pv = INFINITY;
    int pc = -1;
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        float bv = -INFINITY;
        int bc = -1;
        for (int c = lane; c < E; c += 32) {
            float v = f32(xr[c]);
            bool after = v < pv || (v == pv && c > pc);
            if (after && (bc < 0 || v > bv)) { // columns increase: a tie keeps the lower
                bv = v;
                bc = c;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(ATP_FULL_MASK, bv, o);
            int oc = __shfl_xor_sync(ATP_FULL_MASK, bc, o);
            if (oc >= 0 && (bc < 0 || ov > bv || (ov == bv && oc < bc))) {
                bv = ov;
                bc = oc;
            }
        }
        pv = bv;
        pc = bc;
        sum += bv;
        if (lane == 0) {
            vals[row * K + j] = cvt<T>(bv);
            idx[row * K + j] = bc;
        }
    }
    if (normalize) {
        __syncwarp();
        float inv = 1.0f / sum;
        for (int j = lane; j < K; j += 32) vals[row * K + j] = cvt<T>(f32(vals[row * K + j]) * inv);
    }
}

// dx (N, E), overwritten: zero except the selected columns, dx[n, idx[n, j]]
// += g_j with g_j = dvals[n, j], or with normalize (dvals[j] − Σ_i
// dvals[i]·vals[i]) / Σ_i x[n, idx[n, i]]. Negative idx are skipped, idx ≥ E
// flagged.
template <typename T>
__device__ void topk_bwd_impl(T* dx, const T* dvals, const T* vals, const int* idx, const T* x, int N, int E, int K,
                              int normalize, int* err) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const int* ir = idx + row * K;
    const T* dv = dvals + row * K;
    const T* vr = vals + row * K;
    const T* xr = x + row * E;
    float dot = 0.0f, sum = 0.0f;
    if (normalize) {
        for (int j = 0; j < K; j++) {
            int c = ir[j];
            if (c < 0 || c >= E) continue;
            sum += f32(xr[c]);
            dot += f32(dv[j]) * f32(vr[j]);
        }
    }
    if (lane == 0)
        for (int j = 0; j < K; j++)
            if (ir[j] >= E) report_error(err, ir[j]);
    for (int c = lane; c < E; c += 32) {
        float g = 0.0f;
        for (int j = 0; j < K; j++)
            if (ir[j] == c) g += normalize ? (f32(dv[j]) - dot) / sum : f32(dv[j]);
        dx[row * E + c] = cvt<T>(g);
    }
}

// ---- LogSumExp ----------------------------------------------------------------
// lse (N) fp32 = log Σ_e exp(x[n, e]), max-subtracted.
template <typename T> __device__ void logsumexp_impl(float* lse, const T* x, int N, int E) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    const T* ins[1] = {x + row * E};
    float m = -INFINITY;
    vvisit<T, 1>(ins, E, lane, 32, [&](long long, const float (&v)[1]) { m = fmaxf(m, v[0]); });
    m = warp_max(m);
    float s = 0.0f;
    vvisit<T, 1>(ins, E, lane, 32, [&](long long, const float (&v)[1]) { s += expf(v[0] - m); });
    s = warp_sum(s);
    if (lane == 0) lse[row] = m + logf(s);
}

// dx (N, E) = dlse[n]·exp(x[n, e] − lse[n]); dlse, lse (N) fp32.
template <typename T>
__device__ void logsumexp_bwd_impl(T* dx, const float* dlse, const T* x, const float* lse, int N, int E) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    float d = dlse[row], l = lse[row];
    T* outs[1] = {dx + row * E};
    const T* ins[1] = {x + row * E};
    vmap<T, 1, 1>(outs, ins, E, lane, 32,
                  [d, l](long long, const float (&v)[1], float (&y)[1]) { y[0] = d * expf(v[0] - l); });
}

// ---- GatherRows -----------------------------------------------------------------
// dst[i, :] = scale[i]·src[idx[i], :] for dst (M, C), src (R, C), idx (M),
// scale (M) or null (1). idx < 0: a zero row; idx ≥ R: flagged, zero row.
template <typename T>
__device__ void gather_rows_impl(T* dst, const T* src, const int* idx, const T* scale, int M, int R, int C,
                                 int* err) {
    int lane = threadIdx.x & 31;
    long long i = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (i >= M) return;
    int r = idx[i];
    T* outs[1] = {dst + i * C};
    if (r < 0 || r >= R) {
        if (r >= R && lane == 0) report_error(err, r);
        for (int c = lane; c < C; c += 32) outs[0][c] = cvt<T>(0.0f);
        return;
    }
    float s = scale != nullptr ? f32(scale[i]) : 1.0f;
    const T* ins[1] = {src + (long long)r * C};
    vmap<T, 1, 1>(outs, ins, C, lane, 32, [s](long long, const float (&v)[1], float (&y)[1]) { y[0] = s * v[0]; });
}

// ---- CombineRows ----------------------------------------------------------------
// out[n, :] = Σ_j weights[n, j]·src[pos[n, j], :] (j in order, fp32) for out
// (N, C), src (M, C), pos (N, K), weights (N, K) or null (1). pos < 0
// skipped; pos ≥ M flagged and skipped.
template <typename T>
__device__ void combine_rows_impl(T* out, const T* src, const int* pos, const T* w, int N, int K, int M, int C,
                                  int* err) {
    int lane = threadIdx.x & 31;
    long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const int* pr = pos + n * K;
    if (lane == 0)
        for (int j = 0; j < K; j++)
            if (pr[j] >= M) report_error(err, pr[j]);
    for (int c = lane; c < C; c += 32) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int p = pr[j];
            if (p < 0 || p >= M) continue;
            float wt = w != nullptr ? f32(w[n * K + j]) : 1.0f;
            acc += wt * f32(src[(long long)p * C + c]);
        }
        out[n * C + c] = cvt<T>(acc);
    }
}

// CombineRows' backward, one warp per slot (n, j) (grid ceil(N·K / 8)):
// dsrc[pos[n, j], :] = weights[n, j]·dout[n, :] and dweights[n, j] =
// ⟨dout[n, :], src[pos[n, j], :]⟩ (0 for a skipped slot; dweights may be
// null). Rows of dsrc no slot refers to are left as they are (the Go side
// zeroes dsrc first). claim (M) int32, zeroed by the caller, detects two
// slots with one row (flagged; their writes would race).
template <typename T>
__device__ void combine_rows_bwd_impl(T* dsrc, T* dw, const T* dout, const T* src, const int* pos, const T* w, int N,
                                      int K, int M, int C, int* claim, int* err) {
    int lane = threadIdx.x & 31;
    long long s = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (s >= (long long)N * K) return;
    long long n = s / K;
    int p = pos[s];
    if (p < 0 || p >= M) {
        if (lane == 0) {
            if (p >= M) report_error(err, p);
            if (dw != nullptr) dw[s] = cvt<T>(0.0f);
        }
        return;
    }
    int dup = 0;
    if (lane == 0) dup = atomicAdd(claim + p, 1) != 0;
    dup = __shfl_sync(ATP_FULL_MASK, dup, 0);
    if (dup) {
        if (lane == 0) report_error(err, p);
        return;
    }
    float wt = w != nullptr ? f32(w[s]) : 1.0f;
    T* outs[1] = {dsrc + (long long)p * C};
    const T* ins[2] = {dout + n * C, src + (long long)p * C};
    float dot = 0.0f;
    vmap<T, 2, 1>(outs, ins, C, lane, 32, [&](long long, const float (&v)[2], float (&y)[1]) {
        y[0] = wt * v[0];
        dot += v[0] * v[1];
    });
    dot = warp_sum(dot);
    if (lane == 0 && dw != nullptr) dw[s] = cvt<T>(dot);
}

} // namespace atp

using namespace atp;

// ---- TopK: vals, idx (N, K); x (N, E) -------------------------------------------------
KERNEL void topk_bf16(bf16* vals, int* idx, const bf16* x, int N, int E, int K, int normalize) {
    topk_impl(vals, idx, x, N, E, K, normalize);
}
KERNEL void topk_f32(float* vals, int* idx, const float* x, int N, int E, int K, int normalize) {
    topk_impl(vals, idx, x, N, E, K, normalize);
}
// dx (N, E); dvals, vals, idx (N, K); x (N, E)
KERNEL void topk_bwd_bf16(bf16* dx, const bf16* dvals, const bf16* vals, const int* idx, const bf16* x, int N, int E,
                          int K, int normalize, int* err) {
    topk_bwd_impl(dx, dvals, vals, idx, x, N, E, K, normalize, err);
}
KERNEL void topk_bwd_f32(float* dx, const float* dvals, const float* vals, const int* idx, const float* x, int N,
                         int E, int K, int normalize, int* err) {
    topk_bwd_impl(dx, dvals, vals, idx, x, N, E, K, normalize, err);
}

// ---- LogSumExp: lse (N) fp32; x (N, E) ---------------------------------------------------
KERNEL void logsumexp_bf16(float* lse, const bf16* x, int N, int E) { logsumexp_impl(lse, x, N, E); }
KERNEL void logsumexp_f32(float* lse, const float* x, int N, int E) { logsumexp_impl(lse, x, N, E); }
// dx, x (N, E); dlse, lse (N) fp32
KERNEL void logsumexp_bwd_bf16(bf16* dx, const float* dlse, const bf16* x, const float* lse, int N, int E) {
    logsumexp_bwd_impl(dx, dlse, x, lse, N, E);
}
KERNEL void logsumexp_bwd_f32(float* dx, const float* dlse, const float* x, const float* lse, int N, int E) {
    logsumexp_bwd_impl(dx, dlse, x, lse, N, E);
}

// ---- GatherRows: dst (M, C); src (R, C); idx (M); scale (M) or null --------------------
KERNEL void gather_rows_bf16(bf16* dst, const bf16* src, const int* idx, const bf16* scale, int M, int R, int C,
                             int* err) {
    gather_rows_impl(dst, src, idx, scale, M, R, C, err);
}
KERNEL void gather_rows_f32(float* dst, const float* src, const int* idx, const float* scale, int M, int R, int C,
                            int* err) {
    gather_rows_impl(dst, src, idx, scale, M, R, C, err);
}

// ---- CombineRows: out (N, C); src (M, C); pos, weights (N, K) -------------------------
KERNEL void combine_rows_bf16(bf16* out, const bf16* src, const int* pos, const bf16* w, int N, int K, int M, int C,
                              int* err) {
    combine_rows_impl(out, src, pos, w, N, K, M, C, err);
}
KERNEL void combine_rows_f32(float* out, const float* src, const int* pos, const float* w, int N, int K, int M, int C,
                             int* err) {
    combine_rows_impl(out, src, pos, w, N, K, M, C, err);
}
// dsrc (M, C); dw (N, K) or null; dout (N, C); src (M, C); pos, w (N, K); claim (M)
KERNEL void combine_rows_bwd_bf16(bf16* dsrc, bf16* dw, const bf16* dout, const bf16* src, const int* pos,
                                  const bf16* w, int N, int K, int M, int C, int* claim, int* err) {
    combine_rows_bwd_impl(dsrc, dw, dout, src, pos, w, N, K, M, C, claim, err);
}
KERNEL void combine_rows_bwd_f32(float* dsrc, float* dw, const float* dout, const float* src, const int* pos,
                                 const float* w, int N, int K, int M, int C, int* claim, int* err) {
    combine_rows_bwd_impl(dsrc, dw, dout, src, pos, w, N, K, M, C, claim, err);
}

// ---- Routing plan ------------------------------------------------------------------------
// The device version of layers.NewRoutingPlan (without `used`): idx (N, K)
// expert choices → for each expert its routed and kept counts, the
// expert-contiguous rows of the kept slots in slot order s = n·K + j (rows of
// expert e: [offsets[e], offsets[e+1])), pos (N, K) the row of each slot or
// −1 when dropped (capacity > 0 keeps the first `capacity` slots of each
// expert), tok (N·K) the token of each row (−1 past the last row).
//
// moe_count: routed (E), kept (E). Launch: grid E, block 256 (block e counts
// expert e; integer sums, no atomics).
KERNEL void moe_count(int* routed, int* kept, const int* idx, int NK, int E, int capacity) {
    __shared__ int warp_tot[32];
    int e = blockIdx.x;
    int c = 0;
    for (int i = threadIdx.x; i < NK; i += blockDim.x) c += idx[i] == e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(ATP_FULL_MASK, c, o);
    if ((threadIdx.x & 31) == 0) warp_tot[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += warp_tot[w];
        routed[e] = t;
        kept[e] = capacity > 0 && t > capacity ? capacity : t;
    }
}

// moe_index: tok (N·K), pos (N, K), offsets (E + 1) from kept (E) and idx
// (N, K). Launch: grid E, block 256: block e walks the slots in order (a
// block-wide ordered compaction per chunk of 256), so rows are stable in
// token order. Block 0 also sets pos = −1 and flags err for a choice outside
// [0, E) or an expert chosen twice by one token, and sets tok = −1 past the
// last row.
KERNEL void moe_index(int* tok, int* pos, int* offsets, const int* kept, const int* idx, int N, int K, int E,
                      int capacity, int* err) {
    __shared__ int warp_tot[32];
    __shared__ int base_s, total_s;
    int e = blockIdx.x;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
    if (tid == 0) {
        int off = 0, all = 0;
        for (int j = 0; j < E; j++) {
            if (j < e) off += kept[j];
            all += kept[j];
        }
        offsets[e] = off;
        if (e == E - 1) offsets[E] = all;
        base_s = off;
        total_s = all;
    }
    __syncthreads();
    int NK = N * K;
    int lim = base_s + (capacity > 0 ? capacity : NK); // rows past lim are dropped
    int end = base_s + kept[e];
    if (e == 0)
        for (int i = total_s + tid; i < NK; i += blockDim.x) tok[i] = -1;
    for (int i0 = 0; i0 < NK; i0 += blockDim.x) {
        int i = i0 + tid;
        int ex = i < NK ? idx[i] : -1;
        if (e == 0 && i < NK) {
            bool bad = ex < 0 || ex >= E;
            for (int j = i - i % K; j < i && !bad; j++) bad = idx[j] == ex;
            if (bad) {
                pos[i] = -1;
                report_error(err, ex);
            }
        }
        bool mine = ex == e;
        if (mine) // a repeated choice is dropped (and flagged by block 0)
            for (int j = i - i % K; j < i; j++) mine = mine && idx[j] != ex;
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
            int row = base + before + before_in_warp;
            if (row < lim && row < end) {
                tok[row] = i / K;
                pos[i] = row;
            } else {
                pos[i] = -1;
            }
        }
        __syncthreads();
        if (tid == 0) base_s = base + all;
        __syncthreads();
    }
}
