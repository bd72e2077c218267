// attention_wg.cu: causal attention on Hopper's warpgroup MMA (wgmma,
// sm_90a; wgmma.cuh): the deterministic backward for D = 64 and 128, in
// attention_fa2.cu's two launches (dq with delta first, then dk and dv),
// and the forward for D = 128. Arguments and results are those of
// attention_fa2.cu's kernels (the same bits, TestAttentionWG); the products
// run on wgmma instead of mma.sync. Why: the profile of the FA2 backward at
// gpt2's shape (ncu, on an H200) found it latency-bound — one block of 8
// warps per SM (registers and shared memory), 2 warps per scheduler,
// 6.2–6.7 cycles between a warp's instructions, the tensor pipe ~31 % busy.
// wgmma is asynchronous and multiplies a 64-row operand per instruction, so
// one warpgroup keeps the tensor cores busy with far fewer instructions
// (FlashAttention-3's argument).
//
// Scheme (every kernel): a block is one warpgroup (128 threads) owning 64
// rows (ROWS: queries in the forward and dq, keys in dk/dv), warp w rows
// 16w…16w + 15 as in FA2, so the softmax code and the fragment layouts are
// FA2's (wgmma.cuh). The streamed tiles are double buffered with cp.async
// into the 128-byte-swizzled layout wgmma reads (wg_load), one barrier per
// tile as in FA2 (wait, fence to the async proxy, barrier, queue the next
// tile). Per tile: the score product(s) in one wgmma group, wait; the
// softmax in registers; the output product(s) (A = the bf16 probabilities
// or dS from registers, B MN-major from the streamed or held tile) in a
// second group, wait. No atomics: each output element is written once.
//
//   fwd (attn_fwd_wg_d128_bf16): key tiles of 64 up to the diagonal, FA2's
//       online softmax; S = Q·Kᵀ (Q fragments in registers), O += P·V.
//       Software-pipelined: tile it − 1's P·V runs while the threads run
//       tile it's softmax (K double, V triple buffered).
//       The default at D = 128 only. Unpipelined, the same template at
//       D = 64 failed the GPU shape tests whenever a block streamed more
//       than one key tile (T = 70, 200, 300, 1024: out off by 0.03–0.5;
//       only the rows past the first tile wrong), while the emulator passed
//       it; neither O's rescale order nor its accumulator was the cause
//       (commit 972fa98 and this file's history have those kernels). The
//       pipelined form at D = 64 (attn_fwd_wg_d64 / wgq_d64, an experiment,
//       retired to experimental/attention_wg_fwd_d64.cu; QDESC is its Q by
//       descriptor) gave FA2's out bits on the GPU but its lse differed in
//       the last bit in a few rows.
//   dq  (attn_bwd_dq_wg_dD_bf16): delta = Σ dout·out of the block's rows
//       (written for dk/dv), then key tiles of BN = 64 up to the diagonal:
//       S = Q·Kᵀ, dP = dO·Vᵀ, dS = P∘(dP − delta), dQ += dS·K. D = 64: Q, dO
//       fragments in registers (A of the score products); D = 128: Q, dO
//       by descriptor (fewer registers).
//   dkdv (attn_bwd_dkdv_wg_dD_bf16): query tiles of BM (64 for D = 64, 32
//       for D = 128) from the diagonal on: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ,
//       dV += Pᵀ·dO, dK += dSᵀ·Q. D = 64: K, V fragments in registers.
//   The backward kernels are not pipelined as the forward is: that form
//   (tile it − 1's output products behind tile it's score products)
//   gave the same bits but no speed on an H200 (1b 1.239 against 1.236
//   ms, gpt2 297 against 286 µs; dk/dv at 245–252 registers, at the edge
//   of two blocks per SM).
//
// Shared memory (1024 bytes of alignment slack, then the tiles):
//   fwd:  1024 + (64 + 5·64)·D·2 bytes: 99328 (D = 128), 50176 (D = 64)
//   dq:   1024 + (2·64 + 4·BN)·D·2 bytes: 50176 (D = 64), 99328 (D = 128)
//   dkdv: 1024 + (2·64 + 4·BM)·D·2 + 16·BM: 51200 (D = 64), 67072 (D = 128)
// grid (ceil(T/64), B·H), block 128; dkdv's grid is (ceil(T/64), B·HKV), each
// block running the query tiles of its key/value head's group of query heads
// one head after another, as attention_fa2.cu's (grouped-query attention).
#include "wgmma.cuh"

