// attention_tc.cu: causal flash attention on tensor cores (mma.sync
// m16n8k16, bf16 inputs, fp32 accumulation), forward and backward, for head
// dims D = 64 and 128. Same contract as attention.cu (which has the layouts,
// the general CUDA-core kernels, and attn_bwd_delta, which the backward here
// reuses); the Go side picks these for bf16, D ∈ {64, 128} and 16-byte
// aligned tensors.
//
// Common scheme (FlashAttention-2 style, warp-level mma):
//   - 4 warps per block; each warp owns 16 rows of the block's row tile
//     (queries in the forward and dq kernels, keys in the dk/dv kernel).
//   - Tiles of (rows, D) bf16 are staged in shared memory with cp.async
//     (16-byte chunks, zero-filled past T), rows padded to D + 8 elements so
//     the 8 rows an ldmatrix reads fall in distinct banks; the streamed tiles
//     are double-buffered (the next tile loads while this one is used).
//   - Matrix fragments come from shared memory with ldmatrix (.trans where
//     the operand must be read across rows); the score accumulators are
//     turned into the A operand of the next product in registers (rounded to
//     bf16), as FlashAttention-2 does.
//   - Scores are kept in the log2 domain: s·scale·log2(e), exp2f.
//   - Causal mask: key > query, or either ≥ T, gives probability 0.
//
// Forward (attn_fwd_tc): grid (ceil(T/64), B·H), block 128, dynamic shared
// memory (64 + 4·64)·(D + 8)·2 bytes. Block x handles query tile
// gridDim.x − 1 − x (the longest rows start first); it streams key/value
// tiles of 64 with an online softmax, then writes out and lse.
//
// Backward, deterministic (no atomics):
//   attn_bwd_dkdv_tc: grid (ceil(T/64), B·H), block 128. Block x owns keys
//     [64x, 64x + 64) (16 per warp) and streams query tiles of BM (64 for
//     D = 64, 32 for D = 128) from the diagonal on: Sᵀ = K·Qᵀ, Pᵀ =
//     exp(Sᵀ − lse), dV += Pᵀ·dO, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ∘(dPᵀ − delta),
//     dK += dSᵀ·Q; dK·scale and dV written once. Shared memory
//     (2·64 + 4·BM)·(D + 8)·2 + 16·BM bytes.
//   attn_bwd_dq_tc: grid (ceil(T/64), B·H), block 128. Block x owns queries
//     of tile gridDim.x − 1 − x (16 per warp), streams key tiles of BN (64
//     for D = 64, 32 for D = 128) up to the diagonal: S = Q·Kᵀ, P, dP =
//     dO·Vᵀ, dS = P∘(dP − delta), dQ += dS·K; dQ·scale written once. Shared
//     memory (2·64 + 4·BN)·(D + 8)·2 bytes.
#include "../common.cuh"
#include "../attention_mma.cuh" // defines: the fragment helpers this file had (frag_a, acc_to_a, quad_max, ...)

