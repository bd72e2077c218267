// ep_dispatch.cu: the dispatch of the expert path (ep.cuh): each token sent
// once per destination rank with its meta row and the header (ep_send; the
// combine backward sends ∂out the same way, with the routing weights), and
// the expansion of the received tokens into expert rows (ep_recv).
#include "ep.cuh" // defines: the protocol's buffers and helpers, every ep_* entry point declared

// ---- dispatch (tokens once per destination rank) -------------------------------
// ep_send: grid max(N, 1), block 128. Block n sends token row x[n] to every
// rank d with send_row[n·P + d] ≥ 0, into row me·Mt + send_row of d's tok.
// Dispatch (meta_peers set): with its meta row (n, then per choice the
// expert id if d holds it, else −1, and its rank in the expert); block 0
// also writes this rank's header row into every rank's hdr (per-expert
// counts, N, rows sent to d). A rank over Mt tokens sends only its header
// (the receivers refuse the step). Combine backward (wts_peers set): x is
// ∂out, sent with the K routing weights (f32), and, when dweights is set,
// block n also writes dweights[n·K + j] = ⟨∂out[n], ybuf[n·K + j]⟩ for the
// kept slots (0 for dropped ones; a warp per slot, in CombineRowsBackward's
// order): ybuf still holds the combine's expert outputs. Nothing when status[0] is set.
template <typename T>
__device__ void ep_send_impl(const T* x, const int* idx, const int* rk, const int* send_row, const int* cnt,
                             const int* rows_to, int N, int K, int E, int P, int L, int C, int Mt, int me,
                             const u64* tok_peers, const u64* meta_peers, const u64* hdr_peers, const T* w,
                             const u64* wts_peers, const int* pos, const T* ybuf, T* dweights, const int* status) {
    if (status[0] != 0) return;
    int n = blockIdx.x;
    if (hdr_peers != nullptr && n == 0) ep_write_header(cnt, rows_to, N, E, P, Mt, me, hdr_peers);
    if (n >= N || N > Mt) return;
    const T* xr = x + (long long)n * C;
    for (int d = 0; d < P; d++) {
        int row = send_row[(long long)n * P + d];
        if (row < 0) continue;
        long long g = (long long)me * Mt + row;
        ep_copy_row(ep_peer<T>(tok_peers, d) + g * C, xr, C);
        if (meta_peers != nullptr) {
            int* m = ep_peer<int>(meta_peers, d) + g * (1 + 2 * K);
            for (int j = threadIdx.x; j < K; j += blockDim.x) {
                int e = idx[n * K + j];
                bool mine = e / L == d;
                m[1 + 2 * j] = mine ? e : -1;
                m[2 + 2 * j] = mine ? rk[n * K + j] : -1;
            }
            if (threadIdx.x == 0) m[0] = n;
        }
        if (wts_peers != nullptr) {
            float* m = ep_peer<float>(wts_peers, d) + g * K;
            for (int j = threadIdx.x; j < K; j += blockDim.x) m[j] = f32(w[n * K + j]);
        }
    }
    if (dweights != nullptr) {
        // One warp per slot, each dot in combine_rows_bwd_impl's order (the
        // lanes' vectorised strides, then warp_sum): the collective
        // dispatcher's CombineBackward gives the same bits.
        int lane = threadIdx.x & 31;
        for (int j = threadIdx.x >> 5; j < K; j += blockDim.x >> 5) {
            int p = pos[n * K + j];
            float dot = 0.0f;
            if (p >= 0) {
                const T* ins[2] = {xr, ybuf + (long long)p * C};
                vvisit<T, 2>(ins, C, lane, 32, [&](long long, const float (&v)[2]) { dot += v[0] * v[1]; });
            }
            dot = warp_sum(dot);
            if (lane == 0) dweights[n * K + j] = cvt<T>(p >= 0 ? dot : 0.0f);
        }
    }
}