namespace atp {
namespace wgattn {

using namespace wg;

constexpr int NTHR = 128; // one warpgroup
constexpr int ROWS = 64;  // the rows each block owns

#if defined(ATP_WG_BODY)

// wg_load queues cp.async copies of rows [r0, r0 + R) of one (b, h) slice
// (base: element (b, 0, h, 0), rows rs elements apart) into the swizzled
// R-row tile dst; rows ≥ T are zero-filled.
template <int R, int D>
__device__ __forceinline__ void wg_load(bf16* dst, const bf16* base, int rs, int r0, int T) {
    constexpr int CPR = D / 8, N = R * CPR;
    static_assert(N % NTHR == 0, "whole rounds of copies");
#pragma unroll
    for (int c0 = 0; c0 < N; c0 += NTHR) {
        int c = c0 + (int)threadIdx.x, r = c / CPR, ch = c % CPR, t = r0 + r;
        bool valid = t < T;
        cp_async16(dst + wg_off<R>(r, ch), base + (long long)(valid ? t : 0) * rs + ch * 8, valid);
    }
}

// wg_smem: the dynamic shared memory from its first 1024-byte boundary (the
// launch adds 1024 bytes for it).
__device__ __forceinline__ bf16* wg_smem() {
    ATP_DYN_SMEM(unsigned char, raw);
    uint32_t pad = (1024u - (smem_u32(raw) & 1023u)) & 1023u;
    return reinterpret_cast<bf16*>(raw + pad);
}

// wg_tile_ready: the copies of the current tile have landed, are visible to
// wgmma, and every thread is done with the other buffer.
__device__ __forceinline__ void wg_tile_ready() {
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
}

#endif // ATP_WG_BODY

// ---------------------------------------------------------------------------
// Forward: out and lse, key tiles of 64 up to the diagonal with FA2's online
// softmax: S = Q·Kᵀ (Q fragments in registers, or by descriptor when
// QDESC), O += P·V (V MN-major).
template <int D, bool QDESC = false>
__device__ void attn_fwd_wg_impl(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                                 int H, int HKV, int sq, int skv, int so, float scale) {
#if defined(ATP_WG_BODY)
    constexpr int BM = ROWS, BN = 64, KS = D / 16, NT = BN / 8, DT = D / 8;
    bf16* Qs = wg_smem();        // BM × D
    bf16* Ks = Qs + BM * D;      // 2 × BN × D
    bf16* Vs = Ks + 2 * BN * D;  // 3 × BN × D
    int bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / (H / HKV); // hk: h's key/value head
    int q0 = (gridDim.x - 1 - blockIdx.x) * BM; // longest first
    const bf16* qb = q + (long long)b * T * sq + h * D;
    const bf16* kb = k + (long long)b * T * skv + hk * D;
    const bf16* vb = v + (long long)b * T * skv + hk * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int kend = q0 + BM < T ? q0 + BM : T;
    int nkt = (kend + BN - 1) / BN;
    int wr0 = q0 + warp * 16; // the warp's first row

    wg_load<BM, D>(Qs, qb, sq, q0, T);
    wg_load<BN, D>(Ks, kb, skv, 0, T);
    wg_load<BN, D>(Vs, vb, skv, 0, T);
    cp_async_commit();

    const float sl2 = scale * kTcLog2e;
    uint32_t qf[QDESC ? 1 : KS][4];
    uint32_t pa[BN / 16][4] = {}; // tile it − 1's probabilities (A of P·V)
    float o[DT][4], s[NT][4];
    fa2_zero(o);
    fa2_zero(s);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; // m: running max of raw scores (scale > 0)
    uint32_t vp = 0;                                             // tile it − 1's V

    // Software-pipelined (FlashAttention-3's intra-warpgroup overlap): tile
    // it's S is issued, then tile it − 1's O += P·V behind it; the threads
    // run tile it's softmax while the tensor cores run P·V, and rescale O
    // after it. O sees the same products and rescales in the same order as
    // unpipelined, so the bits are FA2's. K is double buffered (tile it + 1
    // loads where tile it − 1's S, retired, read), V triple buffered (where
    // tile it − 2's P·V read; every thread retired it before this barrier).
    for (int it = 0; it < nkt; it++) {
        wg_tile_ready();
        if (it + 1 < nkt) {
            wg_load<BN, D>(Ks + ((it + 1) & 1) * BN * D, kb, skv, (it + 1) * BN, T);
            wg_load<BN, D>(Vs + ((it + 1) % 3) * BN * D, vb, skv, (it + 1) * BN, T);
            cp_async_commit();
        }
        if (!QDESC && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (QDESC ? 1 : KS); kk++) wg_frag_a<BM>(qf[kk], Qs, warp * 16, kk * 16);
        }
        int k0 = it * BN;
        const uint32_t ka = smem_u32(Ks + (it & 1) * BN * D), va = smem_u32(Vs + (it % 3) * BN * D);

        // S = Q·Kᵀ (64 queries × BN keys), then tile it − 1's O += P·V (V MN-major)
        wg_keep(s);
        wg_keep(o);
        wg_keep(pa);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            if constexpr (QDESC)
                wgmma_ss<BN, 0>(s, kmajor<BM>(smem_u32(Qs), kk), kmajor<BN>(ka, kk), kk);
            else
                wgmma_rs<BN, 0>(s, qf[kk], kmajor<BN>(ka, kk), kk);
        }
        wgmma_commit();
        if (it > 0) {
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++) wgmma_rs<D, 1>(o, pa[ks], mnmajor<BN>(vp, ks), 1);
            wgmma_commit();
            wgmma_wait<1>(); // S (groups retire in order)
        } else {
            wgmma_wait<0>();
        }
        wg_keep(s);
        if (k0 + BN - 1 > wr0) { // the tile crosses the diagonal of some row of the warp
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + j * 8 + 2 * tq + (e & 1);
                    int row = wr0 + g + (e >> 1) * 8;
                    if (key > row) s[j][e] = -INFINITY;
                }
        }
        // Online softmax (attention_fa2.cu's). A warp whose rows all come
        // before the tile sees only −∞ here: its max stays (finite: key 0 of
        // tile 0 is visible to every row), its probabilities are 0.
        float c0, c1;
        fa2_online_softmax_p(s, m0, m1, l0, l1, sl2, c0, c1);
        wgmma_wait<0>(); // tile it − 1's P·V: O, pa and its V buffer are free
        wg_keep(o);
        wg_keep(pa);
        acc_scale_rows(o, c0, c1);
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) acc_to_a(pa[ks], s[2 * ks], s[2 * ks + 1]);
        vp = va;
    }
    // The last tile's O += P·V.
    wg_keep(o);
    wg_keep(pa);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) wgmma_rs<D, 1>(o, pa[ks], mnmajor<BN>(vp, ks), 1);
    wgmma_commit();
    wgmma_wait<0>();
    wg_keep(o);
    wg_keep(pa);
    bf16* ob = out + (long long)b * T * so + h * D;
    float* lrow = lse + (long long)bh * T;
    float ls0 = quad_add(l0), ls1 = quad_add(l1);
    fa2_store<D>(ob, so, wr0, T, o, 1.0f / ls0, 1.0f / ls1);
    if (tq == 0) {
        if (wr0 + g < T) lrow[wr0 + g] = (m0 * sl2 + log2f(ls0)) * kTcLn2;
        if (wr0 + g + 8 < T) lrow[wr0 + g + 8] = (m1 * sl2 + log2f(ls1)) * kTcLn2;
    }
