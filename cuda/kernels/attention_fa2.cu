// attention_fa2.cu: causal flash attention on tensor cores, second
// generation (FlashAttention-2's choices on mma.sync m16n8k16, bf16 inputs,
// fp32 accumulation), forward and a deterministic backward, for D = 64 and
// 128. Replaced the first generation (experimental/attention_tc.cu), whose
// fragment helpers it uses (attention_mma.cuh: frag_a, frag_b_rows,
// frag_b_cols, acc_to_a, quad_max, quad_add).
//
// Layout: as attention.cu, with explicit row strides (elements between
// consecutive t of one (b, h)), so q, k, v can be column slices of one
// fused projection output: element (b, t, h, d) of a tensor with row stride
// s is at ((b·T + t)·s + h·D + d). Grouped-query attention: q, out, dout, dq
// have H heads, k, v, dk, dv HKV (dividing H); query head h reads key/value
// head h / (H/HKV). Strides: sq for q; skv for k and v; so for out and dout;
// sd for the output a backward kernel writes (dq, or dk and dv). lse and
// delta (B, H, T) fp32.
//
// Common scheme:
//   - 128-row tiles per block: the forward and dq kernels own 128 queries,
//     the dk/dv kernel 128 keys. Warp w owns WR = 16·MT consecutive rows
//     (MT m-tiles of 16): a fragment read from shared memory feeds MT mmas.
//   - Streamed tiles (K/V in the forward and dq, Q/dO in dk/dv) are double
//     buffered with cp.async and ONE __syncthreads per tile: wait for the
//     tile's copies, barrier (which also says every warp is done with the
//     other buffer), then queue the next tile's copies into the other buffer
//     and compute on this one.
//   - Scores stay in registers (raw q·k); exponentials are fa2_exp2(fmaf(s,
//     scale·log2 e, −m)), one FMA each. The causal mask is applied only on
//     tiles that cross the warp's diagonal; a warp skips a tile that is all
//     masked for its rows (its barrier still runs).
//   - Rows past T: streamed rows are zero-filled; in the forward and dq a key
//     ≥ T is always > every valid query, so the diagonal mask covers it; in
//     dk/dv queries ≥ T have lse = +∞ (p = 0) and dO = 0. Nothing past T is
//     stored.
//
// Forward (attn_fwd_fa2_dD_bf16): grid (ceil(T/128), B·H), block 32·NW, key
//   tiles of 64; D = 64: 4 warps × 32 rows (MT = 2); D = 128: 8 warps × 16
//   rows (MT = 1; also for D = 64 as attn_fwd_fa2_d64w8_bf16, for tuning).
//   Block x takes query tile gridDim.x − 1 − x (longest
//   first). Shared (128 + 4·64)·(D + 8)·2 bytes: 55296 (D = 64), 104448
//   (D = 128).
// Backward, deterministic, two launches (no atomics, each output element
// written once by one thread):
//   attn_bwd_dq_fa2_dD_bf16: grid (ceil(T/128), B·H), block 256 (8 warps ×
//     16 queries). Computes delta = Σ dout·out of its own rows first (from
//     global memory, in registers; written to delta for the second kernel),
//     then streams key tiles of BN (64 for D = 64, 32 for D = 128) up to the
//     diagonal: S = Q·Kᵀ, dP = dO·Vᵀ, dS = P∘(dP − delta), dQ += dS·K.
//     Shared (2·128 + 4·BN)·(D + 8)·2 bytes: 73728 (D = 64), 104448 (D = 128).
//   attn_bwd_dkdv_fa2_dD_bf16: grid (ceil(T/128), B·HKV), block 256 (8 warps
//     × 16 keys); streams query tiles of BM (64 for D = 64, 32 for D = 128)
//     from the diagonal on: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q;
//     under GQA the tiles of the H/HKV query heads of its key/value head one
//     head after another (fa2_group_tile), into the same accumulators: the
//     group's sum in a fixed order, no atomics.
//     Runs after dq (it reads delta). Shared (2·128 + 4·BM)·(D + 8)·2 +
//     16·BM bytes: 74752 (D = 64), 104960 (D = 128).
#include "common.cuh"
#include "mma.cuh"
#include "attention_mma.cuh" // defines: frag_a, frag_b_rows, frag_b_cols, acc_to_a, acc_scale_rows, quad_max, quad_add, kTcLog2e

