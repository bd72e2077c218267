// attention_onepass.cu: the one-pass causal attention backward of
// FlashAttention-2 on mma.sync m16n8k16 (bf16 inputs, fp32 accumulation),
// D = 64 and 128, opt-in (cudabackend.AttentionFA2Atomic). NOT
// DETERMINISTIC: dq is summed over key blocks with fp32 atomics, so its
// rounding (and bits) depend on the order in which the blocks' additions
// land. The default backward (attention_fa2.cu) stays the deterministic one.
// Uses attention_fa2.cu's helpers (fa2_load, fa2_store, fa2_exp2, fa2_zero)
// and the fragment helpers of attention_mma.cuh, so it is included after
// attention_fa2.cu.
//
// Layout as attention_fa2.cu (row strides sqkv for q, k, v; so for out and
// dout; sd for dq, dk, dv); lse and delta (B, H, T) fp32; the dq
// accumulator dqacc (B·H, T, D) fp32, zeroed by the pre-kernel.
//
// Three launches:
//   attn_bwd_onepass_pre_dD_bf16: delta = Σ dout·out per row and
//     dqacc = 0. Block 256 (8 warps; D/8 lanes per row, 16 bytes each),
//     grid ceil(B·H·T / (256·8/D)).
//   attn_bwd_onepass_dD_bf16: grid (ceil(T/128), B·H), block 256 (8 warps ×
//     16 keys), like attn_bwd_dkdv_fa2: K and V of 128 keys stay in shared
//     memory (for D = 64 their A fragments also in registers), query tiles
//     of BM (64 for D = 64, 32 for D = 128) are streamed from the diagonal
//     on, double buffered with cp.async. Per query tile, once:
//       Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (16 keys × BM queries per warp),
//       Pᵀ = exp(Sᵀ − lse), dSᵀ = Pᵀ∘(dPᵀ − delta) (masked on the diagonal),
//       dV += Pᵀ·dO, dK += dSᵀ·Q (registers), dSᵀ → shared memory (bf16,
//       the same rounding as the dK operand); barrier; then
//       dQ_tile = dS·K (BM × D, the 128 keys summed): warp w owns m-tile
//       w / (8/MQ) (MQ = BM/16) and D·MQ/8 = 32 columns, 16 fp32 per thread,
//       added to dqacc with red.global.add.v2.f32 (sm_90, CUDA ≥ 12.1;
//       two scalar atomicAdds elsewhere). k-steps (16 keys) past the
//       m-tile's last query are skipped (their dS is 0 by the mask).
//     Two barriers per query tile: the top one (copies landed; every warp
//     done with the other Q/dO buffer and with the previous dS), one between
//     the dS stores and the dQ reads. Shared (2·128 + 4·BM)·(D + 8)·2 +
//     16·BM + 128·(BM + 8)·2 bytes: 93184 (D = 64), 115200 (D = 128).
//   attn_bwd_onepass_dq_bf16: dq = bf16(dqacc · scale), 8 elements per
//     thread, grid-stride, block 256.
#include "../common.cuh"
#include "../attention_mma.cuh" // defines: the fragment helpers (frag_a, acc_to_a, quad_add, ...)

namespace atp {

// op_red_add2 adds (a, b) to p[0], p[1] (global fp32, 8-byte aligned)
// atomically, without reading the old values back.
__device__ __forceinline__ void op_red_add2(float* p, float a, float b) {
#if defined(ASYNCTP_EMU)
    p[0] += a; // the emulator runs one thread at a time between barriers
    p[1] += b;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 &&                                                        \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 1))
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

// op_frag_a_t: the A operand rows [r0, r0+16) × cols [c0, c0+16) of A where
// A[r][c] = tile[c][r] (tile row-major, rows ld elements apart): ldmatrix
// .trans of the four 8×8 blocks (r, c), (r+8, c), (r, c+8), (r+8, c+8).
__device__ __forceinline__ void op_frag_a_t(uint32_t (&a)[4], const bf16* tile, int ld, int r0, int c0) {
    int lane = threadIdx.x & 31, m = lane >> 3;
    ldmatrix_x4_trans(a, tile + (c0 + (m >> 1) * 8 + (lane & 7)) * ld + r0 + (m & 1) * 8);
}