#elif defined(__CUDA_ARCH__)
    __trap(); // needs sm_90a
#endif
}


// ---------------------------------------------------------------------------
// Backward: delta and dq. QREG: Q and dO fragments in registers.
template <int D, int BN, bool QREG>
__device__ void attn_bwd_dq_wg_impl(bf16* dq, float* delta, const bf16* q, const bf16* k, const bf16* v,
                                    const bf16* out, const bf16* dout, const float* lse, int B, int T, int H,
                                    int HKV, int sq, int skv, int so, int sd, float scale) {
#if defined(ATP_WG_BODY)
    constexpr int BM = ROWS, KS = D / 16, NK = BN / 8, DT = D / 8;
    bf16* Qs = wg_smem();        // BM × D
    bf16* Gs = Qs + BM * D;      // BM × D (dout)
    bf16* Ks = Gs + BM * D;      // 2 × BN × D
    bf16* Vs = Ks + 2 * BN * D;  // 2 × BN × D
    int bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / (H / HKV); // hk: h's key/value head
    int q0 = (gridDim.x - 1 - blockIdx.x) * BM; // longest first
    const bf16* qb = q + (long long)b * T * sq + h * D;
    const bf16* kb = k + (long long)b * T * skv + hk * D;
    const bf16* vb = v + (long long)b * T * skv + hk * D;
    const bf16* gb = dout + (long long)b * T * so + h * D;
    const bf16* ob = out + (long long)b * T * so + h * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int kend = q0 + BM < T ? q0 + BM : T;
    int nkt = (kend + BN - 1) / BN;
    int wr0 = q0 + warp * 16;

    wg_load<BM, D>(Qs, qb, sq, q0, T);
    wg_load<BM, D>(Gs, gb, so, q0, T);
    wg_load<BN, D>(Ks, kb, skv, 0, T);
    wg_load<BN, D>(Vs, vb, skv, 0, T);
    cp_async_commit();

    // delta of the warp's rows, read from global memory while the tiles load.
    float dsum = fa2_row_delta<D>(delta, gb, ob, so, bh, wr0, T);
    float D0 = __shfl_sync(ATP_FULL_MASK, dsum, 2 * g), D1 = __shfl_sync(ATP_FULL_MASK, dsum, 2 * (g + 8));

    const float sl2 = scale * kTcLog2e;
    int row0 = wr0 + g, row1 = row0 + 8;
    const float* lse_bh = lse + (long long)bh * T;
    float L0 = row0 < T ? lse_bh[row0] * kTcLog2e : 0.0f, L1 = row1 < T ? lse_bh[row1] * kTcLog2e : 0.0f;
    uint32_t qf[QREG ? KS : 1][4], gf[QREG ? KS : 1][4];
    float dqa[DT][4], s[NK][4], dp[NK][4];
    fa2_zero(dqa);
    fa2_zero(s);
    fa2_zero(dp);
    const uint32_t qa = smem_u32(Qs), ga = smem_u32(Gs);

    for (int it = 0; it < nkt; it++) {
        int buf = it & 1;
        wg_tile_ready();
        if (it + 1 < nkt) {
            wg_load<BN, D>(Ks + (buf ^ 1) * BN * D, kb, skv, (it + 1) * BN, T);
            wg_load<BN, D>(Vs + (buf ^ 1) * BN * D, vb, skv, (it + 1) * BN, T);
            cp_async_commit();
        }
        if (QREG && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (QREG ? KS : 1); kk++) {
                wg_frag_a<BM>(qf[kk], Qs, warp * 16, kk * 16);
                wg_frag_a<BM>(gf[kk], Gs, warp * 16, kk * 16);
            }
        }
        int k0 = it * BN;
        const uint32_t ka = smem_u32(Ks + buf * BN * D), va = smem_u32(Vs + buf * BN * D);

        // S = Q·Kᵀ, dP = dO·Vᵀ (64 queries × BN keys)
        wg_group(
            [&] {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    if constexpr (QREG) {
                        wgmma_rs<BN, 0>(s, qf[kk], kmajor<BN>(ka, kk), kk);
                        wgmma_rs<BN, 0>(dp, gf[kk], kmajor<BN>(va, kk), kk);
                    } else {
                        wgmma_ss<BN, 0>(s, kmajor<BM>(qa, kk), kmajor<BN>(ka, kk), kk);
                        wgmma_ss<BN, 0>(dp, kmajor<BM>(ga, kk), kmajor<BN>(va, kk), kk);
                    }
                }
            },
            s, dp);

        // P = exp(S − lse), dS = P∘(dP − delta); masked on the diagonal only
        fa2_dq_ds(s, dp, sl2, L0, L1, D0, D1, k0 + BN - 1 > wr0, k0, row0, row1);
        // dQ += dS·K (K MN-major: its rows are the product's K)
        uint32_t dsa[BN / 16][4];
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) acc_to_a(dsa[ks], dp[2 * ks], dp[2 * ks + 1]);
        wg_group(
            [&] {
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++) wgmma_rs<D, 1>(dqa, dsa[ks], mnmajor<BN>(ka, ks), 1);
            },
            dqa, dsa);
    }
    fa2_store<D>(dq + (long long)b * T * sd + h * D, sd, wr0, T, dqa, scale, scale);