namespace atp {

// fa2_load queues cp.async copies of rows [r0, r0 + ROWS) of one (b, h)
// slice (base: element (b, 0, h, 0), rows rs elements apart) into dst (ROWS ×
// (D + 8)), NTHR threads; rows ≥ T are zero-filled.
template <int ROWS, int D, int NTHR>
__device__ __forceinline__ void fa2_load(bf16* dst, const bf16* base, int rs, int r0, int T) {
    constexpr int LD = D + 8, CPR = D / 8, N = ROWS * CPR;
#pragma unroll
    for (int c0 = 0; c0 < N; c0 += NTHR) {
        int c = c0 + (int)threadIdx.x;
        if (N % NTHR == 0 || c < N) {
            int r = c / CPR, ch = c % CPR;
            int t = r0 + r;
            bool valid = t < T;
            cp_async16(dst + r * LD + ch * 8, base + (long long)(valid ? t : 0) * rs + ch * 8, valid);
        }
    }
}

// fa2_store writes a warp's 16 rows (r0 + g, r0 + g + 8) × D of fp32
// accumulators times mul as bf16, rows ≥ T skipped; rows rs elements apart.
template <int D>
__device__ __forceinline__ void fa2_store(bf16* base, int rs, int r0, int T, const float (&acc)[D / 8][4], float mul0,
                                          float mul1) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int ra = r0 + g, rb = ra + 8;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        int col = j * 8 + 2 * t;
        if (ra < T)
            *reinterpret_cast<uint32_t*>(base + (long long)ra * rs + col) =
                pack_bf16x2(acc[j][0] * mul0, acc[j][1] * mul0);
        if (rb < T)
            *reinterpret_cast<uint32_t*>(base + (long long)rb * rs + col) =
                pack_bf16x2(acc[j][2] * mul1, acc[j][3] * mul1);
    }
}

// fa2_exp2: 2^x with one MUFU.EX2 (ex2.approx.ftz: relative error ~2⁻²², ample
// for bf16 probabilities; 2^−∞ = 0), without exp2f's range fix-ups.
__device__ __forceinline__ float fa2_exp2(float x) {
#if defined(ASYNCTP_EMU)
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

template <int N>
__device__ __forceinline__ void fa2_zero(float (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++) a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0.0f;
}

// fa2_online_softmax_p: one key tile's step of the online softmax for a
// warp's two row halves (rows g and g + 8 of its 16), all but the rescale
// of the output: the running maxima m (of raw scores) and the sums l move
// to the tile's new maxima, s (raw scores, −∞ where masked) becomes the
// tile's unnormalised probabilities, and c0, c1 are the factors the output
// accumulators must be rescaled by. sl2 = scale·log2 e. The caller
// guarantees a finite max (key 0 of tile 0 is visible to every row).
template <int NT>
__device__ __forceinline__ void fa2_online_softmax_p(float (&s)[NT][4], float& m0, float& m1, float& l0, float& l1,
                                                     float sl2, float& c0, float& c1) {
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
        mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    c0 = fa2_exp2((m0 - mx0) * sl2);
    c1 = fa2_exp2((m1 - mx1) * sl2);
    m0 = mx0;
    m1 = mx1;
    float ms0 = mx0 * sl2, ms1 = mx1 * sl2;
    float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        s[j][0] = fa2_exp2(fmaf(s[j][0], sl2, -ms0));
        s[j][1] = fa2_exp2(fmaf(s[j][1], sl2, -ms0));
        s[j][2] = fa2_exp2(fmaf(s[j][2], sl2, -ms1));
        s[j][3] = fa2_exp2(fmaf(s[j][3], sl2, -ms1));
        rs0 += s[j][0] + s[j][1];
        rs1 += s[j][2] + s[j][3];
    }
    l0 = l0 * c0 + rs0;
    l1 = l1 * c1 + rs1;
}

// fa2_online_softmax: fa2_online_softmax_p, then the rescale of o.
template <int NT, int DT>
__device__ __forceinline__ void fa2_online_softmax(float (&s)[NT][4], float (&o)[DT][4], float& m0, float& m1,
                                                   float& l0, float& l1, float sl2) {
    float c0, c1;
    fa2_online_softmax_p(s, m0, m1, l0, l1, sl2, c0, c1);
    acc_scale_rows(o, c0, c1);
}