template <int D, int BM, bool HOLD>
__device__ void attn_bwd_onepass_impl(bf16* dk, bf16* dv, float* dqacc, const bf16* q, const bf16* k,
                                      const bf16* v, const bf16* dout, const float* lse, const float* delta, int B,
                                      int T, int H, int sqkv, int so, int sd, float scale) {
    constexpr int NW = 8, NTHR = 32 * NW, BN = 16 * NW, LD = D + 8, KS = D / 16, NQ = BM / 8, DT = D / 8;
    constexpr int LDS = BM + 8;    // row of the dSᵀ tile (keys × queries)
    constexpr int MQ = BM / 16;    // m-tiles of the dQ tile
    constexpr int WPM = NW / MQ;   // warps per m-tile
    constexpr int QC = D / WPM;    // dQ columns per warp
    constexpr int QN = QC / 8;     // their n-tiles
    static_assert(BM <= NTHR, "one thread per staged lse/delta");
    static_assert(NW % MQ == 0 && QC % 16 == 0, "dQ tile split over the warps");
    ATP_DYN_SMEM(bf16, smem);
    bf16* Ks = smem;             // BN × LD
    bf16* Vs = Ks + BN * LD;     // BN × LD
    bf16* Qs = Vs + BN * LD;     // 2 × BM × LD
    bf16* Gs = Qs + 2 * BM * LD; // 2 × BM × LD (dout)
    float* Ls = reinterpret_cast<float*>(Gs + 2 * BM * LD); // 2 × BM: lse·log2(e), +inf past T
    float* Ds = Ls + 2 * BM;                                // 2 × BM: delta, 0 past T
    bf16* Ss = reinterpret_cast<bf16*>(Ds + 2 * BM);        // BN × LDS: dSᵀ of the current query tile
    int bh = blockIdx.y, b = bh / H, h = bh - b * H;
    int k0 = blockIdx.x * BN; // block 0 has the most query tiles and starts first
    const bf16* qb = q + (long long)b * T * sqkv + h * D;
    const bf16* kb = k + (long long)b * T * sqkv + h * D;
    const bf16* vb = v + (long long)b * T * sqkv + h * D;
    const bf16* gb = dout + (long long)b * T * so + h * D;
    float* qacc = dqacc + (long long)bh * T * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const float* lse_bh = lse + (long long)bh * T;
    const float* delta_bh = delta + (long long)bh * T;
    int nqt = (T - k0 + BM - 1) / BM; // query tiles from the diagonal on (k0 < T)
    int kw = k0 + warp * 16;          // the warp's first key
    int tid = threadIdx.x;
    int mq = warp / WPM, qc0 = (warp % WPM) * QC; // the warp's part of the dQ tile

    fa2_load<BN, D, NTHR>(Ks, kb, sqkv, k0, T);
    fa2_load<BN, D, NTHR>(Vs, vb, sqkv, k0, T);
    fa2_load<BM, D, NTHR>(Qs, qb, sqkv, k0, T);
    fa2_load<BM, D, NTHR>(Gs, gb, so, k0, T);
    cp_async_commit();
    if (tid < BM) {
        int qi = k0 + tid;
        fa2_lse_delta(Ls[tid], Ds[tid], lse_bh, delta_bh, qi, T);
    }

    const float sl2 = scale * kTcLog2e;
    int key0 = kw + g, key1 = key0 + 8;
    uint32_t kf[HOLD ? KS : 1][4], vf[HOLD ? KS : 1][4];
    float dka[DT][4], dva[DT][4];
    fa2_zero(dka);
    fa2_zero(dva);

    for (int it = 0; it < nqt; it++) {
        int buf = it & 1;
        int qs = k0 + it * BM;
        cp_async_wait<0>();
        __syncthreads(); // tile it landed; every warp is done with tile it − 1 and its dS
        float lnext = 0.0f, dnext = 0.0f;
        bool more = it + 1 < nqt;
        if (more) {
            fa2_load<BM, D, NTHR>(Qs + (buf ^ 1) * BM * LD, qb, sqkv, qs + BM, T);
            fa2_load<BM, D, NTHR>(Gs + (buf ^ 1) * BM * LD, gb, so, qs + BM, T);
            cp_async_commit();
            if (tid < BM) {
                int qi = qs + BM + tid;
                fa2_lse_delta(lnext, dnext, lse_bh, delta_bh, qi, T);
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
            // dSᵀ → shared (rows: the warp's keys; columns: the tile's queries)
            bf16* srow = Ss + (warp * 16 + g) * LDS + 2 * tq;
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                *reinterpret_cast<uint32_t*>(srow + j * 8) = pack_bf16x2(dpt[j][0], dpt[j][1]);
                *reinterpret_cast<uint32_t*>(srow + 8 * LDS + j * 8) = pack_bf16x2(dpt[j][2], dpt[j][3]);
            }
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
        // every warp: the top barrier), read next after the next top barrier.
        if (more && tid < BM) {
            Ls[(buf ^ 1) * BM + tid] = lnext;
            Ds[(buf ^ 1) * BM + tid] = dnext;
        }
        __syncthreads(); // dSᵀ of every warp stored

        // dQ (m-tile mq, columns qc0..qc0+QC) += dS·K over the block's keys.
        // k-step ks holds the keys of warp ks: skipped (not stored, or all
        // masked) when they are all after the m-tile's last query.
        int qlast = qs + mq * 16 + 15;
        if (k0 <= qlast && qs + mq * 16 < T) {
            float dqa[QN][4];
            fa2_zero(dqa);
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++) {
                if (k0 + ks * 16 > qlast) continue;
                uint32_t sa[4];
                op_frag_a_t(sa, Ss, LDS, mq * 16, ks * 16);
#pragma unroll
                for (int n2 = 0; n2 < QN / 2; n2++) {
                    uint32_t kfr[4];
                    frag_b_cols(kfr, Ks, LD, ks * 16, qc0 + n2 * 16);
                    mma_bf16_16816(dqa[2 * n2], sa, kfr[0], kfr[1]);
                    mma_bf16_16816(dqa[2 * n2 + 1], sa, kfr[2], kfr[3]);
                }
            }
            int ra = qs + mq * 16 + g, rb = ra + 8;
#pragma unroll
            for (int j = 0; j < QN; j++) {
                int col = qc0 + j * 8 + 2 * tq;
                if (ra < T) op_red_add2(qacc + (long long)ra * D + col, dqa[j][0], dqa[j][1]);
                if (rb < T) op_red_add2(qacc + (long long)rb * D + col, dqa[j][2], dqa[j][3]);
            }
        }
    }
    fa2_store<D>(dk + (long long)b * T * sd + h * D, sd, kw, T, dka, scale, scale);
    fa2_store<D>(dv + (long long)b * T * sd + h * D, sd, kw, T, dva, 1.0f, 1.0f);
}