#elif defined(__CUDA_ARCH__)
    __trap(); // needs sm_90a
#endif
}

// ---------------------------------------------------------------------------
// Backward: dk, dv. KREG: K and V fragments in registers.
template <int D, int BM, bool KREG>
__device__ void attn_bwd_dkdv_wg_impl(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v,
                                      const bf16* dout, const float* lse, const float* delta, int B, int T, int H,
                                      int HKV, int sq, int skv, int so, int sd, float scale) {
#if defined(ATP_WG_BODY)
    constexpr int BN = ROWS, KS = D / 16, NQ = BM / 8, DT = D / 8;
    static_assert(BM <= NTHR, "one thread per staged lse/delta");
    bf16* Ks = wg_smem();        // BN × D
    bf16* Vs = Ks + BN * D;      // BN × D
    bf16* Qs = Vs + BN * D;      // 2 × BM × D
    bf16* Gs = Qs + 2 * BM * D;  // 2 × BM × D (dout)
    float* Ls = reinterpret_cast<float*>(Gs + 2 * BM * D); // 2 × BM: lse·log2(e), +inf past T
    float* Ds = Ls + 2 * BM;                                // 2 × BM: delta, 0 past T
    int bk = blockIdx.y, b = bk / HKV, hk = bk - b * HKV, h0 = hk * (H / HKV); // h0: the group's first query head
    int k0 = blockIdx.x * BN; // block 0 has the most query tiles and starts first
    const bf16* kb = k + (long long)b * T * skv + hk * D;
    const bf16* vb = v + (long long)b * T * skv + hk * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int nqt = (T - k0 + BM - 1) / BM; // query tiles from the diagonal on (k0 < T), per query head
    int ntiles = H / HKV * nqt;       // the group's, head by head (fa2_group_tile)
    int kw = k0 + warp * 16;          // the warp's first key
    int tid = threadIdx.x;

    fa2_tile first = fa2_group_tile<D, BM>(q, dout, lse, delta, b, h0, 0, nqt, k0, T, H, sq, so);
    wg_load<BN, D>(Ks, kb, skv, k0, T);
    wg_load<BN, D>(Vs, vb, skv, k0, T);
    wg_load<BM, D>(Qs, first.qb, sq, k0, T);
    wg_load<BM, D>(Gs, first.gb, so, k0, T);
    cp_async_commit();
    if (tid < BM) {
        int qi = k0 + tid;
        fa2_lse_delta(Ls[tid], Ds[tid], first.lse_bh, first.delta_bh, qi, T);
    }

    const float sl2 = scale * kTcLog2e;
    int key0 = kw + g, key1 = key0 + 8;
    uint32_t kf[KREG ? KS : 1][4], vf[KREG ? KS : 1][4];
    float dka[DT][4], dva[DT][4], st[NQ][4], dpt[NQ][4];
    fa2_zero(dka);
    fa2_zero(dva);
    fa2_zero(st);
    fa2_zero(dpt);
    const uint32_t ka = smem_u32(Ks), va = smem_u32(Vs);

    for (int it = 0; it < ntiles; it++) {
        int buf = it & 1;
        int qs = k0 + it % nqt * BM; // fa2_group_tile's
        wg_tile_ready();
        float lnext = 0.0f, dnext = 0.0f;
        bool more = it + 1 < ntiles;
        if (more) {
            fa2_tile next = fa2_group_tile<D, BM>(q, dout, lse, delta, b, h0, it + 1, nqt, k0, T, H, sq, so);
            wg_load<BM, D>(Qs + (buf ^ 1) * BM * D, next.qb, sq, next.qs, T);
            wg_load<BM, D>(Gs + (buf ^ 1) * BM * D, next.gb, so, next.qs, T);
            cp_async_commit();
            if (tid < BM) {
                int qi = next.qs + tid;
                fa2_lse_delta(lnext, dnext, next.lse_bh, next.delta_bh, qi, T);
            }
        }
        if (KREG && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (KREG ? KS : 1); kk++) {
                wg_frag_a<BN>(kf[kk], Ks, warp * 16, kk * 16);
                wg_frag_a<BN>(vf[kk], Vs, warp * 16, kk * 16);
            }
        }
        const uint32_t qa = smem_u32(Qs + buf * BM * D), ga = smem_u32(Gs + buf * BM * D);
        const float* Lt = Ls + buf * BM;
        const float* Dt = Ds + buf * BM;

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (64 keys × BM queries)
        wg_group(
            [&] {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    if constexpr (KREG) {
                        wgmma_rs<BM, 0>(st, kf[kk], kmajor<BM>(qa, kk), kk);
                        wgmma_rs<BM, 0>(dpt, vf[kk], kmajor<BM>(ga, kk), kk);
                    } else {
                        wgmma_ss<BM, 0>(st, kmajor<BN>(ka, kk), kmajor<BM>(qa, kk), kk);
                        wgmma_ss<BM, 0>(dpt, kmajor<BN>(va, kk), kmajor<BM>(ga, kk), kk);
                    }
                }
            },
            st, dpt);

        // Pᵀ = exp(Sᵀ − lse), dSᵀ = Pᵀ∘(dPᵀ − delta); masked on the diagonal only
        fa2_dkdv_ds(st, dpt, Lt, Dt, sl2, qs < kw + 15, qs, key0, key1);
        // dV += Pᵀ·dO, dK += dSᵀ·Q (dO and Q MN-major: their rows are the K)
        uint32_t pa[BM / 16][4], dsa[BM / 16][4];
