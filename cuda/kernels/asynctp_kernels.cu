// asynctp_kernels.cu: the one translation unit of the kernels image
// (build/asynctp_kernels.fatbin; also what the CPU emulator compiles). Each
// family lives in its own file; beside each include, what it defines.
//
// The order rule: every file includes the headers (.cuh, #pragma once) it
// needs itself, so a file that uses only headers stands alone and may go
// anywhere; a file that uses what another .cu file defines comes after it.
// Two do: attention_wg.cu (after attention_fa2.cu: its fa2_* tile helpers)
// and grouped_sm90.cu (after gemm_sm90.cu: the engine it runs on groups).
// Moving an include changes the order of definitions in the image, not its
// kernels; scripts/ptx-check.sh says whether their PTX stayed the same.
#include "elementwise.cu"   // defines: cast_{bf16,f32}, add, scale, axpy, add_bias, colsum_{partial,finish}
#include "norm.cu"          // defines: rmsnorm_fwd, add_rmsnorm_fwd, rmsnorm_bwd_dx[_add], rmsnorm_dw_partial
#include "activation.cu"    // defines: swiglu_{fwd,bwd}, gelu_{fwd,bwd}, softmax_{fwd,bwd}
#include "attention.cu"     // defines: rope[_v8], attn_fwd_d{32,64,128}, attn_bwd_{delta,dq,dkdv}_d* (CUDA cores, the reference)
#include "embedding.cu"     // defines: embedding_fwd, embedding_bwd[_merge], emb_{count,scan,rank,scatter}
#include "loss.cu"          // defines: cross_entropy[_smem]
#include "optim.cu"         // defines: adamw_{bf16,f32}, sumsq_{partial,finish}
#include "moe.cu"           // defines: topk[_bwd], logsumexp[_bwd], gather_rows, combine_rows[_bwd], moe_{count,index}
#include "grouped.cu"       // defines: grouped_mm, grouped_mm_tn (SIMT grouped expert GEMMs)
#include "ep_layout.cu"     // defines: ep_layout, ep_plan (the expert path's layout; ep.cuh lists every ep_* entry point)
#include "ep_signals.cu"    // defines: ep_wait, ep_wait_one, ep_claim, ep_wait_raise, ep_signal (epoch signals)
#include "ep_dispatch.cu"   // defines: ep_send_*, ep_recv_* (tokens once per destination rank, expert rows)
#include "ep_combine.cu"    // defines: ep_return_*, ep_scale_recv_* (rows home, the combine backward's rows)
#include "ep_fused.cu"      // defines: ep_header, ep_fill_u64, ep_block_targets, ep_return_blocks_* (the fused path)
#include "peerput.cu"       // defines: peer_put (the fused all-gather's put transfer)
#include "attention_fa2.cu" // defines: attn_{fwd,bwd_dq,bwd_dkdv}_fa2_d{64,128}, attn_fwd_fa2_d64w8; the fa2_* tile helpers
#include "attention_wg.cu"  // defines: attn_fwd_wg_d128, attn_bwd_{dq,dkdv}_wg_d{64,128} (sm_90 wgmma)
#include "packed.cu"        // defines: rope_qkv[_bwd][_vec], swiglu_packed_{fwd,bwd}[_vec]
#include "gemm_sm90.cu"     // defines: gemm_sm90_* (the GEMM engine, Hopper only), gemm_splitk_reduce_*
#include "grouped_sm90.cu"  // defines: grouped_sm90_{nt,nn,tn}_* (grouped GEMMs on the engine, Hopper only)