// delta (B·H·T rows, (b, h, t) order) = Σ_d dout·out, and the rows' dqacc
// zeroed. D/8 lanes per row (16 bytes each).
template <int D>
__device__ void attn_bwd_onepass_pre_impl(float* delta, float* dqacc, const bf16* out, const bf16* dout, int B,
                                          int T, int H, int so) {
    constexpr int CPR = D / 8, RPW = 32 / CPR, RPB = 8 * RPW;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long rr = (long long)blockIdx.x * RPB + warp * RPW + lane / CPR;
    int c = lane % CPR;
    long long nrows = (long long)B * H * T;
    float acc = 0.0f;
    if (rr < nrows) {
        long long bh = rr / T;
        int t = (int)(rr - bh * T);
        int b = (int)(bh / H), h = (int)(bh - (long long)b * H);
        long long off = ((long long)b * T + t) * so + h * D + c * 8;
        uint4 gv = *reinterpret_cast<const uint4*>(dout + off);
        uint4 ov = *reinterpret_cast<const uint4*>(out + off);
        acc = bf16lo(gv.x) * bf16lo(ov.x) + bf16hi(gv.x) * bf16hi(ov.x);
        acc += bf16lo(gv.y) * bf16lo(ov.y) + bf16hi(gv.y) * bf16hi(ov.y);
        acc += bf16lo(gv.z) * bf16lo(ov.z) + bf16hi(gv.z) * bf16hi(ov.z);
        acc += bf16lo(gv.w) * bf16lo(ov.w) + bf16hi(gv.w) * bf16hi(ov.w);
        float4* z = reinterpret_cast<float4*>(dqacc + rr * D + c * 8);
        z[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int o = CPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(ATP_FULL_MASK, acc, o);
    if (rr < nrows && c == 0) delta[rr] = acc;
}

} // namespace atp

using namespace atp;

// delta (B, H, T) and dqacc (B·H, T, D) = 0; out, dout (B, T, H, D) with row
// stride so. grid ceil(B·H·T / (2048/D)), block 256.
KERNEL_LB(256) attn_bwd_onepass_pre_d64_bf16(float* delta, float* dqacc, const bf16* out, const bf16* dout, int B, int T, int H, int so) {
    attn_bwd_onepass_pre_impl<64>(delta, dqacc, out, dout, B, T, H, so);
}
KERNEL_LB(256) attn_bwd_onepass_pre_d128_bf16(float* delta, float* dqacc, const bf16* out, const bf16* dout, int B, int T, int H, int so) {
    attn_bwd_onepass_pre_impl<128>(delta, dqacc, out, dout, B, T, H, so);
}

// dk, dv (row stride sd) written, dqacc (B·H, T, D) fp32 added to
// (atomics: not bit-reproducible); q, k, v (sqkv), dout (so), lse, delta.
// grid (ceil(T/128), B·H), block 256, shared (256 + 4·BM)·(D + 8)·2 + 16·BM
// + 128·(BM + 8)·2 bytes, BM = 64 (D = 64) or 32 (D = 128).
KERNEL_LB(256) attn_bwd_onepass_d64_bf16(bf16* dk, bf16* dv, float* dqacc, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta, int B, int T, int H, int sqkv, int so, int sd, float scale) {
    attn_bwd_onepass_impl<64, 64, true>(dk, dv, dqacc, q, k, v, dout, lse, delta, B, T, H, sqkv, so, sd, scale);
}
KERNEL_LB(256) attn_bwd_onepass_d128_bf16(bf16* dk, bf16* dv, float* dqacc, const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta, int B, int T, int H, int sqkv, int so, int sd, float scale) {
    attn_bwd_onepass_impl<128, 32, false>(dk, dv, dqacc, q, k, v, dout, lse, delta, B, T, H, sqkv, so, sd, scale);
}

// dq (B, T, H, D), row stride sd, = bf16(dqacc·scale); dqacc (B·H, T, D)
// fp32. Grid-stride over B·H·T·D/8 packs of 8, block 256.
KERNEL_LB(256) attn_bwd_onepass_dq_bf16(bf16* dq, const float* dqacc, int B, int T, int H, int D, int sd, float scale) {
    int cpr = D / 8;
    long long n = (long long)B * H * T * cpr;
    for (long long idx = grid_thread(); idx < n; idx += grid_threads()) {
        long long rr = idx / cpr;
        int c = (int)(idx - rr * cpr);
        long long bh = rr / T;
        int t = (int)(rr - bh * T);
        int b = (int)(bh / H), h = (int)(bh - (long long)b * H);
        const float4* src = reinterpret_cast<const float4*>(dqacc + rr * D + c * 8);
        float4 x = src[0], y = src[1];
        uint4 o;
        o.x = pack_bf16x2(x.x * scale, x.y * scale);
        o.y = pack_bf16x2(x.z * scale, x.w * scale);
        o.z = pack_bf16x2(y.x * scale, y.y * scale);
        o.w = pack_bf16x2(y.z * scale, y.w * scale);
        *reinterpret_cast<uint4*>(dq + ((long long)b * T + t) * sd + h * D + c * 8) = o;
    }
}
