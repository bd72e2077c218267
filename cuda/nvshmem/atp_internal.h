// atp_internal.h: helpers shared by the two translation units of
// libasynctp_nvshmem.so (not part of its interface).
#ifndef ATP_INTERNAL_H
#define ATP_INTERNAL_H

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "atp_nvshmem.h"

// atp_fail writes a message into err (ATP_NV_ERRLEN bytes) and returns 1.
static inline int atp_fail(char *err, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ATP_NV_ERRLEN, fmt, ap);
    va_end(ap);
  }
  return 1;
}

// CK returns from the calling function with the CUDA error of call, in a
// function that has `char *err`.
#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t ck_e_ = (call);                                                                    \
    if (ck_e_ != cudaSuccess)                                                                      \
      return atp_fail(err, "%s: %s: %s", #call, cudaGetErrorName(ck_e_), cudaGetErrorString(ck_e_)); \
  } while (0)

// atp_use_device makes device current on the calling thread.
int atp_use_device(int device, char *err);
// atp_use_world_device makes the device given to atp_nv_init current.
int atp_use_world_device(char *err);
// atp_scale multiplies n elements of dtype at p by f, on stream st.
int atp_scale(void *p, uint64_t n, int dtype, double f, cudaStream_t st, char *err);
// atp_dtype_size is the size of an element of dtype, 0 if unknown.
static inline int atp_dtype_size(int dtype) {
  switch (dtype) {
    case ATP_NV_F32:
    case ATP_NV_I32:
      return 4;
    case ATP_NV_BF16:
      return 2;
    case ATP_NV_F64:
      return 8;
  }
  return 0;
}

#endif // ATP_INTERNAL_H
