// ep_layout.cu: the layout of the expert path (ep.cuh): the sender's counts
// and rows per destination rank (ep_layout), and the receiver's plan of the
// exchanged counts: capacity, expert-major offsets, kept slots, and the
// fused path's block counters (ep_plan).
#include "ep.cuh" // defines: the protocol's buffers and helpers, every ep_* entry point declared

// ---- layout -------------------------------------------------------------------
// ep_layout: grid (E + P), block 256. Block e < E scans the N·K slots in
// order for expert e: rk[s] = the slot's rank among the slots of e (token,
// then choice order), cnt[e] = their number. Block E + d scans the tokens
// for destination d: send_row[n·P + d] = the token's row in d's region (the
// tokens with at least one choice on d, in token order) or −1, rows_to[d] =
// their number. Choices outside [0, E) are reported through err.
KERNEL void ep_layout(const int* idx, int N, int K, int E, int P, int L, int* cnt, int* rk, int* send_row,
                      int* rows_to, int* err) {
    __shared__ int scratch[33];
    int b = blockIdx.x;
    if (b < E) {
        int base = 0;
        for (int s0 = 0; s0 < N * K; s0 += blockDim.x) {
            int s = s0 + threadIdx.x;
            int e = s < N * K ? idx[s] : -1;
            if (b == 0 && s < N * K && (e < 0 || e >= E)) report_error(err, e);
            int total;
            int pre = ep_block_scan(e == b ? 1 : 0, scratch, &total);
            if (e == b) rk[s] = base + pre;
            base += total;
        }
        if (threadIdx.x == 0) cnt[b] = base;
    } else {
        int d = b - E, base = 0;
        for (int n0 = 0; n0 < N; n0 += blockDim.x) {
            int n = n0 + threadIdx.x;
            int f = 0;
            if (n < N)
                for (int j = 0; j < K; j++) {
                    int e = idx[n * K + j];
                    if (e >= 0 && e < E && e / L == d) f = 1;
                }
            int total;
            int pre = ep_block_scan(f, scratch, &total);
            if (n < N) send_row[(long long)n * P + d] = f ? base + pre : -1;
            base += total;
        }
        if (threadIdx.x == 0) rows_to[d] = base;
    }
}

// ---- plan -----------------------------------------------------------------------
// ep_plan: grid 1, block 256, after the dispatch's ready wait. From hdr (the
// counts every source wrote here) it writes:
//   hcopy (P, E+2) a copy for the host and later rounds;
//   status[0] = 2, status[1] = the source, status[2] = its tokens, when a
//     source brought more than Mt tokens (every rank sees the same headers,
//     so every rank refuses the step);
//   offsets (L+1): the expert-major row offsets of the local experts (the
//     grouped GEMM's device offsets);
//   tab: [0] M_recv, [1] T (tokens of the group), [2] capacity;
//     kept (P·L) at tab+4, exp_src_off (L·P) at tab+4+P·L (first
//     expert-major row of (expert, source)), recv_off (P·L) at
//     tab+4+2·P·L (first received-order row of (source, expert));
//   pos (N·K): slot n·K + j of this rank's tokens, or −1 when dropped;
//   blk (L+1) at tab+4+3·P·L: blk[el] = Σ_{i<el} ⌈rows_i / 128⌉, the
//     first 128-row block of local expert el in the grouped GEMM's
//     group-major block order (grouped_sm90.cu's blk_s);
//   counters (nblk u64, when set: the fused path): counters[q] = 128 − the
//     expert rows block q of this step will hold (128 for the blocks past
//     the step's), so that, once ep_recv has added 1 per row landed, every
//     block's counter is 128: one target for every block, whatever its rows.
// capacity = ceil(cf·T·K/E) in double (layers.Capacity), 0 for cf = 0;
// source s keeps min(its slots, capacity − slots of sources before s) of
// each expert: the group's token order (layers.RoutingPlan).
KERNEL void ep_plan(const int* hdr, const int* idx, const int* rk, int P, int E, int L, int me, int N, int K,
                    int Mt, long long cf_bits, int* hcopy, int* offsets, int* tab, int* pos, int* status,
                    unsigned long long* counters, int nblk) {
    __shared__ int sh_cap;
    __shared__ int sh_bad;
    int W = E + 2;
    for (int i = threadIdx.x; i < P * W; i += blockDim.x) hcopy[i] = hdr[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        long long T = 0;
        int bad = -1;
        for (int s = 0; s < P; s++) {
            int n = hcopy[s * W + E];
            T += n;
            if (bad < 0 && (n > Mt || n < 0 || hcopy[s * W + E + 1] > Mt || hcopy[s * W + E + 1] < 0)) bad = s;
        }
        double cf;
        memcpy(&cf, &cf_bits, 8);
        int cap = cf > 0 ? (int)ceil(cf * (double)T * (double)K / (double)E) : 0;
        tab[1] = (int)T;
        tab[2] = cap;
        sh_cap = cap;
        sh_bad = bad;
        if (bad >= 0 && status[0] == 0) {
            status[0] = 2;
            status[1] = bad;
            status[2] = hcopy[bad * W + E];
        }
    }
    __syncthreads();
    int cap = sh_cap;
    int* kept = tab + 4;
    int* exp_src_off = kept + P * L;
    int* recv_off = exp_src_off + L * P;
    int* blk = recv_off + P * L;
    if (sh_bad >= 0) { // nothing is received or kept in a refused step
        for (int i = threadIdx.x; i < P * L; i += blockDim.x) kept[i] = 0;
        for (int i = threadIdx.x; i <= L; i += blockDim.x) offsets[i] = 0;
        for (int i = threadIdx.x; i <= L; i += blockDim.x) blk[i] = 0;
        for (int i = threadIdx.x; i < N * K && N <= Mt; i += blockDim.x) pos[i] = -1;
        if (counters != nullptr)
            for (int q = threadIdx.x; q < nblk; q += blockDim.x) counters[q] = 128;
        if (threadIdx.x == 0) tab[0] = 0;
        return;
    }
    // kept[s][el] for the local experts.
    for (int el = threadIdx.x; el < L; el += blockDim.x) {
        int e = me * L + el, used = 0;
        for (int s = 0; s < P; s++) {
            int c = hcopy[s * W + e];
            int room = cap - used < 0 ? 0 : cap - used;
            int k = cap > 0 ? (c < room ? c : room) : c;
            kept[s * L + el] = k;
            used += c;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0;
        for (int el = 0; el < L; el++) {
            offsets[el] = o;
            for (int s = 0; s < P; s++) {
                exp_src_off[el * P + s] = o;
                o += kept[s * L + el];
            }
        }
        offsets[L] = o;
        tab[0] = o;
        int q = 0;
        for (int el = 0; el < L; el++) {
            blk[el] = q;
            q += (offsets[el + 1] - offsets[el] + 127) / 128;
        }
        blk[L] = q;
        int r = 0;
        for (int s = 0; s < P; s++)
            for (int el = 0; el < L; el++) {
                recv_off[s * L + el] = r;
                r += kept[s * L + el];
            }
    }
    // This rank's own slots: kept iff rank-in-expert + the slots of the
    // sources before it < capacity.
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) {
        int e = idx[i];
        int keep = 1;
        if (cap > 0) {
            int used = 0;
            for (int s = 0; s < me; s++) used += hcopy[s * W + e];
            keep = rk[i] + used < cap;
        }
        pos[i] = keep ? i : -1;
    }
    if (counters != nullptr) {
        __syncthreads(); // offsets and blk, by thread 0
        ep_set_targets(offsets, blk, L, counters, nblk, *(volatile const int*)status != 0);
    }
}