#pragma unroll
        for (int ks = 0; ks < BM / 16; ks++) {
            acc_to_a(pa[ks], st[2 * ks], st[2 * ks + 1]);
            acc_to_a(dsa[ks], dpt[2 * ks], dpt[2 * ks + 1]);
        }
        wg_group(
            [&] {
#pragma unroll
                for (int ks = 0; ks < BM / 16; ks++) {
                    wgmma_rs<D, 1>(dva, pa[ks], mnmajor<BM>(ga, ks), 1);
                    wgmma_rs<D, 1>(dka, dsa[ks], mnmajor<BM>(qa, ks), 1);
                }
            },
            dva, dka, pa, dsa);
        // The other buffer's lse/delta: read last in tile it − 1 (done by
        // every thread: the barrier above), read next after the next barrier.
        if (more && tid < BM) {
            Ls[(buf ^ 1) * BM + tid] = lnext;
            Ds[(buf ^ 1) * BM + tid] = dnext;
        }
    }
    fa2_store<D>(dk + (long long)b * T * sd + hk * D, sd, kw, T, dka, scale, scale);
    fa2_store<D>(dv + (long long)b * T * sd + hk * D, sd, kw, T, dva, 1.0f, 1.0f);
#elif defined(__CUDA_ARCH__)
    __trap(); // needs sm_90a
