// common.cuh: types, conversions, reductions and vectorised access helpers
// shared by every kernel file of asynctp.
//
// Conventions of all kernels (see README.md):
//   - Kernels are `extern "C" __global__` (the KERNEL macro) so the Go side
//     finds them by name with cuModuleGetFunction. Float kernels come in two
//     variants, NAME_bf16 (storage __nv_bfloat16) and NAME_f32 (storage
//     float); every one accumulates in fp32 (fp64 for SumSquares).
//   - Argument types are exactly: pointers (8 bytes), `int` (int32),
//     `long long` (int64) and `float`. The Go launcher passes the same types
//     in the same order; the emulator (emu/) checks the sizes.
//   - Shapes are row-major and contiguous, written next to each kernel.
//   - No kernel uses float atomics on its outputs: every output element is
//     written by one thread, and every reduction runs in a fixed order, so
//     two runs of the same launch are bit-for-bit identical. (The one-pass
//     attention backward, whose dq was summed with fp32 atomic adds, is
//     retired to experimental/attention_onepass.cu.)
//   - Kernels that validate data (ids, targets) report through `int* err`, a
//     pair of ints in device memory: err[0] |= 1 on failure, err[1] = one
//     offending value (any one). The Go side reads them at Sync.
#pragma once

#if defined(ASYNCTP_EMU)
#include "emu/emu.h"
#else
#include <cuda_bf16.h>
#include <stdint.h>
#endif

typedef __nv_bfloat16 bf16;

#define KERNEL extern "C" __global__
// KERNEL_LB(n): a kernel launched with at most n threads per block (lets the
// compiler budget registers for n threads).
#define KERNEL_LB(n) extern "C" __global__ void __launch_bounds__(n)

#define ATP_FULL_MASK 0xffffffffu

namespace atp {

// ---------------------------------------------------------------------------
// Conversions. cvt<T>(float) rounds to nearest even (bf16); f32(x) widens.

__device__ __forceinline__ float f32(float x) { return x; }
__device__ __forceinline__ float f32(bf16 x) { return __bfloat162float(x); }

template <typename T> struct Conv;
template <> struct Conv<float> {
    static __device__ __forceinline__ float from(float x) { return x; }
};
template <> struct Conv<bf16> {
    static __device__ __forceinline__ bf16 from(float x) { return __float2bfloat16_rn(x); }
};
template <typename T> __device__ __forceinline__ T cvt(float x) { return Conv<T>::from(x); }

// pack_bf16x2 rounds two floats to bf16 and packs them, lo in the low half
// (the lower address in memory).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ float bf16lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// ---------------------------------------------------------------------------
// Reductions. All lanes (threads) receive bit-identical results: the xor
// butterfly adds the same two operands on both sides of every exchange.

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ATP_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ATP_FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ATP_FULL_MASK, v, o);
    return v;
}

// block_sum returns the sum of v over the block to every thread. blockDim.x
// must be a multiple of 32 (at most 1024), blockDim.y == 1; scratch holds 32
// floats of shared memory. Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    float r = lane < nw ? scratch[lane] : 0.0f;
    r = warp_sum(r);
    __syncthreads(); // scratch may be reused by the caller
    return r;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    float r = lane < nw ? scratch[lane] : -INFINITY;
    r = warp_max(r);
    __syncthreads();
    return r;
}
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    double r = lane < nw ? scratch[lane] : 0.0;
    r = warp_sum_d(r);
    __syncthreads();
    return r;
}

// ---------------------------------------------------------------------------
// Vectorised access. A "pack" is 16 bytes: 8 bf16 or 4 floats.

template <typename T> struct Pack {
    static constexpr int N = 16 / sizeof(T);
};

template <typename T>
__device__ __forceinline__ void load_pack(const T* p, float (&f)[Pack<T>::N]) {
    uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < Pack<T>::N; i++) f[i] = f32(e[i]);
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const float (&f)[Pack<T>::N]) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < Pack<T>::N; i++) e[i] = cvt<T>(f[i]);
    *reinterpret_cast<uint4*>(p) = u;
}

__device__ __forceinline__ unsigned misalign16(const void* p) {
    return (unsigned)(reinterpret_cast<uintptr_t>(p) & 15u);
}

// Span splits n elements starting at pointers that share one misalignment
// modulo 16 bytes into a scalar head, whole 16-byte packs and a scalar tail.
// When the pointers' misalignments differ, everything is scalar (nvec = 0).
struct Span {
    long long head; // elements before the first pack
    long long nvec; // packs
};
template <typename T>
__device__ __forceinline__ Span make_span(long long n, bool same_alignment, unsigned mis) {
    Span s;
    if (!same_alignment || (mis % sizeof(T)) != 0) {
        s.head = n;
        s.nvec = 0;
        return s;
    }
    long long h = (long long)(((16u - mis) & 15u) / sizeof(T));
    if (h > n) h = n;
    s.head = h;
    s.nvec = (n - h) / Pack<T>::N;
    return s;
}