// fa2_lse_delta: query qi's lse·log2 e and delta; +∞ and 0 past T (its
// probabilities are then 0).
__device__ __forceinline__ void fa2_lse_delta(float& l, float& d, const float* lse_bh, const float* delta_bh, int qi,
                                              int T) {
    l = qi < T ? lse_bh[qi] * kTcLog2e : INFINITY;
    d = qi < T ? delta_bh[qi] : 0.0f;
}

// fa2_group_tile is tile i of a dk/dv block's stream of query tiles under
// grouped-query attention: the block of key/value head hk of batch b runs
// the nqt tiles (of BM queries, from its diagonal k0 on) of each query head
// of its group, h0 = hk·(H/HKV) first: tile i is query tile i mod nqt of
// head h0 + i / nqt. It gives that head's slices of q (qb) and dout (gb),
// its lse and delta rows, and the tile's first query qs.
struct fa2_tile {
    const bf16* qb;
    const bf16* gb;
    const float* lse_bh;
    const float* delta_bh;
    int qs;
};
template <int D, int BM>
__device__ __forceinline__ fa2_tile fa2_group_tile(const bf16* q, const bf16* dout, const float* lse,
                                                   const float* delta, int b, int h0, int i, int nqt, int k0, int T,
                                                   int H, int sq, int so) {
    int h = h0 + i / nqt;
    long long bh = (long long)b * H + h;
    return {q + (long long)b * T * sq + h * D, dout + (long long)b * T * so + h * D, lse + bh * T, delta + bh * T,
            k0 + i % nqt * BM};
}

// fa2_row_delta: delta = Σ_d dout·out for the warp's 16 rows [wr0, wr0 +
// 16) of slice bh = (b, h) (gb, ob: element (b, 0, h, 0), rows so elements
// apart): two lanes per row, D/2 elements each, from global memory; written
// to delta (B, H, T) for rows < T; returns the row delta of lane l's pair
// (row wr0 + l/2).
template <int D>
__device__ __forceinline__ float fa2_row_delta(float* delta, const bf16* gb, const bf16* ob, int so, int bh, int wr0,
                                               int T) {
    int lane = threadIdx.x & 31;
    int r = wr0 + (lane >> 1), half = lane & 1;
    float acc = 0.0f;
    if (r < T) {
        const bf16* grow = gb + (long long)r * so + half * (D / 2);
        const bf16* orow = ob + (long long)r * so + half * (D / 2);
#pragma unroll
        for (int c = 0; c < D / 16; c++) {
            uint4 gv = *reinterpret_cast<const uint4*>(grow + c * 8);
            uint4 ov = *reinterpret_cast<const uint4*>(orow + c * 8);
            acc += bf16lo(gv.x) * bf16lo(ov.x) + bf16hi(gv.x) * bf16hi(ov.x);
            acc += bf16lo(gv.y) * bf16lo(ov.y) + bf16hi(gv.y) * bf16hi(ov.y);
            acc += bf16lo(gv.z) * bf16lo(ov.z) + bf16hi(gv.z) * bf16hi(ov.z);
            acc += bf16lo(gv.w) * bf16lo(ov.w) + bf16hi(gv.w) * bf16hi(ov.w);
        }
    }
    acc += __shfl_xor_sync(ATP_FULL_MASK, acc, 1);
    if (r < T && half == 0) delta[(long long)bh * T + r] = acc;
    return acc;
}

// fa2_dq_ds: the dq pass's P = exp(S − lse) and dS = P∘(dP − delta), in
// place of dp, for a warp's 16 query rows (row0, row1 = row0 + 8; L0, L1 =
// their lse·log2 e, D0, D1 their delta) × NK·8 keys from k0; keys > row are
// masked when diag (the tile crosses the warp's diagonal).
template <int NK>
__device__ __forceinline__ void fa2_dq_ds(const float (&s)[NK][4], float (&dp)[NK][4], float sl2, float L0,
                                          float L1, float D0, float D1, bool diag, int k0, int row0, int row1) {
    int tq = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < NK; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = fa2_exp2(fmaf(s[j][e], sl2, -(e < 2 ? L0 : L1)));
            if (diag) {
                int key = k0 + j * 8 + 2 * tq + (e & 1);
                if (key > (e < 2 ? row0 : row1)) p = 0.0f;
            }
            dp[j][e] = p * (dp[j][e] - (e < 2 ? D0 : D1));
        }
    }
}

