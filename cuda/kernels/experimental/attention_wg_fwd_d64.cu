// attention_wg_fwd_d64.cu: the pipelined wgmma forward at D = 64, an
// experiment (2026-12-02) retired from the image (see README.md here): the
// template of attention_wg.cu's D = 128 forward at D = 64, Q fragments in
// registers (wg) or Q by descriptor (wgq, attn_fwd_wg_impl's QDESC). On the
// H200 they gave FA2's out bits and ran at 99.9 and 97.5 µs against FA2's
// 122.5 at gpt2's shape, but lse differed from FA2's in the last bit in
// 2–5 % of the rows (so dq, dk, dv in a few elements), both variants alike,
// even at T = 64; the cause was not found.
//
// The entry points take the kernels' current arguments (grouped-query
// heads included). To run them again: include this file after
// attention_wg.cu in asynctp_kernels.cu, rerun emu/gen.sh, and launch them
// from tensor/cudabackend/attention_wg.go at D = 64 (the launch of
// attn_fwd_wg_d128_bf16, with shared memory wgSmemFwd(64)).

// out (B, T, H, D), lse (B·H, T); q rows sq apart, k, v (B, T, HKV, D) rows
// skv apart, out rows so apart. grid (ceil(T/64), B·H), block 128, shared
// memory 1024 + (64 + 5·64)·64·2 bytes.
KERNEL_LB(128) attn_fwd_wg_d64_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int HKV, int sq, int skv, int so, float scale) {
    wgattn::attn_fwd_wg_impl<64>(out, lse, q, k, v, B, T, H, HKV, sq, skv, so, scale);
}
KERNEL_LB(128) attn_fwd_wgq_d64_bf16(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T, int H, int HKV, int sq, int skv, int so, float scale) {
    wgattn::attn_fwd_wg_impl<64, true>(out, lse, q, k, v, B, T, H, HKV, sq, skv, so, scale);
}