#endif
}

} // namespace wgattn
} // namespace atp

using namespace atp;

// out (B, T, H, D), lse (B·H, T); q rows sq apart, k, v (B, T, HKV, D) rows
// skv apart, out rows so apart: attn_fwd_fa2's arguments. grid (ceil(T/64),
// B·H), block 128, shared memory 1024 + (64 + 5·64)·D·2 bytes. D = 128 only
// (see the top).
KERNEL_LB(128) attn_fwd_wg_d128_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int HKV, int sq, int skv, int so, float scale) {
    wgattn::attn_fwd_wg_impl<128>(out, lse, q, k, v, B, T, H, HKV, sq, skv, so, scale);
}
// dq (row stride sd), delta (B, H, T) written; q (sq), k, v (skv), out,
// dout (so), lse: attn_bwd_dq_fa2's arguments. grid (ceil(T/64), B·H), block
// 128, shared memory as above.
KERNEL_LB(128) attn_bwd_dq_wg_d64_bf16(bf16* dq, float* delta, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const bf16* dout, const float* lse, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    wgattn::attn_bwd_dq_wg_impl<64, 64, true>(dq, delta, q, k, v, out, dout, lse, B, T, H, HKV, sq, skv, so, sd, scale);
}
KERNEL_LB(128) attn_bwd_dq_wg_d128_bf16(bf16* dq, float* delta, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const bf16* dout, const float* lse, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    wgattn::attn_bwd_dq_wg_impl<128, 64, false>(dq, delta, q, k, v, out, dout, lse, B, T, H, HKV, sq, skv, so, sd, scale);
}

// dk, dv (row stride sd); q (sq), k, v (skv), dout (so), lse, delta (from
// the dq kernel): attn_bwd_dkdv_fa2's arguments. grid (ceil(T/64), B·HKV),
// block 128.
KERNEL_LB(128) attn_bwd_dkdv_wg_d64_bf16(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    wgattn::attn_bwd_dkdv_wg_impl<64, 64, true>(dk, dv, q, k, v, dout, lse, delta, B, T, H, HKV, sq, skv, so, sd, scale);
}
KERNEL_LB(128) attn_bwd_dkdv_wg_d128_bf16(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    wgattn::attn_bwd_dkdv_wg_impl<128, 32, false>(dk, dv, q, k, v, dout, lse, delta, B, T, H, HKV, sq, skv, so, sd, scale);
}