// ep_recv: grid-stride over the P·Mt region rows, block 128, after ep_plan.
// Region row (s, i < rows s sent) expands into one expert row per kept
// choice j on this rank (rank-in-expert < kept[s][e]): expert-major row
// exp_src_off[e][s] + rank, received-order row recv_off[s][e] + rank. The
// token row is written to out at the expert-major row (order 0) or the
// received-order row (order 1). Tables: route[(s·Mt + i)·K + j] = the
// expert-major row or −1; route_exp / route_recv (row, 2) = (source, slot
// n·K + j at the source); recv_of_exp, exp_of_recv: the two orders' maps.
// only ≥ 0: the region of source `only` alone (the fused path expands each
// source's tokens as they land, on a side stream). counters set (the fused
// path, order 0): after each expert row is written, the block's threads
// meet, and one adds 1 (release, GPU scope, after a fence that makes the
// block's stores visible) to the counter of the row's 128-row block in the
// grouped GEMM's group-major order (blk of ep_plan), which the GEMM's
// producer waits on (target 128, see ep_plan).
template <typename T>
__device__ void ep_recv_impl(const T* tok, const int* meta, const int* hcopy, const int* tab, int P, int E,
                             int L, int K, int C, int Mt, int me, int order, T* out, int* route, int* route_exp,
                             int* route_recv, int* recv_of_exp, int* exp_of_recv, const int* status, int only,
                             u64* counters, const int* offsets, const int* claims, int want) {
    if (status[0] != 0) return;
    if (claims != nullptr && claims[only] != want) return; // another stream lands this source
    const int* kept = tab + 4;
    const int* exp_src_off = kept + P * L;
    const int* recv_off = exp_src_off + L * P;
    const int* blk = recv_off + P * L;
    int W = E + 2;
    long long g0 = only >= 0 ? (long long)only * Mt : 0, g1 = only >= 0 ? g0 + Mt : (long long)P * Mt;
    for (long long g = g0 + blockIdx.x; g < g1; g += gridDim.x) {
        int s = (int)(g / Mt), i = (int)(g % Mt);
        if (i >= hcopy[s * W + E + 1]) continue;
        const int* m = meta + g * (1 + 2 * K);
        int n = m[0];
        for (int j = 0; j < K; j++) {
            int e = m[1 + 2 * j], r = m[2 + 2 * j];
            int el = e - me * L;
            int er = -1;
            if (e >= 0 && el >= 0 && el < L && r >= 0 && r < kept[s * L + el]) {
                er = exp_src_off[el * P + s] + r;
                int rr = recv_off[s * L + el] + r;
                ep_copy_row(out + (long long)(order ? rr : er) * C, tok + g * C, C);
                if (threadIdx.x == 0) {
                    route_exp[2 * er] = s;
                    route_exp[2 * er + 1] = n * K + j;
                    route_recv[2 * rr] = s;
                    route_recv[2 * rr + 1] = n * K + j;
                    recv_of_exp[er] = rr;
                    exp_of_recv[rr] = er;
                }
                if (counters != nullptr) { // uniform in the block: e, r, kept are the same for every thread
                    __syncthreads();
                    if (threadIdx.x == 0) {
                        ep_fence_gpu();
                        ep_add_release_gpu(counters + blk[el] + (er - offsets[el]) / 128, 1);
                    }
                }
            }
            if (threadIdx.x == 0) route[g * K + j] = er;
        }
    }
}

KERNEL void ep_send_bf16(const bf16* x, const int* idx, const int* rk, const int* send_row, const int* cnt,
                         const int* rows_to, int N, int K, int E, int P, int L, int C, int Mt, int me,
                         const unsigned long long* tok_peers, const unsigned long long* meta_peers,
                         const unsigned long long* hdr_peers, const bf16* w, const unsigned long long* wts_peers,
                         const int* pos, const bf16* ybuf, bf16* dweights, const int* status) {
    ep_send_impl(x, idx, rk, send_row, cnt, rows_to, N, K, E, P, L, C, Mt, me, tok_peers, meta_peers, hdr_peers, w,
                 wts_peers, pos, ybuf, dweights, status);
}
KERNEL void ep_recv_bf16(const bf16* tok, const int* meta, const int* hcopy, const int* tab, int P, int E, int L, int K,
                         int C, int Mt, int me, int order, bf16* out, int* route, int* route_exp, int* route_recv,
                         int* recv_of_exp, int* exp_of_recv, const int* status, int only,
                         unsigned long long* counters, const int* offsets, const int* claims, int want) {
    ep_recv_impl(tok, meta, hcopy, tab, P, E, L, K, C, Mt, me, order, out, route, route_exp, route_recv, recv_of_exp,
                 exp_of_recv, status, only, counters, offsets, claims, want);
}

KERNEL void ep_send_f32(const float* x, const int* idx, const int* rk, const int* send_row, const int* cnt,
                         const int* rows_to, int N, int K, int E, int P, int L, int C, int Mt, int me,
                         const unsigned long long* tok_peers, const unsigned long long* meta_peers,
                         const unsigned long long* hdr_peers, const float* w, const unsigned long long* wts_peers,
                         const int* pos, const float* ybuf, float* dweights, const int* status) {
    ep_send_impl(x, idx, rk, send_row, cnt, rows_to, N, K, E, P, L, C, Mt, me, tok_peers, meta_peers, hdr_peers, w,
                 wts_peers, pos, ybuf, dweights, status);
}
KERNEL void ep_recv_f32(const float* tok, const int* meta, const int* hcopy, const int* tab, int P, int E, int L, int K,
                         int C, int Mt, int me, int order, float* out, int* route, int* route_exp, int* route_recv,
                         int* recv_of_exp, int* exp_of_recv, const int* status, int only,
                         unsigned long long* counters, const int* offsets, const int* claims, int want) {
    ep_recv_impl(tok, meta, hcopy, tab, P, E, L, K, C, Mt, me, order, out, route, route_exp, route_recv, recv_of_exp,
                 exp_of_recv, status, only, counters, offsets, claims, want);
}