namespace atp {

// tc_load_rows queues cp.async copies of rows [r0, r0 + ROWS) of one (b, h)
// slice (base: element (b, 0, h, 0); consecutive t are rs elements apart)
// into dst (ROWS × (D + 8)); rows ≥ T are zero-filled.
template <int ROWS, int D>
__device__ __forceinline__ void tc_load_rows(bf16* dst, const bf16* base, long long rs, int r0, int T) {
    constexpr int LD = D + 8, CPR = D / 8;
    for (int c = threadIdx.x; c < ROWS * CPR; c += blockDim.x) {
        int r = c / CPR, ch = c - r * CPR;
        int t = r0 + r;
        bool valid = t < T;
        cp_async16(dst + r * LD + ch * 8, base + (long long)(valid ? t : 0) * rs + ch * 8, valid);
    }
}

// store_rows16 writes a warp's 16 rows × D of fp32 accumulators (acc[D/8][4],
// rows r0 + g and r0 + g + 8) scaled by mul0 / mul1, as bf16, skipping rows
// ≥ T. base is element (b, 0, h, 0); rows are rs elements apart.
template <int D>
__device__ __forceinline__ void store_rows16(bf16* base, long long rs, int r0, int T, const float (&acc)[D / 8][4],
                                             float mul0, float mul1) {
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

// ---------------------------------------------------------------------------
// Forward.
template <int D>
__device__ void attn_fwd_tc_impl(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                                 int H, float scale) {
    constexpr int BM = 64, BN = 64, LD = D + 8, KS = D / 16, NT = BN / 8, DT = D / 8;
    ATP_DYN_SMEM(bf16, smem);
    bf16* Qs = smem;             // BM × LD
    bf16* Ks = Qs + BM * LD;     // 2 × BN × LD
    bf16* Vs = Ks + 2 * BN * LD; // 2 × BN × LD
    int bh = blockIdx.y, b = bh / H, h = bh - b * H;
    int q0 = (gridDim.x - 1 - blockIdx.x) * BM;
    long long rs = (long long)H * D;
    long long base = ((long long)b * T * H + h) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int kend = q0 + BM < T ? q0 + BM : T;
    int nkt = (kend + BN - 1) / BN;

    tc_load_rows<BM, D>(Qs, q + base, rs, q0, T);
    tc_load_rows<BN, D>(Ks, k + base, rs, 0, T);
    tc_load_rows<BN, D>(Vs, v + base, rs, 0, T);
    cp_async_commit();

    const float sl2 = scale * kTcLog2e;
    int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    uint32_t qf[KS][4];
    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int it = 0; it < nkt; it++) {
        int buf = it & 1;
        if (it + 1 < nkt) {
            tc_load_rows<BN, D>(Ks + (buf ^ 1) * BN * LD, k + base, rs, (it + 1) * BN, T);
            tc_load_rows<BN, D>(Vs + (buf ^ 1) * BN * LD, v + base, rs, (it + 1) * BN, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) frag_a(qf[kk], Qs, LD, warp * 16, kk * 16);
        }
        const bf16* Kt = Ks + buf * BN * LD;
        const bf16* Vt = Vs + buf * BN * LD;
        int k0 = it * BN;

        // S = Q·Kᵀ (16 × BN per warp)
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j2 = 0; j2 < NT / 2; j2++) {
                uint32_t kf[4];
                frag_b_rows(kf, Kt, LD, j2 * 16, kk * 16);
                mma_bf16_16816(s[2 * j2], qf[kk], kf[0], kf[1]);
                mma_bf16_16816(s[2 * j2 + 1], qf[kk], kf[2], kf[3]);
            }
        }
        // Mask, scale, online softmax.
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * tq + (e & 1);
                int row = e < 2 ? row0 : row1;
                float x = s[j][e] * sl2;
                s[j][e] = (key > row || key >= T) ? -INFINITY : x;
            }
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        mx0 = quad_max(mx0);
        mx1 = quad_max(mx1);
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1); // finite: key 0 is visible to every row
        float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        float rs0 = 0.0f, rs1 = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = exp2f(s[j][0] - mn0);
            s[j][1] = exp2f(s[j][1] - mn0);
            s[j][2] = exp2f(s[j][2] - mn1);
            s[j][3] = exp2f(s[j][3] - mn1);
            rs0 += s[j][0] + s[j][1];
            rs1 += s[j][2] + s[j][3];
        }
        l0 = l0 * c0 + rs0;
        l1 = l1 * c1 + rs1;
        acc_scale_rows(o, c0, c1);
        // O += P·V
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t pa[4];
            acc_to_a(pa, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
            for (int d2 = 0; d2 < DT / 2; d2++) {
                uint32_t vf[4];
                frag_b_cols(vf, Vt, LD, ks * 16, d2 * 16);
                mma_bf16_16816(o[2 * d2], pa, vf[0], vf[1]);
                mma_bf16_16816(o[2 * d2 + 1], pa, vf[2], vf[3]);
            }
        }
        __syncthreads(); // every warp is done with this buffer before it is refilled
    }
    l0 = quad_add(l0);
    l1 = quad_add(l1);
    store_rows16<D>(out + base, rs, q0 + warp * 16, T, o, 1.0f / l0, 1.0f / l1);
    if (tq == 0) {
        float* lrow = lse + (long long)bh * T;
        if (row0 < T) lrow[row0] = (m0 + log2f(l0)) * kTcLn2;
        if (row1 < T) lrow[row1] = (m1 + log2f(l1)) * kTcLn2;
    }
}

