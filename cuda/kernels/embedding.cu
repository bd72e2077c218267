// embedding.cu: token embedding lookup and its deterministic backward.
//
// Forward: out[n, :] = table[ids[n], :]; ids (N) int32, table (V, C),
// out (N, C). An id outside [0, V) is reported through err and gives a row of
// zeros.
//
// Backward: dtable[v, :] += Σ dout[n, :] over the tokens n with ids[n] = v,
// summed in fp32 in increasing n and rounded once. Deterministic without
// sorting libraries or float atomics, in six launches over scratch int32
// buffers (counts and offsets of V + 1, bucket and sorted of N):
//   1. emb_count:   counts[v] = #tokens with id v (integer atomics: exact).
//   2. emb_scan:    offsets = exclusive prefix sum of counts (one block).
//   3. emb_scatter: bucket[offsets[v] ..] = the tokens of v, in any order
//                   (atomic cursor; counts returns to 0).
//   4. emb_rank:    sorted[offsets[v] + rank] = n, where rank = #tokens of
//                   v before n: the bucket in increasing n, whatever order
//                   step 3 produced (O(Σ count²) compares).
//   5. embedding_bwd: one block per chunk of S rows of a bucket sums them in
//                   order (into dtable when the bucket is one chunk);
//   6. embedding_bwd_merge: one block per bucket of several chunks adds the
//                   chunk sums in order. The sum's order is fixed by N, S and
//                   the ids alone: the same bits every run.
#include "common.cuh"

namespace atp {

// Launch: grid ceil(N / 8), block 256 (one warp per row).
template <typename T>
__device__ void embedding_fwd_impl(T* out, const T* table, const int* ids, int N, int C, int V, int* err) {
    int lane = threadIdx.x & 31;
    long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= N) return;
    int id = ids[row];
    T* outs[1] = {out + row * C};
    if (id < 0 || id >= V) {
        if (lane == 0) report_error(err, id);
        for (int c = lane; c < C; c += 32) outs[0][c] = cvt<T>(0.0f);
        return;
    }
    const T* ins[1] = {table + (long long)id * C};
    vmap<T, 1, 1>(outs, ins, C, lane, 32, [](long long, const float (&x)[1], float (&y)[1]) { y[0] = x[0]; });
}

// Launch: grid (N, ceil(C / 1024)), block 256. Block p works only if sorted
// position p starts a chunk of its bucket: p − offsets[id] a multiple of S.
// It sums the chunk's rows [p, min(p + S, end of bucket)) in order; a bucket
// of one chunk is added into dtable here, a longer one leaves each chunk's
// fp32 sum in partial[p, :] for embedding_bwd_merge. Chunks keep a frequent
// id (a space in a byte corpus: thousands of rows) from being summed by one
// block while the others idle. Each thread owns 4 columns c = 1024·blockIdx.y
// + threadIdx.x + 256·k.
template <typename T>
__device__ void embedding_bwd_impl(T* dtable, float* partial, const T* dout, const int* sorted, const int* ids,
                                   const int* offsets, int N, int C, int V, int S) {
    constexpr int CPT = 4;
    int total = offsets[V];
    int p = blockIdx.x;
    if (p >= total) return;
    int id = ids[sorted[p]];
    int s0 = offsets[id], s1 = offsets[id + 1];
    if ((p - s0) % S != 0) return; // not the head of a chunk
    int end = p + S < s1 ? p + S : s1;
    int cbase = blockIdx.y * (blockDim.x * CPT) + threadIdx.x;
    float acc[CPT];
#pragma unroll
    for (int k = 0; k < CPT; k++) acc[k] = 0.0f;
    for (int j = p; j < end; j++) {
        const T* g = dout + (long long)sorted[j] * C;
#pragma unroll
        for (int k = 0; k < CPT; k++) {
            int c = cbase + k * blockDim.x;
            if (c < C) acc[k] += f32(g[c]);
        }
    }
    if (s1 - s0 > S) {
        float* dst = partial + (long long)p * C;
#pragma unroll
        for (int k = 0; k < CPT; k++) {
            int c = cbase + k * blockDim.x;
            if (c < C) dst[c] = acc[k];
        }
        return;
    }
    T* d = dtable + (long long)id * C;
#pragma unroll
    for (int k = 0; k < CPT; k++) {
        int c = cbase + k * blockDim.x;
        if (c < C) d[c] = cvt<T>(f32(d[c]) + acc[k]);
    }
}

// Launch as embedding_bwd, after it. Block p works only if p heads a bucket
// of more than S rows: it adds the bucket's chunk sums partial[s0 + i·S, :]
// in increasing i (a fixed order: deterministic) into dtable.
template <typename T>
__device__ void embedding_bwd_merge_impl(T* dtable, const float* partial, const int* sorted, const int* ids,
                                         const int* offsets, int N, int C, int V, int S) {
    constexpr int CPT = 4;
    int total = offsets[V];
    int p = blockIdx.x;
    if (p >= total) return;
    int id = ids[sorted[p]];
    int s0 = offsets[id], s1 = offsets[id + 1];
    if (p != s0 || s1 - s0 <= S) return;
    int cbase = blockIdx.y * (blockDim.x * CPT) + threadIdx.x;
    float acc[CPT];
#pragma unroll
    for (int k = 0; k < CPT; k++) acc[k] = 0.0f;
    for (int j = s0; j < s1; j += S) {
        const float* g = partial + (long long)j * C;
#pragma unroll
        for (int k = 0; k < CPT; k++) {
            int c = cbase + k * blockDim.x;
            if (c < C) acc[k] += g[c];
        }
    }
    T* d = dtable + (long long)id * C;
#pragma unroll
    for (int k = 0; k < CPT; k++) {
        int c = cbase + k * blockDim.x;
        if (c < C) d[c] = cvt<T>(f32(d[c]) + acc[k]);
    }
}
} // namespace atp

