// dispatch.cu: the device-side MoE dispatch and combine over symmetric
// memory (the pipelined strategy of the expert path; parallel/ep/peerep,
// tensor/cudabackend/epdispatch.go). DeepEP's intranode protocol: every
// buffer a peer writes is symmetric (same size on every rank), peers are
// reached by plain stores through NVLink-mapped peer pointers (an array of
// the P base addresses of each buffer, `peers`), and 64-bit signal words
// gate every buffer. No NVSHMEM device call: these kernels live in the
// ordinary image.
//
// Shapes (P ranks, me = this rank, E experts, L = E/P local experts, K
// choices, N tokens on this rank, Mt = max tokens per rank, C features, R =
// P·Mt·min(K, L) the bound on expert rows received):
//   hdr   (P, E+2) int32, symmetric: row s = source s's per-expert slot
//         counts (before any capacity), its token count, rows sent to me.
//   tok   (P·Mt, C) symmetric: region s = the tokens s sent me, each ONCE
//         however many of its K experts live here, in s's token order.
//   meta  (P·Mt, 1+2K) int32, symmetric: per region row: the source token n,
//         then for each choice j the expert id (−1: not mine) and the slot's
//         rank among s's slots of that expert (token, then choice order).
//   wts   (P·Mt, K) f32, symmetric: the routing weights of a region row
//         (combine backward only).
//   ybuf, gbuf (Mt·K, C) symmetric: combine / dispatch-backward returns, row
//         n·K + j = slot (n, j) of this rank's tokens.
//   sig   (6P) u64, symmetric: readyTok, readyY, readyG, ackTok, ackY, ackG,
//         word [channel·P + s] written by rank s.
// Local tables: cnt (E), rk (Mt·K), send_row (Mt·P), rows_to (P) of the
// layout; hcopy (P·(E+2)); tab (see ep_plan); pos (Mt·K); route (P·Mt·K);
// route_exp, route_recv (R, 2); recv_of_exp, exp_of_recv (R).
//
// Signals are epochs: call e of a channel stores e (never reset; a later
// call only raises it), so a waiter compares ≥ and back-to-back steps
// cannot race on a word a peer may still be waiting on. A writer first
// waits for the reader's ack of epoch e−1 of the same buffer (the reader has
// finished reading the previous contents), writes, then raises ready = e;
// the reader waits for ready ≥ e, reads, then raises ack = e.
//
// Memory ordering (why each fence is there):
//   - The data stores of a send kernel complete before the next kernel on
//     the stream starts (kernel boundary); ep_signal then issues
//     __threadfence_system() (fence.sc.sys) before its st.release.sys so
//     that the stores, made by other threads of the earlier kernel, are
//     ordered before the signal for every observer in the system (peer
//     GPUs through NVLink, and other MPS clients of this GPU).
//   - ep_wait reads the word with ld.acquire.sys: the peer's data stores
//     that happened before its release are visible to this thread; the
//     kernel boundary after ep_wait extends that to the kernels that read
//     the data.
//   - Acks are the same pair in the other direction.
// Waits have a deadline (%globaltimer): a word still short of its target
// after deadline_ns sets status[0] (every later kernel of the step then
// does nothing) and reports the peer through err (read at the next Sync).
//
// On the CPU emulator the waits never spin: the multi-rank tests run every
// rank's phase before any rank's next phase, so a word is always ready.
#include "common.cuh"
#include "signals.cuh"