// fa2_dkdv_ds: the dk/dv pass's Pᵀ = exp(Sᵀ − lse) into st and dSᵀ =
// Pᵀ∘(dPᵀ − delta) into dpt, for a warp's 16 key rows (key0, key1 = key0 +
// 8) × NQ·8 queries from qs, whose lse·log2 e and delta are Lt[i], Dt[i]
// (shared memory, i = query − qs); queries < key are masked when diag.
template <int NQ>
__device__ __forceinline__ void fa2_dkdv_ds(float (&st)[NQ][4], float (&dpt)[NQ][4], const float* Lt,
                                            const float* Dt, float sl2, bool diag, int qs, int key0, int key1) {
    int tq = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < NQ; j++) {
        float2 lv = *reinterpret_cast<const float2*>(Lt + j * 8 + 2 * tq);
        float2 dv2 = *reinterpret_cast<const float2*>(Dt + j * 8 + 2 * tq);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = fa2_exp2(fmaf(st[j][e], sl2, -((e & 1) ? lv.y : lv.x)));
            if (diag) {
                int qi = qs + j * 8 + 2 * tq + (e & 1);
                if (qi < (e < 2 ? key0 : key1)) p = 0.0f;
            }
            st[j][e] = p;
            dpt[j][e] = p * (dpt[j][e] - ((e & 1) ? dv2.y : dv2.x));
        }
    }
}

// ---------------------------------------------------------------------------
// Forward.
template <int D, int MT, int NW>
__device__ void attn_fwd_fa2_impl(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                                  int H, int HKV, int sq, int skv, int so, float scale) {
    constexpr int NTHR = 32 * NW, WR = 16 * MT, BM = WR * NW, BN = 64, LD = D + 8, KS = D / 16, NT = BN / 8,
                  DT = D / 8;
    ATP_DYN_SMEM(bf16, smem);
    bf16* Qs = smem;             // BM × LD
    bf16* Ks = Qs + BM * LD;     // 2 × BN × LD
    bf16* Vs = Ks + 2 * BN * LD; // 2 × BN × LD
    int bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / (H / HKV); // hk: h's key/value head
    int q0 = (gridDim.x - 1 - blockIdx.x) * BM;
    const bf16* qb = q + (long long)b * T * sq + h * D;
    const bf16* kb = k + (long long)b * T * skv + hk * D;
    const bf16* vb = v + (long long)b * T * skv + hk * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int kend = q0 + BM < T ? q0 + BM : T;
    int nkt = (kend + BN - 1) / BN;
    int wr0 = q0 + warp * WR; // the warp's first row

    fa2_load<BM, D, NTHR>(Qs, qb, sq, q0, T);
    fa2_load<BN, D, NTHR>(Ks, kb, skv, 0, T);
    fa2_load<BN, D, NTHR>(Vs, vb, skv, 0, T);
    cp_async_commit();

    const float sl2 = scale * kTcLog2e;
    uint32_t qf[MT][KS][4];
    float o[MT][DT][4];
    float m[MT][2], l[MT][2]; // m: running max of raw scores (scale > 0)
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        fa2_zero(o[mt]);
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int it = 0; it < nkt; it++) {
        int buf = it & 1;
        cp_async_wait<0>();
        __syncthreads(); // tile it has landed; every warp is done with tile it − 1
        if (it + 1 < nkt) {
            fa2_load<BN, D, NTHR>(Ks + (buf ^ 1) * BN * LD, kb, skv, (it + 1) * BN, T);
            fa2_load<BN, D, NTHR>(Vs + (buf ^ 1) * BN * LD, vb, skv, (it + 1) * BN, T);
            cp_async_commit();
        }
        if (it == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < KS; kk++) frag_a(qf[mt][kk], Qs, LD, warp * WR + mt * 16, kk * 16);
        }
        int k0 = it * BN;
        if (k0 > wr0 + WR - 1) continue; // every key of the tile is after every row of the warp
        const bf16* Kt = Ks + buf * BN * LD;
        const bf16* Vt = Vs + buf * BN * LD;

        // S = Q·Kᵀ (WR × BN per warp)
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) fa2_zero(s[mt]);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j2 = 0; j2 < NT / 2; j2++) {
                uint32_t kf[4];
                frag_b_rows(kf, Kt, LD, j2 * 16, kk * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16_16816(s[mt][2 * j2], qf[mt][kk], kf[0], kf[1]);
                    mma_bf16_16816(s[mt][2 * j2 + 1], qf[mt][kk], kf[2], kf[3]);
                }
            }
        }
        if (k0 + BN - 1 > wr0) { // the tile crosses the diagonal of some row of the warp
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int key = k0 + j * 8 + 2 * tq + (e & 1);
                        int row = wr0 + mt * 16 + g + (e >> 1) * 8;
                        if (key > row) s[mt][j][e] = -INFINITY;
                    }
        }
        // Online softmax (finite maxima: key 0 of tile 0 is visible to every row).