// ---------------------------------------------------------------------------
// Backward: dk, dv.
template <int D, int BM>
__device__ void attn_bwd_dkdv_tc_impl(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v,
                                      const bf16* dout, const float* lse, const float* delta, int B, int T, int H,
                                      float scale) {
    constexpr int BN = 64, LD = D + 8, KS = D / 16, NQ = BM / 8, DT = D / 8;
    ATP_DYN_SMEM(bf16, smem);
    bf16* Ks = smem;             // BN × LD
    bf16* Vs = Ks + BN * LD;     // BN × LD
    bf16* Qs = Vs + BN * LD;     // 2 × BM × LD
    bf16* Gs = Qs + 2 * BM * LD; // 2 × BM × LD (dout)
    float* Ls = reinterpret_cast<float*>(Gs + 2 * BM * LD); // 2 × BM: lse·log2(e), +inf past T
    float* Ds = Ls + 2 * BM;                                // 2 × BM: delta
    int bh = blockIdx.y, b = bh / H, h = bh - b * H;
    int k0 = blockIdx.x * BN;
    long long rs = (long long)H * D;
    long long base = ((long long)b * T * H + h) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const float* lse_bh = lse + (long long)bh * T;
    const float* delta_bh = delta + (long long)bh * T;
    int nqt = (T - k0 + BM - 1) / BM; // query tiles from the diagonal on (k0 < T)

    auto stage = [&](int buf, int qs) {
        tc_load_rows<BM, D>(Qs + buf * BM * LD, q + base, rs, qs, T);
        tc_load_rows<BM, D>(Gs + buf * BM * LD, dout + base, rs, qs, T);
        for (int i = threadIdx.x; i < BM; i += blockDim.x) {
            int qi = qs + i;
            Ls[buf * BM + i] = qi < T ? lse_bh[qi] * kTcLog2e : INFINITY;
            Ds[buf * BM + i] = qi < T ? delta_bh[qi] : 0.0f;
        }
    };
    tc_load_rows<BN, D>(Ks, k + base, rs, k0, T);
    tc_load_rows<BN, D>(Vs, v + base, rs, k0, T);
    stage(0, k0);
    cp_async_commit();

    const float sl2 = scale * kTcLog2e;
    int key0 = k0 + warp * 16 + g, key1 = key0 + 8;
    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) {
        dka[j][0] = dka[j][1] = dka[j][2] = dka[j][3] = 0.0f;
        dva[j][0] = dva[j][1] = dva[j][2] = dva[j][3] = 0.0f;
    }
    for (int it = 0; it < nqt; it++) {
        int buf = it & 1;
        int qs = k0 + it * BM;
        if (it + 1 < nqt) {
            stage(buf ^ 1, qs + BM);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* Qt = Qs + buf * BM * LD;
        const bf16* Gt = Gs + buf * BM * LD;
        const float* Lt = Ls + buf * BM;
        const float* Dt = Ds + buf * BM;

        // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (16 keys × BM queries per warp)
        float st[NQ][4], dpt[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.0f;
            dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t ka[4], va[4];
            frag_a(ka, Ks, LD, warp * 16, kk * 16);
            frag_a(va, Vs, LD, warp * 16, kk * 16);
#pragma unroll
            for (int j2 = 0; j2 < NQ / 2; j2++) {
                uint32_t qb[4], gb[4];
                frag_b_rows(qb, Qt, LD, j2 * 16, kk * 16);
                frag_b_rows(gb, Gt, LD, j2 * 16, kk * 16);
                mma_bf16_16816(st[2 * j2], ka, qb[0], qb[1]);
                mma_bf16_16816(st[2 * j2 + 1], ka, qb[2], qb[3]);
                mma_bf16_16816(dpt[2 * j2], va, gb[0], gb[1]);
                mma_bf16_16816(dpt[2 * j2 + 1], va, gb[2], gb[3]);
            }
        }
        // Pᵀ = exp(Sᵀ − lse) (masked), dSᵀ = Pᵀ∘(dPᵀ − delta)
#pragma unroll
        for (int j = 0; j < NQ; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qc = j * 8 + 2 * tq + (e & 1);
                int qi = qs + qc;
                int key = e < 2 ? key0 : key1;
                float p = qi >= key ? exp2f(st[j][e] * sl2 - Lt[qc]) : 0.0f; // Lt = +inf past T
                st[j][e] = p;
                dpt[j][e] = p * (dpt[j][e] - Dt[qc]);
            }
        }
        // dV += Pᵀ·dO, dK += dSᵀ·Q
#pragma unroll
        for (int ks = 0; ks < BM / 16; ks++) {
            uint32_t pa[4], dsa[4];
            acc_to_a(pa, st[2 * ks], st[2 * ks + 1]);
            acc_to_a(dsa, dpt[2 * ks], dpt[2 * ks + 1]);
#pragma unroll
            for (int d2 = 0; d2 < DT / 2; d2++) {
                uint32_t gb[4], qb[4];
                frag_b_cols(gb, Gt, LD, ks * 16, d2 * 16);
                frag_b_cols(qb, Qt, LD, ks * 16, d2 * 16);
                mma_bf16_16816(dva[2 * d2], pa, gb[0], gb[1]);
                mma_bf16_16816(dva[2 * d2 + 1], pa, gb[2], gb[3]);
                mma_bf16_16816(dka[2 * d2], dsa, qb[0], qb[1]);
                mma_bf16_16816(dka[2 * d2 + 1], dsa, qb[2], qb[3]);
            }
        }
        __syncthreads();
    }
    store_rows16<D>(dk + base, rs, k0 + warp * 16, T, dka, scale, scale);
    store_rows16<D>(dv + base, rs, k0 + warp * 16, T, dva, 1.0f, 1.0f);
}