namespace atp {

// ep_copy_row copies C elements of T with the block's threads, 16 bytes at
// a time when both rows allow it.
template <typename T> __device__ __forceinline__ void ep_copy_row(T* dst, const T* src, int C) {
    long long bytes = (long long)C * sizeof(T);
    if ((bytes & 15) == 0 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        for (long long i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
    }
}

// ep_copy_row_warp copies C elements of T with one warp (lane 0..31), 16
// bytes at a time when both rows allow it, four loads in flight per lane
// before their stores (a lone warp per row is latency-bound otherwise).
template <typename T>
__device__ __forceinline__ void ep_copy_row_warp(T* dst, const T* src, int C, int lane) {
    long long bytes = (long long)C * sizeof(T);
    if ((bytes & 15) == 0 && ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
        uint4* d = reinterpret_cast<uint4*>(dst);
        const uint4* s = reinterpret_cast<const uint4*>(src);
        const long long n = bytes / 16;
        long long i = lane;
        for (; i + 96 < n; i += 128) {
            uint4 a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
            d[i] = a;
            d[i + 32] = b;
            d[i + 64] = c;
            d[i + 96] = e;
        }
        for (; i < n; i += 32) d[i] = s[i];
    } else {
        for (int i = lane; i < C; i += 32) dst[i] = src[i];
    }
}

// block_exclusive_scan of one int per thread (blockDim.x a multiple of 32,
// at most 1024); returns the exclusive prefix and sets *total. scratch: 33
// ints of shared memory.
__device__ __forceinline__ int ep_block_scan(int v, int* scratch, int* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(ATP_FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int w = 0; w < nw; w++) {
            int c = scratch[w];
            scratch[w] = run;
            run += c;
        }
        scratch[32] = run;
    }
    __syncthreads();
    int r = scratch[warp] + x - v;
    *total = scratch[32];
    __syncthreads();
    return r;
}

} // namespace atp

using namespace atp;

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

// ---- signals ------------------------------------------------------------------
// ep_wait: grid 1, block 32. Waits until words[i] ≥ target for i < n (the
// ready or ack words the P peers raise in this rank's pad), each for at
// most deadline_ns; a word still short sets status[0] = 1 and reports
// code·65536 + its index (the peer's rank) through err. status[0] already
// set: no wait.
// ep_wait_raise is ep_wait that then sets every word still short to target
// (also when status[0] was already set): stream memory waits queued on the
// same words elsewhere (which cannot give up) then pass, and the step's
// error is the one reported here. For words in this rank's own pad only.
__device__ __forceinline__ void ep_wait_words(unsigned long long* words, int n, long long target, long long deadline_ns,
                                              int code, int* status, int* err, bool raise, int base = 0) {
    bool failed = status[0] != 0;
    if (failed && !raise) return;
    long long start = ep_now_ns();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        while (ep_load_acquire(words + i) < (u64)target) {
            if (failed || ep_now_ns() - start > deadline_ns) {
                if (!failed) {
                    status[0] = 1;
                    report_error(err, code * 65536 + base + i);
                }
                if (raise) ep_store_release(words + i, (u64)target);
                break;
            }
#if !defined(ASYNCTP_EMU)
            __nanosleep(64);
#endif
        }
    }
}

KERNEL void ep_wait(unsigned long long* words, int n, long long target, long long deadline_ns, int code, int* status,
                    int* err) {
    ep_wait_words(words, n, target, deadline_ns, code, status, err, false);
}

// ep_wait_one: grid 1, block 32. ep_wait of the one word words[idx]
// (reported as code·65536 + idx): the fused path waits for each source's
// tokens alone, own first.
KERNEL void ep_wait_one(unsigned long long* words, int idx, long long target, long long deadline_ns, int code,
                        int* status, int* err) {
    ep_wait_words(words + idx, 1, target, deadline_ns, code, status, err, false, idx);
}

// ep_claim: grid 1, block 32. The fused path lands each source's rows on
// whichever stream gets to them first: the backend's stream before the
// GEMM takes every source whose tokens are already here (only < 0: each s
// with words[s] ≥ target), the side stream each source in turn once its
// wait has passed (only = s). claims[s] goes 0 → who once (atomicCAS), and
// the landing kernels of a source run only on the stream that won it
// (ep_recv's and ep_scale_recv's claims, want).
KERNEL void ep_claim(const unsigned long long* words, int P, long long target, int only, int* claims, int who) {
    if (threadIdx.x != 0) return;
    const int lo = only >= 0 ? only : 0, hi = only >= 0 ? only + 1 : P;
    for (int s = lo; s < hi; s++) {
        if (only < 0 && ep_load_acquire(words + s) < (u64)target) continue;
        atomicCAS(claims + s, 0, who);
    }
}