#pragma unroll
        for (int mt = 0; mt < MT; mt++) fa2_online_softmax(s[mt], o[mt], m[mt][0], m[mt][1], l[mt][0], l[mt][1], sl2);
        // O += P·V
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) acc_to_a(pa[mt], s[mt][2 * ks], s[mt][2 * ks + 1]);
#pragma unroll
            for (int d2 = 0; d2 < DT / 2; d2++) {
                uint32_t vf[4];
                frag_b_cols(vf, Vt, LD, ks * 16, d2 * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16_16816(o[mt][2 * d2], pa[mt], vf[0], vf[1]);
                    mma_bf16_16816(o[mt][2 * d2 + 1], pa[mt], vf[2], vf[3]);
                }
            }
        }
    }
    bf16* ob = out + (long long)b * T * so + h * D;
    float* lrow = lse + (long long)bh * T;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = quad_add(l[mt][0]), l1 = quad_add(l[mt][1]);
        int r0 = wr0 + mt * 16;
        fa2_store<D>(ob, so, r0, T, o[mt], 1.0f / l0, 1.0f / l1);
        if (tq == 0) {
            if (r0 + g < T) lrow[r0 + g] = (m[mt][0] * sl2 + log2f(l0)) * kTcLn2;
            if (r0 + g + 8 < T) lrow[r0 + g + 8] = (m[mt][1] * sl2 + log2f(l1)) * kTcLn2;
        }
    }
}

