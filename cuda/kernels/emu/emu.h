// emu.h: a small CPU emulator of the CUDA features the asynctp kernels use,
// so the kernels can be compiled as C++ (g++ -DASYNCTP_EMU) and tested on a
// machine without a GPU (tensor/cudabackend/internal/emu).
//
// Model: one block at a time on one OS thread; each CUDA thread is a
// coroutine (ucontext) with its own stack. __syncthreads and the warp
// primitives (shuffles, ballots, __syncwarp, mma/ldmatrix emulations) switch
// coroutines at barriers, so shared memory (`__shared__` becomes `static`),
// barriers and warp exchanges behave as on the GPU for race-free kernels.
// Atomics are plain operations (no preemption between barriers). Not
// emulated: memory-model races, timing, asynchronous copies, occupancy.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <math.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __shared__ static
#define __constant__ static
#define __align__(n) alignas(n)
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(8) float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
// The rounding intrinsics: one IEEE operation each (round to nearest).
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---- bfloat16 -------------------------------------------------------------
struct __nv_bfloat16 {
    uint16_t bits;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }

inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float((unsigned)h.bits << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u = __float_as_uint(f);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { // NaN
        h.bits = (uint16_t)((u >> 16) | 0x40);
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    h.bits = (uint16_t)(u >> 16);
    return h;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

// ---- math -------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <typename T> inline T __ldg(const T* p) { return *p; }

// ---- block and warp synchronisation ----------------------------------------
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
void* emu_dynamic_smem();
size_t emu_dynamic_smem_size(); // bytes, as launched
int emu_lane();
// emu_warp_allgather: every lane of the warp contributes `bytes` from in; out
// receives 32 slots of `bytes` (lane order). A warp-wide barrier: every
// active lane of the warp must call it.
void emu_warp_allgather(const void* in, void* out, size_t bytes);

// The asynchrony of wgmma (wgmma.cuh), per emulated thread: a wgmma's
// result is computed at issue but lands in its accumulators only at the
// wgmma_wait that retires its group; until then they read as NaN, and its A
// registers (a, nullable) must keep their values (checked at the wait). So a
// kernel that reads a result before its wait, or rewrites an A fragment the
// hardware may still be reading, fails in the emulator as on the GPU.
// emu_wg_pending returns the latest pending result for d (what a chained
// wgmma of the same group accumulates onto), or null. smem_sum (nullable)
// recomputes a checksum of the shared memory the wgmma read, whose value
// at issue is sum: at the wait that retires it the two must agree, so a
// kernel that overwrites an operand tile (a cp.async of the next tile into
// a buffer still being read) before every warp retired the wgmma reading
// it fails in the emulator too, wherever the threads' order exposes it.
void emu_wg_issue(float* d, int n, const float* result, const uint32_t* a, uint64_t (*smem_sum)(const uint64_t*),
                  const uint64_t* sum_args, uint64_t sum);
const float* emu_wg_pending(const float* d);
void emu_wg_commit();
void emu_wg_wait(int n);

template <typename T> inline T emu_shfl(T v, int src) {
    T all[32];
    emu_warp_allgather(&v, all, sizeof(T));
    return all[src & 31];
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int laneMask, int width = 32) {
    int lane = emu_lane();
    int src = lane ^ laneMask;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return emu_shfl(v, src);
}
template <typename T> inline T __shfl_sync(unsigned, T v, int srcLane, int width = 32) {
    int lane = emu_lane();
    return emu_shfl(v, (lane & ~(width - 1)) + (srcLane & (width - 1)));
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    int lane = emu_lane();
    int src = lane + (int)delta;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return emu_shfl(v, src);
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    int lane = emu_lane();
    int src = lane - (int)delta;
    if (src < (lane & ~(width - 1))) src = lane;
    return emu_shfl(v, src);
}
inline unsigned __ballot_sync(unsigned, int pred) {
    int all[32];
    int p = pred != 0;
    emu_warp_allgather(&p, all, sizeof(int));
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        if (all[i]) r |= 1u << i;
    return r;
}
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, !pred) == 0; }

// ---- atomics (coroutines switch only at barriers: plain operations) -------
inline int atomicAdd(int* p, int v) {
    int o = *p;
    *p = o + v;
    return o;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    unsigned o = *p;
    *p = o + v;
    return o;
}
inline int atomicSub(int* p, int v) {
    int o = *p;
    *p = o - v;
    return o;
}
inline int atomicOr(int* p, int v) {
    int o = *p;
    *p = o | v;
    return o;
}
inline int atomicExch(int* p, int v) {
    int o = *p;
    *p = v;
    return o;
}
inline int atomicMax(int* p, int v) {
    int o = *p;
    if (v > o) *p = v;
    return o;
}
inline int atomicCAS(int* p, int cmp, int v) {
    int o = *p;
    if (o == cmp) *p = v;
    return o;
}