// ---------------------------------------------------------------------------
// Backward: dq.
template <int D, int BN>
__device__ void attn_bwd_dq_tc_impl(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                                    const float* lse, const float* delta, int B, int T, int H, float scale) {
    constexpr int BM = 64, LD = D + 8, KS = D / 16, NK = BN / 8, DT = D / 8;
    ATP_DYN_SMEM(bf16, smem);
    bf16* Qs = smem;             // BM × LD
    bf16* Gs = Qs + BM * LD;     // BM × LD (dout)
    bf16* Ks = Gs + BM * LD;     // 2 × BN × LD
    bf16* Vs = Ks + 2 * BN * LD; // 2 × BN × LD
    int bh = blockIdx.y, b = bh / H, h = bh - b * H;
    int q0 = (gridDim.x - 1 - blockIdx.x) * BM;
    long long rs = (long long)H * D;
    long long base = ((long long)b * T * H + h) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    int kend = q0 + BM < T ? q0 + BM : T;
    int nkt = (kend + BN - 1) / BN;

    tc_load_rows<BM, D>(Qs, q + base, rs, q0, T);
    tc_load_rows<BM, D>(Gs, dout + base, rs, q0, T);
    tc_load_rows<BN, D>(Ks, k + base, rs, 0, T);
    tc_load_rows<BN, D>(Vs, v + base, rs, 0, T);
    cp_async_commit();

    const float sl2 = scale * kTcLog2e;
    int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    const float* lse_bh = lse + (long long)bh * T;
    const float* delta_bh = delta + (long long)bh * T;
    float L0 = row0 < T ? lse_bh[row0] * kTcLog2e : 0.0f, L1 = row1 < T ? lse_bh[row1] * kTcLog2e : 0.0f;
    float D0 = row0 < T ? delta_bh[row0] : 0.0f, D1 = row1 < T ? delta_bh[row1] : 0.0f;
    uint32_t qf[KS][4], gf[KS][4];
    float dqa[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) dqa[j][0] = dqa[j][1] = dqa[j][2] = dqa[j][3] = 0.0f;

    for (int it = 0; it < nkt; it++) {
        int buf = it & 1;
        if (it + 1 < nkt) {
            tc_load_rows<BN, D>(Ks + (buf ^ 1) * BN * LD, k + base, rs, (it + 1) * BN, T);
            tc_load_rows<BN, D>(Vs + (buf ^ 1) * BN * LD, v + base, rs, (it + 1) * BN, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                frag_a(qf[kk], Qs, LD, warp * 16, kk * 16);
                frag_a(gf[kk], Gs, LD, warp * 16, kk * 16);
            }
        }
        const bf16* Kt = Ks + buf * BN * LD;
        const bf16* Vt = Vs + buf * BN * LD;
        int k0 = it * BN;

        // S = Q·Kᵀ, dP = dO·Vᵀ (16 queries × BN keys per warp)
        float s[NK][4], dp[NK][4];
#pragma unroll
        for (int j = 0; j < NK; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j2 = 0; j2 < NK / 2; j2++) {
                uint32_t kb[4], vb[4];
                frag_b_rows(kb, Kt, LD, j2 * 16, kk * 16);
                frag_b_rows(vb, Vt, LD, j2 * 16, kk * 16);
                mma_bf16_16816(s[2 * j2], qf[kk], kb[0], kb[1]);
                mma_bf16_16816(s[2 * j2 + 1], qf[kk], kb[2], kb[3]);
                mma_bf16_16816(dp[2 * j2], gf[kk], vb[0], vb[1]);
                mma_bf16_16816(dp[2 * j2 + 1], gf[kk], vb[2], vb[3]);
            }
        }
        // P = exp(S − lse) (masked), dS = P∘(dP − delta)
#pragma unroll
        for (int j = 0; j < NK; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * tq + (e & 1);
                int row = e < 2 ? row0 : row1;
                float p = (key <= row && key < T) ? exp2f(s[j][e] * sl2 - (e < 2 ? L0 : L1)) : 0.0f;
                dp[j][e] = p * (dp[j][e] - (e < 2 ? D0 : D1));
            }
        }
        // dQ += dS·K
