// CHECK-ONLY STAND-IN for NVSHMEM's nvshmemx.h (see nvshmem.h here).
#pragma once
#include "nvshmem.h"

extern "C" {
int nvshmemx_cumodule_init(CUmodule module);
__device__ void nvshmemx_signal_op(uint64_t *sig_addr, uint64_t signal, int sig_op, int pe);
__device__ void nvshmemx_putmem_signal_block(void *dest, const void *source, size_t bytes, uint64_t *sig_addr,
                                             uint64_t signal, int sig_op, int pe);

#define ATP_STUB_MOVE(NAME, T)                                                                            \
  int nvshmemx_##NAME##_fcollect_on_stream(nvshmem_team_t, T *, const T *, size_t, cudaStream_t);         \
  int nvshmemx_##NAME##_broadcast_on_stream(nvshmem_team_t, T *, const T *, size_t, int, cudaStream_t);
ATP_STUB_MOVE(uint8, uint8_t)
ATP_STUB_MOVE(uint16, uint16_t)
ATP_STUB_MOVE(uint32, uint32_t)
ATP_STUB_MOVE(uint64, uint64_t)

#define ATP_STUB_RED(NAME, T, OP)                                                                         \
  int nvshmemx_##NAME##_##OP##_reduce_on_stream(nvshmem_team_t, T *, const T *, size_t, cudaStream_t);    \
  int nvshmemx_##NAME##_##OP##_reducescatter_on_stream(nvshmem_team_t, T *, const T *, size_t, cudaStream_t);
ATP_STUB_RED(float, float, sum)
ATP_STUB_RED(float, float, max)
ATP_STUB_RED(double, double, sum)
ATP_STUB_RED(double, double, max)
ATP_STUB_RED(int, int, sum)
ATP_STUB_RED(int, int, max)
ATP_STUB_RED(bfloat16, __nv_bfloat16, sum)
ATP_STUB_RED(bfloat16, __nv_bfloat16, max)
int nvshmemx_barrier_on_stream(nvshmem_team_t team, cudaStream_t stream);
}
