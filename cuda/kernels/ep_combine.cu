// ep_combine.cu: the combine of the expert path (ep.cuh): the expert rows
// back to their tokens' homes (ep_return; the dispatch backward's gradient
// rows the same way), and the combine backward's weighted rows (ep_scale_recv).
#include "ep.cuh" // defines: the protocol's buffers and helpers, every ep_* entry point declared

// ep_return: grid-stride over the tab[0] expert rows, block 128 (combine and
// dispatch backward). Row i of y (in the order of routes: route_exp for
// expert-major rows, route_recv for received-order ones) goes to its
// token's home rank, into row slot of that rank's ybuf or gbuf (peers).
template <typename T>
__device__ void ep_return_impl(const T* y, const int* routes, const int* tab, int C, const u64* peers,
                               const int* status) {
    if (status[0] != 0) return;
    int M = tab[0];
    for (long long i = blockIdx.x; i < M; i += gridDim.x) {
        int s = routes[2 * i], slot = routes[2 * i + 1];
        ep_copy_row(ep_peer<T>(peers, s) + (long long)slot * C, y + i * C, C);
    }
}

// ep_scale_recv: grid-stride over the P·Mt region rows, block 128 (combine
// backward, after its ready wait): each kept choice j of region row (s, i)
// gets dy[row] = wts[j]·tok[row of (s, i)] (fp32, rounded once), row = the
// expert-major row of route, or remap[it] when remap is set (received
// order). only ≥ 0 and counters set: the fused backward, as in ep_recv:
// source `only`'s region alone, +1 on the row's block counter (blk in tab,
// the expert from offsets) after each row is written.
template <typename T>
__device__ void ep_scale_recv_impl(const T* tok, const float* wts, const int* hcopy, const int* route,
                                   const int* remap, int P, int E, int K, int C, int Mt, T* dy, const int* status,
                                   int only, u64* counters, const int* offsets, const int* tab, int L,
                                   const int* claims, int want) {
    if (status[0] != 0) return;
    if (claims != nullptr && claims[only] != want) return; // another stream lands this source
    int W = E + 2;
    long long g0 = only >= 0 ? (long long)only * Mt : 0, g1 = only >= 0 ? g0 + Mt : (long long)P * Mt;
    for (long long g = g0 + blockIdx.x; g < g1; g += gridDim.x) {
        int s = (int)(g / Mt), i = (int)(g % Mt);
        if (i >= hcopy[s * W + E + 1]) continue;
        for (int j = 0; j < K; j++) {
            int er = route[g * K + j];
            if (er < 0) continue;
            int row = remap != nullptr ? remap[er] : er;
            float w = wts[g * K + j];
            T* d = dy + (long long)row * C;
            const T* t = tok + g * C;
            for (int c = threadIdx.x; c < C; c += blockDim.x) d[c] = cvt<T>(w * f32(t[c]));
            if (counters != nullptr) { // uniform in the block: er is
                __syncthreads();
                if (threadIdx.x == 0) {
                    int lo = 0, hi = L - 1; // the last el with offsets[el] <= er: er's expert
                    while (lo < hi) {
                        int mid = (lo + hi + 1) >> 1;
                        if (offsets[mid] <= er) lo = mid;
                        else hi = mid - 1;
                    }
                    const int* blk = tab + 4 + 3 * P * L;
                    ep_fence_gpu();
                    ep_add_release_gpu(counters + blk[lo] + (er - offsets[lo]) / 128, 1);
                }
            }
        }
    }
}

KERNEL void ep_return_bf16(const bf16* y, const int* routes, const int* tab, int C, const unsigned long long* peers,
                           const int* status) {
    ep_return_impl(y, routes, tab, C, peers, status);
}
KERNEL void ep_scale_recv_bf16(const bf16* tok, const float* wts, const int* hcopy, const int* route, const int* remap,
                               int P, int E, int K, int C, int Mt, bf16* dy, const int* status,
                               int only, unsigned long long* counters, const int* offsets, const int* tab, int L,
                               const int* claims, int want) {
    ep_scale_recv_impl(tok, wts, hcopy, route, remap, P, E, K, C, Mt, dy, status, only, counters, offsets, tab, L,
                       claims, want);
}

KERNEL void ep_return_f32(const float* y, const int* routes, const int* tab, int C, const unsigned long long* peers,
                           const int* status) {
    ep_return_impl(y, routes, tab, C, peers, status);
}
KERNEL void ep_scale_recv_f32(const float* tok, const float* wts, const int* hcopy, const int* route, const int* remap,
                               int P, int E, int K, int C, int Mt, float* dy, const int* status,
                               int only, unsigned long long* counters, const int* offsets, const int* tab, int L,
                               const int* claims, int want) {
    ep_scale_recv_impl(tok, wts, hcopy, route, remap, P, E, K, C, Mt, dy, status, only, counters, offsets, tab, L,
                       claims, want);
}
