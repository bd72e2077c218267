// signals.cuh: the 64-bit epoch signal words of the kernels that reach
// peers through peer pointers (ep_*.cu, peerput.cu): acquire loads and
// release stores at system scope, the system fence, the global timer of the
// deadlines, and peer base addresses. See ep.cuh's comment for the
// protocol (epochs, never reset; ready/ack pairs) and why each fence is
// there. On the CPU emulator the orders are C++ atomics and the timer is
// the steady clock.
#pragma once

#include "common.cuh"

#if defined(ASYNCTP_EMU)
#include <chrono>
#endif

namespace atp {

typedef unsigned long long u64;

__device__ __forceinline__ u64 ep_load_acquire(const u64* p) {
#if defined(ASYNCTP_EMU)
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#endif
}

__device__ __forceinline__ void ep_store_release(u64* p, u64 v) {
#if defined(ASYNCTP_EMU)
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

// ep_add_release_gpu adds v to *p with release semantics at GPU scope: the
// fused expert path's per-block counters, read by a kernel of the same GPU.
__device__ __forceinline__ void ep_add_release_gpu(u64* p, u64 v) {
#if defined(ASYNCTP_EMU)
    __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#else
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#endif
}

__device__ __forceinline__ void ep_fence_gpu() {
#if defined(ASYNCTP_EMU)
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#else
    __threadfence();
#endif
}

__device__ __forceinline__ void ep_fence_system() {
#if !defined(ASYNCTP_EMU)
    __threadfence_system();
#endif
}

__device__ __forceinline__ long long ep_now_ns() {
#if defined(ASYNCTP_EMU)
    return (long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
#else
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (long long)t;
#endif
}

template <typename T> __device__ __forceinline__ T* ep_peer(const u64* peers, int r) {
    return reinterpret_cast<T*>(peers[r]);
}

} // namespace atp