KERNEL void ep_wait_raise(unsigned long long* words, int n, long long target, long long deadline_ns, int code,
                          int* status, int* err) {
    ep_wait_words(words, n, target, deadline_ns, code, status, err, true);
}

// ep_signal: grid 1, block 32. Stores value into word `word` of each of the
// n ranks' signal pads (peers: their base addresses), with release
// semantics at system scope after a system fence (see the file comment).
// It runs even when the step failed, so that no peer waits for it in vain.
KERNEL void ep_signal(const unsigned long long* peers, int n, long long word, long long value) {
    ep_fence_system();
    for (int r = threadIdx.x; r < n; r += blockDim.x) ep_store_release(ep_peer<u64>(peers, r) + word, (u64)value);
}

// ---- plan -----------------------------------------------------------------------
// ep_set_targets (every thread of the block): counters[q] = 128 − the rows
// of 128-row block q (0 past the step's blocks blk[L]), blk[el] the first
// block of local expert el (see ep_plan).
// A step that has failed already (failed: status[0] set) gets 128
// everywhere: its rows will never land, and no GEMM should wait for them.
__device__ __forceinline__ void ep_set_targets(const int* offsets, const int* blk, int L, u64* counters, int nblk,
                                               bool failed) {
    for (int q = threadIdx.x; q < nblk; q += blockDim.x) {
        int rows = 0;
        if (q < blk[L] && !failed) {
            int el = 0;
            while (blk[el + 1] <= q) el++; // the expert of block q (no empty expert has a block)
            rows = offsets[el + 1] - offsets[el] - 128 * (q - blk[el]);
            if (rows > 128) rows = 128;
        }
        counters[q] = (u64)(128 - rows);
    }
}

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

// ep_block_targets: grid 1, block 256. ep_plan's counters again, from the
// step's offsets and block table (tab), for the fused backward's second
// use of the counters (the combine backward's rows landing).
KERNEL void ep_block_targets(const int* offsets, const int* tab, int P, int L, unsigned long long* counters, int nblk,
                             const int* status) {
    ep_set_targets(offsets, tab + 4 + 3 * P * L, L, counters, nblk, *(volatile const int*)status != 0);
}

// ep_write_header stores this rank's header row (its per-expert counts, its
// token count N, the rows it sends to rank d: 0 over the bound Mt) into row
// me of every rank's header, with the block's threads.
__device__ __forceinline__ void ep_write_header(const int* cnt, const int* rows_to, int N, int E, int P, int Mt, int me,
                                                const unsigned long long* hdr_peers) {
    int W = E + 2;
    for (int d = 0; d < P; d++) {
        int* h = ep_peer<int>(hdr_peers, d) + (long long)me * W;
        for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = cnt[e];
        if (threadIdx.x == 0) {
            h[E] = N;
            h[E + 1] = N > Mt ? 0 : rows_to[d];
        }
    }
}

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

// ---- the fused path (parallel/ep/peerep's Fused) ----------------------------------
// ep_header: grid 1, block 128. Block 0 of ep_send's header stores alone:
// this rank's header row into every rank's hdr. The fused path sends the
// counts first (and signals them on their own channel), so that every
// receiver plans the step and starts its grouped GEMM while the tokens are
// still on their way. Nothing when status[0] is set.
KERNEL void ep_header(const int* cnt, const int* rows_to, int N, int E, int P, int Mt, int me,
                      const unsigned long long* hdr_peers, const int* status) {
    if (status[0] != 0) return;
    ep_write_header(cnt, rows_to, N, E, P, Mt, me, hdr_peers);
}

// ep_fill_u64: grid 1, block 128. words[i] = value for i < n, with release
// (GPU scope) after a fence: the signal of a down-projection GEMM without
// the engine's epilogue hook (every block done at once).
KERNEL void ep_fill_u64(unsigned long long* words, int n, long long value) {
    ep_fence_gpu();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
#if defined(ASYNCTP_EMU)
        __atomic_store_n(words + i, (u64)value, __ATOMIC_RELEASE);
#else
        asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(words + i), "l"((u64)value) : "memory");