// vmap applies op to n elements: for each index i, op(i, x, y) reads
// x[k] = ins[k][i] (as float) and writes y[k], stored to outs[k][i]. The
// elements are split among nt threads, this one being t (0 <= t < nt); whole
// 16-byte packs are used when every pointer has the same alignment. All
// inputs of an element are read before its outputs are written, by the same
// thread, so an output may alias an input (in place). Which thread handles
// which element depends only on (pointers mod 16, n, nt).
template <typename T, int NIN, int NOUT, typename Op>
__device__ __forceinline__ void vmap(T* const (&outs)[NOUT], const T* const (&ins)[NIN], long long n,
                                     long long t, long long nt, Op op) {
    constexpr int V = Pack<T>::N;
    unsigned mis = misalign16(ins[0]);
    bool same = true;
#pragma unroll
    for (int k = 0; k < NIN; k++) same = same && misalign16(ins[k]) == mis;
#pragma unroll
    for (int k = 0; k < NOUT; k++) same = same && misalign16(outs[k]) == mis;
    Span s = make_span<T>(n, same, mis);
    for (long long i = t; i < s.head; i += nt) {
        float x[NIN], y[NOUT];
#pragma unroll
        for (int k = 0; k < NIN; k++) x[k] = f32(ins[k][i]);
        op(i, x, y);
#pragma unroll
        for (int k = 0; k < NOUT; k++) outs[k][i] = cvt<T>(y[k]);
    }
    for (long long j = t; j < s.nvec; j += nt) {
        long long i0 = s.head + j * V;
        float xv[NIN][V], yv[NOUT][V];
#pragma unroll
        for (int k = 0; k < NIN; k++) load_pack<T>(ins[k] + i0, xv[k]);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float x[NIN], y[NOUT];
#pragma unroll
            for (int k = 0; k < NIN; k++) x[k] = xv[k][e];
            op(i0 + e, x, y);
#pragma unroll
            for (int k = 0; k < NOUT; k++) yv[k][e] = y[k];
        }
#pragma unroll
        for (int k = 0; k < NOUT; k++) store_pack<T>(outs[k] + i0, yv[k]);
    }
    for (long long i = s.head + s.nvec * V + t; i < n; i += nt) {
        float x[NIN], y[NOUT];
#pragma unroll
        for (int k = 0; k < NIN; k++) x[k] = f32(ins[k][i]);
        op(i, x, y);
#pragma unroll
        for (int k = 0; k < NOUT; k++) outs[k][i] = cvt<T>(y[k]);
    }
}

// vvisit is vmap without outputs: op(i, x) for every element.
template <typename T, int NIN, typename Op>
__device__ __forceinline__ void vvisit(const T* const (&ins)[NIN], long long n, long long t, long long nt,
                                       Op op) {
    constexpr int V = Pack<T>::N;
    unsigned mis = misalign16(ins[0]);
    bool same = true;
#pragma unroll
    for (int k = 0; k < NIN; k++) same = same && misalign16(ins[k]) == mis;
    Span s = make_span<T>(n, same, mis);
    for (long long i = t; i < s.head; i += nt) {
        float x[NIN];
#pragma unroll
        for (int k = 0; k < NIN; k++) x[k] = f32(ins[k][i]);
        op(i, x);
    }
    for (long long j = t; j < s.nvec; j += nt) {
        long long i0 = s.head + j * V;
        float xv[NIN][V];
#pragma unroll
        for (int k = 0; k < NIN; k++) load_pack<T>(ins[k] + i0, xv[k]);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float x[NIN];
#pragma unroll
            for (int k = 0; k < NIN; k++) x[k] = xv[k][e];
            op(i0 + e, x);
        }
    }
    for (long long i = s.head + s.nvec * V + t; i < n; i += nt) {
        float x[NIN];
#pragma unroll
        for (int k = 0; k < NIN; k++) x[k] = f32(ins[k][i]);
        op(i, x);
    }
}

// grid_thread and grid_threads index a 1-D grid-stride loop.
__device__ __forceinline__ long long grid_thread() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_threads() { return (long long)gridDim.x * blockDim.x; }

// report_error records a data error (bad id, bad target) for the Go side.
__device__ __forceinline__ void report_error(int* err, int value) {
    if (err == nullptr) return;
    atomicOr(err, 1);
    atomicExch(err + 1, value);
}

} // namespace atp

// ATP_DYN_SMEM declares the block's dynamic shared memory as an array of type.
#if defined(ASYNCTP_EMU)
#define ATP_DYN_SMEM(type, name) type* name = reinterpret_cast<type*>(emu_dynamic_smem())
#else
#define ATP_DYN_SMEM(type, name)                                                                    \
    extern __shared__ __align__(16) unsigned char atp_dyn_smem_[];                                  \
    type* name = reinterpret_cast<type*>(atp_dyn_smem_)
#endif