#pragma unroll
        for (int ks = 0; ks < BN / 16; ks++) {
            uint32_t dsa[4];
            acc_to_a(dsa, dp[2 * ks], dp[2 * ks + 1]);
#pragma unroll
            for (int d2 = 0; d2 < DT / 2; d2++) {
                uint32_t kb[4];
                frag_b_cols(kb, Kt, LD, ks * 16, d2 * 16);
                mma_bf16_16816(dqa[2 * d2], dsa, kb[0], kb[1]);
                mma_bf16_16816(dqa[2 * d2 + 1], dsa, kb[2], kb[3]);
            }
        }
        __syncthreads();
    }
    store_rows16<D>(dq + base, rs, q0 + warp * 16, T, dqa, scale, scale);
}

} // namespace atp

using namespace atp;

// out, q, k, v (B, T, H, D); lse (B, H, T). grid (ceil(T/64), B·H), block 128,
// shared (64 + 4·64)·(D + 8)·2 bytes.
KERNEL_LB(128) attn_fwd_tc_d64_bf16(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                        const bf16* v, int B, int T, int H, float scale) {
    attn_fwd_tc_impl<64>(out, lse, q, k, v, B, T, H, scale);
}
KERNEL_LB(128) attn_fwd_tc_d128_bf16(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                         const bf16* v, int B, int T, int H, float scale) {
    attn_fwd_tc_impl<128>(out, lse, q, k, v, B, T, H, scale);
}

// dk, dv, q, k, v, dout (B, T, H, D); lse, delta (B, H, T). grid (ceil(T/64),
// B·H), block 128, shared (2·64 + 4·BM)·(D + 8)·2 + 16·BM bytes, BM = 64
// (D = 64) or 32 (D = 128).
KERNEL_LB(128) attn_bwd_dkdv_tc_d64_bf16(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                              const float* lse, const float* delta, int B, int T, int H, float scale) {
    attn_bwd_dkdv_tc_impl<64, 64>(dk, dv, q, k, v, dout, lse, delta, B, T, H, scale);
}
KERNEL_LB(128) attn_bwd_dkdv_tc_d128_bf16(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                               const float* lse, const float* delta, int B, int T, int H, float scale) {
    attn_bwd_dkdv_tc_impl<128, 32>(dk, dv, q, k, v, dout, lse, delta, B, T, H, scale);
}

// dq, q, k, v, dout (B, T, H, D); lse, delta (B, H, T). grid (ceil(T/64),
// B·H), block 128, shared (2·64 + 4·BN)·(D + 8)·2 bytes, BN = 64 (D = 64) or
// 32 (D = 128).
KERNEL_LB(128) attn_bwd_dq_tc_d64_bf16(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                            const float* lse, const float* delta, int B, int T, int H, float scale) {
    attn_bwd_dq_tc_impl<64, 64>(dq, q, k, v, dout, lse, delta, B, T, H, scale);
}
KERNEL_LB(128) attn_bwd_dq_tc_d128_bf16(bf16* dq, const bf16* q, const bf16* k, const bf16* v, const bf16* dout,
                             const float* lse, const float* delta, int B, int T, int H, float scale) {
    attn_bwd_dq_tc_impl<128, 32>(dq, q, k, v, dout, lse, delta, B, T, H, scale);
}