// ---------------------------------------------------------------------------
// Backward: delta and dq.
template <int D, int BN>
__device__ void attn_bwd_dq_fa2_impl(bf16* dq, float* delta, const bf16* q, const bf16* k, const bf16* v,
                                     const bf16* out, const bf16* dout, const float* lse, int B, int T, int H,
                                     int HKV, int sq, int skv, int so, int sd, float scale) {
    constexpr int NW = 8, NTHR = 32 * NW, BM = 16 * NW, LD = D + 8, KS = D / 16, NK = BN / 8, DT = D / 8;
    ATP_DYN_SMEM(bf16, smem);
    bf16* Qs = smem;             // BM × LD
    bf16* Gs = Qs + BM * LD;     // BM × LD (dout)
    bf16* Ks = Gs + BM * LD;     // 2 × BN × LD
    bf16* Vs = Ks + 2 * BN * LD; // 2 × BN × LD
    int bh = blockIdx.y, b = bh / H, h = bh - b * H, hk = h / (H / HKV); // hk: h's key/value head
    int q0 = (gridDim.x - 1 - blockIdx.x) * BM;
    const bf16* qb = q + (long long)b * T * sq + h * D;
    const bf16* kb = k + (long long)b * T * skv + hk * D;
    const bf16* vb = v + (long long)b * T * skv + hk * D;
    const bf16* gb = dout + (long long)b * T * so + h * D;
    const bf16* ob = out + (long long)b * T * so + h * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int kend = q0 + BM < T ? q0 + BM : T;
    int nkt = (kend + BN - 1) / BN;
    int wr0 = q0 + warp * 16;

    fa2_load<BM, D, NTHR>(Qs, qb, sq, q0, T);
    fa2_load<BM, D, NTHR>(Gs, gb, so, q0, T);
    fa2_load<BN, D, NTHR>(Ks, kb, skv, 0, T);
    fa2_load<BN, D, NTHR>(Vs, vb, skv, 0, T);
    cp_async_commit();

    // delta of the warp's rows, read from global memory while the tiles load.
    float dsum = fa2_row_delta<D>(delta, gb, ob, so, bh, wr0, T);
    float D0 = __shfl_sync(ATP_FULL_MASK, dsum, 2 * g), D1 = __shfl_sync(ATP_FULL_MASK, dsum, 2 * (g + 8));

    const float sl2 = scale * kTcLog2e;
    int row0 = wr0 + g, row1 = row0 + 8;
    const float* lse_bh = lse + (long long)bh * T;
    float L0 = row0 < T ? lse_bh[row0] * kTcLog2e : 0.0f, L1 = row1 < T ? lse_bh[row1] * kTcLog2e : 0.0f;
    uint32_t qf[KS][4], gf[KS][4];
    float dqa[DT][4];
    fa2_zero(dqa);

    for (int it = 0; it < nkt; it++) {
        int buf = it & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < nkt) {
            fa2_load<BN, D, NTHR>(Ks + (buf ^ 1) * BN * LD, kb, skv, (it + 1) * BN, T);
            fa2_load<BN, D, NTHR>(Vs + (buf ^ 1) * BN * LD, vb, skv, (it + 1) * BN, T);
            cp_async_commit();
        }
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                frag_a(qf[kk], Qs, LD, warp * 16, kk * 16);
                frag_a(gf[kk], Gs, LD, warp * 16, kk * 16);
            }
        }
        int k0 = it * BN;
        if (k0 > wr0 + 15) continue;
        const bf16* Kt = Ks + buf * BN * LD;
        const bf16* Vt = Vs + buf * BN * LD;

        // S = Q·Kᵀ, dP = dO·Vᵀ (16 queries × BN keys per warp)
        float s[NK][4], dp[NK][4];
        fa2_zero(s);
        fa2_zero(dp);
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j2 = 0; j2 < NK / 2; j2++) {
                uint32_t kf[4], vf[4];
                frag_b_rows(kf, Kt, LD, j2 * 16, kk * 16);
                frag_b_rows(vf, Vt, LD, j2 * 16, kk * 16);
                mma_bf16_16816(s[2 * j2], qf[kk], kf[0], kf[1]);
                mma_bf16_16816(s[2 * j2 + 1], qf[kk], kf[2], kf[3]);
                mma_bf16_16816(dp[2 * j2], gf[kk], vf[0], vf[1]);
                mma_bf16_16816(dp[2 * j2 + 1], gf[kk], vf[2], vf[3]);
            }
        }
        // P = exp(S − lse), dS = P∘(dP − delta); masked on the diagonal only
        fa2_dq_ds(s, dp, sl2, L0, L1, D0, D1, k0 + BN - 1 > wr0, k0, row0, row1);
        // dQ += dS·K
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t dsa[4];
            acc_to_a(dsa, dp[2 * ks], dp[2 * ks + 1]);
#pragma unroll
            for (int d2 = 0; d2 < DT / 2; d2++) {
                uint32_t kf[4];
                frag_b_cols(kf, Kt, LD, ks * 16, d2 * 16);
                mma_bf16_16816(dqa[2 * d2], dsa, kf[0], kf[1]);
                mma_bf16_16816(dqa[2 * d2 + 1], dsa, kf[2], kf[3]);
            }
        }
    }
    fa2_store<D>(dq + (long long)b * T * sd + h * D, sd, wr0, T, dqa, scale, scale);
}