using namespace atp;

// out (N, C); table (V, C); ids (N); err (2). Launch: grid ceil(N / 8), block 256.
KERNEL void embedding_fwd_bf16(bf16* out, const bf16* table, const int* ids, int N, int C, int V, int* err) {
    embedding_fwd_impl(out, table, ids, N, C, V, err);
}
KERNEL void embedding_fwd_f32(float* out, const float* table, const int* ids, int N, int C, int V, int* err) {
    embedding_fwd_impl(out, table, ids, N, C, V, err);
}

// counts (V) zeroed by the caller; ids (N). Grid-stride, block 256.
KERNEL void emb_count(int* counts, const int* ids, int N, int V, int* err) {
    for (long long n = grid_thread(); n < N; n += grid_threads()) {
        int id = ids[n];
        if (id >= 0 && id < V)
            atomicAdd(counts + id, 1);
        else
            report_error(err, id);
    }
}

// offsets (V + 1) = exclusive prefix sum of counts (V). Launch: grid 1,
// block 1024.
KERNEL void emb_scan(int* offsets, const int* counts, int V) {
    __shared__ int warp_tot[32];
    __shared__ int carry_s;
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
    if (tid == 0) {
        carry_s = 0;
        offsets[0] = 0;
    }
    __syncthreads();
    for (int base = 0; base < V; base += blockDim.x) {
        int i = base + tid;
        int x = i < V ? counts[i] : 0;
        int incl = x;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(ATP_FULL_MASK, incl, o);
            if (lane >= o) incl += y;
        }
        if (lane == 31) warp_tot[wid] = incl;
        __syncthreads();
        int before = 0, all = 0;
        for (int w = 0; w < nw; w++) {
            int t = warp_tot[w];
            if (w < wid) before += t;
            all += t;
        }
        int carry = carry_s;
        if (i < V) offsets[i + 1] = carry + before + incl;
        __syncthreads();
        if (tid == 0) carry_s = carry + all;
        __syncthreads();
    }
}

// bucket (N): bucket[offsets[v] + k] = the k-th token of v to claim a slot
// (any order). counts (V) as left by emb_count; decremented back to 0.
// Grid-stride, block 256.
KERNEL void emb_scatter(int* bucket, int* counts, const int* ids, const int* offsets, int N, int V) {
    for (long long n = grid_thread(); n < N; n += grid_threads()) {
        int id = ids[n];
        if (id < 0 || id >= V) continue;
        int k = atomicSub(counts + id, 1) - 1;
        bucket[offsets[id] + k] = (int)n;
    }
}

// sorted (N): each bucket of `bucket` in increasing token order. Grid-stride,
// block 256.
KERNEL void emb_rank(int* sorted, const int* bucket, const int* ids, const int* offsets, int N, int V) {
    for (long long n = grid_thread(); n < N; n += grid_threads()) {
        int id = ids[n];
        if (id < 0 || id >= V) continue;
        int s0 = offsets[id], s1 = offsets[id + 1];
        int rank = 0;
        for (int j = s0; j < s1; j++) rank += bucket[j] < n;
        sorted[s0 + rank] = (int)n;
    }
}

// dtable (V, C) +=; partial (N, C) fp32 scratch; dout (N, C); sorted (N),
// ids (N), offsets (V + 1); S rows per chunk. Launch: grid (N, ceil(C / 1024)),
// block 256; then the _merge kernel with the same arguments and grid.
KERNEL void embedding_bwd_bf16(bf16* dtable, float* partial, const bf16* dout, const int* sorted, const int* ids,
                               const int* offsets, int N, int C, int V, int S) {
    embedding_bwd_impl(dtable, partial, dout, sorted, ids, offsets, N, C, V, S);
}
KERNEL void embedding_bwd_f32(float* dtable, float* partial, const float* dout, const int* sorted, const int* ids,
                              const int* offsets, int N, int C, int V, int S) {
    embedding_bwd_impl(dtable, partial, dout, sorted, ids, offsets, N, C, V, S);
}
KERNEL void embedding_bwd_merge_bf16(bf16* dtable, const float* partial, const int* sorted, const int* ids,
                                     const int* offsets, int N, int C, int V, int S) {
    embedding_bwd_merge_impl(dtable, partial, sorted, ids, offsets, N, C, V, S);
}
KERNEL void embedding_bwd_merge_f32(float* dtable, const float* partial, const int* sorted, const int* ids,
                                    const int* offsets, int N, int C, int V, int S) {
    embedding_bwd_merge_impl(dtable, partial, sorted, ids, offsets, N, C, V, S);
}