#endif
    }
}

// ep_return_blocks: the fused combine's send, in two launches that share
// one claim counter (zero before the first): a few CTAs on a side stream
// while the down-projection GEMM runs, then a full grid on the GEMM's
// stream after it, which sends whatever the first has not claimed. Block
// 256 (8 warps). The expert-major rows y are in the grouped GEMM's 128-row
// blocks (blk, offsets of ep_plan), cut into units of 16 rows; a CTA claims
// the next unit (atomicAdd on *claim: units in increasing order, the order
// the GEMM's static tile order finishes the blocks in), waits until the
// unit's block flag is ≥ target (the GEMM's epilogue adds 1 per stored
// tile: target = its n-blocks; ld.acquire, deadline) and stores each of
// the unit's rows into its token's home ybuf slot (a warp per row), as
// ep_return does. A flag still short after deadline_ns sets status[0] = 1
// and reports 0x20000000 + the block through err; that CTA then stops (the
// step has failed; the homes' wait for this rank's ready signal, which
// ep_signal still raises, passes on stale rows and the error surfaces here
// at the next Sync). After the GEMM every flag is up, so the second launch
// never waits.
#define EP_UNIT_ROWS 16
template <typename T>
__device__ void ep_return_blocks_impl(const T* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                      int C, const u64* flags, long long target, long long deadline_ns,
                                      const u64* peers, int* status, int* err, int* claim) {
    __shared__ int sh_unit;
    const int* blk = tab + 4 + 3 * P * L;
    const int units = blk[L] * (128 / EP_UNIT_ROWS);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (;;) {
        if (threadIdx.x == 0) {
            int u = atomicAdd(claim, 1);
            int q = u / (128 / EP_UNIT_ROWS);
            if (*(volatile const int*)status != 0) u = units; // the step has failed already
            if (u < units) {
                long long start = ep_now_ns();
                while (ep_load_acquire(flags + q) < (u64)target) {
                    if (*(volatile const int*)status != 0) {
                        u = units;
                        break;
                    }
                    if (ep_now_ns() - start > deadline_ns) {
                        status[0] = 1;
                        report_error(err, 0x20000000 + q);
                        u = units;
                        break;
                    }
#if !defined(ASYNCTP_EMU)
                    __nanosleep(128);
#endif
                }
            }
            sh_unit = u;
        }
        __syncthreads();
        const int u = sh_unit;
        if (u >= units) return;
        const int q = u / (128 / EP_UNIT_ROWS);
        int el = 0;
        while (blk[el + 1] <= q) el++;
        const int b0 = offsets[el] + 128 * (q - blk[el]);
        const int r0 = b0 + EP_UNIT_ROWS * (u % (128 / EP_UNIT_ROWS));
        int r1 = r0 + EP_UNIT_ROWS;
        if (r1 > b0 + 128) r1 = b0 + 128;
        if (r1 > offsets[el + 1]) r1 = offsets[el + 1];
        for (int i = r0 + warp; i < r1; i += nw) {
            const int s = routes[2 * i], slot = routes[2 * i + 1];
            ep_copy_row_warp(ep_peer<T>(peers, s) + (long long)slot * C, y + (long long)i * C, C, lane);
        }
        __syncthreads(); // sh_unit is rewritten for the next unit
    }
}

KERNEL void ep_return_blocks_bf16(const bf16* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                  int C, const unsigned long long* flags, long long target, long long deadline_ns,
                                  const unsigned long long* peers, int* status, int* err, int* claim) {
    ep_return_blocks_impl(y, routes, offsets, tab, P, L, C, flags, target, deadline_ns, peers, status, err, claim);
}
KERNEL void ep_return_blocks_f32(const float* y, const int* routes, const int* offsets, const int* tab, int P, int L,
                                 int C, const unsigned long long* flags, long long target, long long deadline_ns,
                                 const unsigned long long* peers, int* status, int* err, int* claim) {
    ep_return_blocks_impl(y, routes, offsets, tab, P, L, C, flags, target, deadline_ns, peers, status, err, claim);
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