// ---------------------------------------------------------------------------
// Backward: dk, dv. HOLD: keep the K and V fragments in registers for the
// whole pass (D = 64) instead of reading them again per query tile.
template <int D, int BM, bool HOLD>
__device__ void attn_bwd_dkdv_fa2_impl(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v,
                                       const bf16* dout, const float* lse, const float* delta, int B, int T, int H,
                                       int HKV, int sq, int skv, int so, int sd, float scale) {
    constexpr int NW = 8, NTHR = 32 * NW, BN = 16 * NW, LD = D + 8, KS = D / 16, NQ = BM / 8, DT = D / 8;
    static_assert(BM <= NTHR, "one thread per staged lse/delta");
    ATP_DYN_SMEM(bf16, smem);
    bf16* Ks = smem;             // BN × LD
    bf16* Vs = Ks + BN * LD;     // BN × LD
    bf16* Qs = Vs + BN * LD;     // 2 × BM × LD
    bf16* Gs = Qs + 2 * BM * LD; // 2 × BM × LD (dout)
    float* Ls = reinterpret_cast<float*>(Gs + 2 * BM * LD); // 2 × BM: lse·log2(e), +inf past T
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
    fa2_load<BN, D, NTHR>(Ks, kb, skv, k0, T);
    fa2_load<BN, D, NTHR>(Vs, vb, skv, k0, T);
    fa2_load<BM, D, NTHR>(Qs, first.qb, sq, k0, T);
    fa2_load<BM, D, NTHR>(Gs, first.gb, so, k0, T);
    cp_async_commit();
    if (tid < BM) {
        int qi = k0 + tid;
        fa2_lse_delta(Ls[tid], Ds[tid], first.lse_bh, first.delta_bh, qi, T);
    }

    const float sl2 = scale * kTcLog2e;
    int key0 = kw + g, key1 = key0 + 8;
    uint32_t kf[HOLD ? KS : 1][4], vf[HOLD ? KS : 1][4];
    float dka[DT][4], dva[DT][4];
    fa2_zero(dka);
    fa2_zero(dva);

    for (int it = 0; it < ntiles; it++) {
        int buf = it & 1;
        int qs = k0 + it % nqt * BM; // fa2_group_tile's
        cp_async_wait<0>();
        __syncthreads();
        float lnext = 0.0f, dnext = 0.0f;
        bool more = it + 1 < ntiles;
        if (more) {
            fa2_tile next = fa2_group_tile<D, BM>(q, dout, lse, delta, b, h0, it + 1, nqt, k0, T, H, sq, so);
            fa2_load<BM, D, NTHR>(Qs + (buf ^ 1) * BM * LD, next.qb, sq, next.qs, T);
            fa2_load<BM, D, NTHR>(Gs + (buf ^ 1) * BM * LD, next.gb, so, next.qs, T);
            cp_async_commit();
            if (tid < BM) {
                int qi = next.qs + tid;
                fa2_lse_delta(lnext, dnext, next.lse_bh, next.delta_bh, qi, T);
            }
        }
        if (HOLD && it == 0) {
#pragma unroll
            for (int kk = 0; kk < (HOLD ? KS : 1); kk++) {
                frag_a(kf[kk], Ks, LD, warp * 16, kk * 16);
                frag_a(vf[kk], Vs, LD, warp * 16, kk * 16);
            }
        }
        if (qs + BM - 1 >= kw) { // some query of the tile sees some key of the warp
            const bf16* Qt = Qs + buf * BM * LD;
            const bf16* Gt = Gs + buf * BM * LD;
            const float* Lt = Ls + buf * BM;
            const float* Dt = Ds + buf * BM;

            // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 keys × BM queries per warp)
            float st[NQ][4], dpt[NQ][4];
            fa2_zero(st);
            fa2_zero(dpt);
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t ka[4], va[4];
                if (HOLD) {
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        ka[r] = kf[HOLD ? kk : 0][r];
                        va[r] = vf[HOLD ? kk : 0][r];
                    }
                } else {
                    frag_a(ka, Ks, LD, warp * 16, kk * 16);
                    frag_a(va, Vs, LD, warp * 16, kk * 16);
                }
#pragma unroll
                for (int j2 = 0; j2 < NQ / 2; j2++) {
                    uint32_t qf[4], gf[4];
                    frag_b_rows(qf, Qt, LD, j2 * 16, kk * 16);
                    frag_b_rows(gf, Gt, LD, j2 * 16, kk * 16);
                    mma_bf16_16816(st[2 * j2], ka, qf[0], qf[1]);
                    mma_bf16_16816(st[2 * j2 + 1], ka, qf[2], qf[3]);
                    mma_bf16_16816(dpt[2 * j2], va, gf[0], gf[1]);
                    mma_bf16_16816(dpt[2 * j2 + 1], va, gf[2], gf[3]);
                }
            }
            // Pᵀ = exp(Sᵀ − lse), dSᵀ = Pᵀ∘(dPᵀ − delta); masked on the diagonal only
            fa2_dkdv_ds(st, dpt, Lt, Dt, sl2, qs < kw + 15, qs, key0, key1);
            // dV += Pᵀ·dO, dK += dSᵀ·Q
#pragma unroll
            for (int ks = 0; ks < BM / 16; ks++) {
                uint32_t pa[4], dsa[4];
                acc_to_a(pa, st[2 * ks], st[2 * ks + 1]);
                acc_to_a(dsa, dpt[2 * ks], dpt[2 * ks + 1]);
#pragma unroll
                for (int d2 = 0; d2 < DT / 2; d2++) {
                    uint32_t gf[4], qf[4];
                    frag_b_cols(gf, Gt, LD, ks * 16, d2 * 16);
                    frag_b_cols(qf, Qt, LD, ks * 16, d2 * 16);
                    mma_bf16_16816(dva[2 * d2], pa, gf[0], gf[1]);
                    mma_bf16_16816(dva[2 * d2 + 1], pa, gf[2], gf[3]);
                    mma_bf16_16816(dka[2 * d2], dsa, qf[0], qf[1]);
                    mma_bf16_16816(dka[2 * d2 + 1], dsa, qf[2], qf[3]);
                }
            }
        }
        // The other buffer's lse/delta: read last in tile it − 1 (done by
        // every warp: the barrier above), read next after the next barrier.
        if (more && tid < BM) {
            Ls[(buf ^ 1) * BM + tid] = lnext;
            Ds[(buf ^ 1) * BM + tid] = dnext;
        }
    }
    fa2_store<D>(dk + (long long)b * T * sd + hk * D, sd, kw, T, dka, scale, scale);
    fa2_store<D>(dv + (long long)b * T * sd + hk * D, sd, kw, T, dva, 1.0f, 1.0f);
}

} // namespace atp

using namespace atp;

// out, q (B, T, H, D), k, v (B, T, HKV, D) with row strides so (out), sq
// (q) and skv (k, v); lse (B, H, T). grid (ceil(T/128), B·H); block 128
// (D = 64) or 256 (D = 128); shared (128 + 4·64)·(D + 8)·2 bytes.
KERNEL_LB(128) attn_fwd_fa2_d64_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int HKV, int sq, int skv, int so, float scale) {
    attn_fwd_fa2_impl<64, 2, 4>(out, lse, q, k, v, B, T, H, HKV, sq, skv, so, scale);
}
// D = 64 with 8 warps × 16 rows (block 256): fewer registers, more warps
// per SM, half the reuse of each K/V fragment; picked from Go for tuning.
KERNEL_LB(256) attn_fwd_fa2_d64w8_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int HKV, int sq, int skv, int so, float scale) {
    attn_fwd_fa2_impl<64, 1, 8>(out, lse, q, k, v, B, T, H, HKV, sq, skv, so, scale);
}
KERNEL_LB(256) attn_fwd_fa2_d128_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int HKV, int sq, int skv, int so, float scale) {
    attn_fwd_fa2_impl<128, 1, 8>(out, lse, q, k, v, B, T, H, HKV, sq, skv, so, scale);
}

// dq (row stride sd), delta (B, H, T) written; q (sq), k, v (skv), out,
// dout (so), lse. grid (ceil(T/128), B·H), block 256, shared (256 +
// 4·BN)·(D + 8)·2 bytes, BN = 64 (D = 64) or 32 (D = 128).
KERNEL_LB(256) attn_bwd_dq_fa2_d64_bf16(bf16* dq, float* delta, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const bf16* dout, const float* lse, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    attn_bwd_dq_fa2_impl<64, 64>(dq, delta, q, k, v, out, dout, lse, B, T, H, HKV, sq, skv, so, sd, scale);
}
KERNEL_LB(256) attn_bwd_dq_fa2_d128_bf16(bf16* dq, float* delta, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const bf16* dout, const float* lse, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    attn_bwd_dq_fa2_impl<128, 32>(dq, delta, q, k, v, out, dout, lse, B, T, H, HKV, sq, skv, so, sd, scale);
}

// dk, dv (row stride sd); q (sq), k, v (skv), dout (so), lse, delta (from
// the dq kernel). grid (ceil(T/128), B·HKV), block 256, shared (256 +
// 4·BM)·(D + 8)·2 + 16·BM bytes, BM = 64 (D = 64) or 32 (D = 128).
KERNEL_LB(256) attn_bwd_dkdv_fa2_d64_bf16(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    attn_bwd_dkdv_fa2_impl<64, 64, true>(dk, dv, q, k, v, dout, lse, delta, B, T, H, HKV, sq, skv, so, sd, scale);
}
KERNEL_LB(256) attn_bwd_dkdv_fa2_d128_bf16(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta, int B, int T, int H, int HKV, int sq, int skv, int so, int sd, float scale) {
    attn_bwd_dkdv_fa2_impl<128, 32, false>(dk, dv, q, k, v, dout, lse, delta, B, T, H, HKV, sq, skv, so, sd, scale);
}
