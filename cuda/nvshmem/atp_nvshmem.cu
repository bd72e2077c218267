// atp_nvshmem.cu: the host half of libasynctp_nvshmem.so: NVSHMEM's UID
// bootstrap, the symmetric heap, teams, the on-stream collectives of the
// team path (staged through symmetric scratch), and the CUDA runtime
// helpers the Go side needs. See atp_nvshmem.h for the conventions.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <string.h>

#include <algorithm>
#include <mutex>

#include "atp_internal.h"
#include "atp_nvshmem.h"

namespace {

std::mutex nv_mu; // serialises NVSHMEM host calls (NVSHMEM_THREAD_SERIALIZED)
int world_device = -1;

std::mutex alloc_mu;
cudaStream_t alloc_stream[64]; // per device: the stream of atp_nv_dev_alloc/free

#define NV_LOCK std::lock_guard<std::mutex> nv_lock_(nv_mu)

} // namespace

int atp_use_device(int device, char *err) {
  CK(cudaSetDevice(device));
  return 0;
}

int atp_use_world_device(char *err) {
  if (world_device < 0) return atp_fail(err, "NVSHMEM is not initialised on this process (atp_nv_init)");
  return atp_use_device(world_device, err);
}

extern "C" {

int atp_nv_abi(void) { return ATP_NV_ABI; }

int atp_nv_info(int *major, int *minor, int *patch, int *caps, int *uid_bytes, int *xparams_bytes) {
  *major = NVSHMEM_VENDOR_MAJOR_VERSION;
  *minor = NVSHMEM_VENDOR_MINOR_VERSION;
  *patch = NVSHMEM_VENDOR_PATCH_VERSION;
  int c = 0;
#ifdef ATP_NV_HAVE_BF16_REDUCE
  c |= ATP_NV_CAP_BF16_REDUCE;
#endif
#ifdef ATP_NV_HAVE_REDUCESCATTER
  c |= ATP_NV_CAP_REDUCESCATTER;
#endif
  *caps = c;
  *uid_bytes = (int)sizeof(nvshmemx_uniqueid_t);
  *xparams_bytes = (int)sizeof(atp_nv_xparams);
  return 0;
}

// ---- bootstrap, heap, teams ------------------------------------------------

int atp_nv_get_uniqueid(int device, void *uid, int len, char *err) {
  if (atp_use_device(device, err)) return 1;
  if (len != (int)sizeof(nvshmemx_uniqueid_t))
    return atp_fail(err, "nvshmemx_get_uniqueid: a unique id has %d bytes, not %d", (int)sizeof(nvshmemx_uniqueid_t), len);
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  int rc;
  {
    NV_LOCK;
    rc = nvshmemx_get_uniqueid(&id);
  }
  if (rc != 0) return atp_fail(err, "nvshmemx_get_uniqueid: error %d", rc);
  memcpy(uid, &id, sizeof id);
  return 0;
}

int atp_nv_init(int device, int rank, int npes, const void *uid, int len, int *status, char *err) {
  if (atp_use_device(device, err)) return 1;
  if (len != (int)sizeof(nvshmemx_uniqueid_t))
    return atp_fail(err, "init: a unique id has %d bytes, not %d", (int)sizeof(nvshmemx_uniqueid_t), len);
  NV_LOCK;
  if (world_device >= 0) return atp_fail(err, "init: NVSHMEM is already initialised in this process (on cuda:%d)", world_device);
  nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
  memcpy(&id, uid, sizeof id);
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  int rc = nvshmemx_set_attr_uniqueid_args(rank, npes, &id, &attr);
  if (rc != 0) return atp_fail(err, "nvshmemx_set_attr_uniqueid_args(rank %d, %d PEs): error %d", rank, npes, rc);
  rc = nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
  if (rc != 0) return atp_fail(err, "nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, rank %d of %d): error %d", rank, npes, rc);
  world_device = device;
  if (nvshmem_my_pe() != rank || nvshmem_n_pes() != npes)
    return atp_fail(err, "init: NVSHMEM made this process PE %d of %d, expected %d of %d", nvshmem_my_pe(), nvshmem_n_pes(), rank, npes);
  *status = nvshmemx_init_status();
  return 0;
}

int atp_nv_finalize(char *err) {
  if (atp_use_world_device(err)) return 1;
  NV_LOCK;
  nvshmem_finalize();
  world_device = -1;
  return 0;
}

int atp_nv_calloc(uint64_t bytes, uint64_t *ptr, char *err) {
  if (atp_use_world_device(err)) return 1;
  void *p;
  {
    NV_LOCK;
    p = nvshmem_calloc(1, (size_t)bytes);
  }
  if (p == NULL && bytes > 0)
    return atp_fail(err, "nvshmem_calloc(%llu bytes) failed: the symmetric heap is too small (raise NVSHMEM_SYMMETRIC_SIZE) or the device is out of memory",
                    (unsigned long long)bytes);
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

int atp_nv_free(uint64_t ptr, char *err) {
  if (atp_use_world_device(err)) return 1;
  NV_LOCK;
  nvshmem_free((void *)(uintptr_t)ptr);
  return 0;
}

uint64_t atp_nv_ptr(uint64_t ptr, int pe) {
  if (atp_use_world_device(NULL)) return 0;
  NV_LOCK;
  return (uint64_t)(uintptr_t)nvshmem_ptr((const void *)(uintptr_t)ptr, pe);
}

int atp_nv_team_world(void) { return (int)NVSHMEM_TEAM_WORLD; }

int atp_nv_team_split_strided(int parent, int start, int stride, int size, int *team, char *err) {
  if (atp_use_world_device(err)) return 1;
  nvshmem_team_t t = NVSHMEM_TEAM_INVALID;
  int rc;
  {
    NV_LOCK;
    rc = nvshmem_team_split_strided((nvshmem_team_t)parent, start, stride, size, NULL, 0, &t);
  }
  if (rc != 0)
    return atp_fail(err, "nvshmem_team_split_strided(parent %d, start %d, stride %d, size %d): error %d (NVSHMEM_MAX_TEAMS too low?)",
                    parent, start, stride, size, rc);
  *team = (int)t;
  return 0;
}

int atp_nv_team_destroy(int team, char *err) {
  if (atp_use_world_device(err)) return 1;
  NV_LOCK;
  nvshmem_team_destroy((nvshmem_team_t)team);
  return 0;
}

int atp_nv_cumodule_init(uint64_t module, char *err) {
  if (atp_use_world_device(err)) return 1;
  int rc;
  {
    NV_LOCK;
    rc = nvshmemx_cumodule_init((CUmodule)(uintptr_t)module);
  }
  if (rc != 0) return atp_fail(err, "nvshmemx_cumodule_init: error %d", rc);
  return 0;
}

} // extern "C"

// ---- the team path: on-stream collectives ------------------------------------

namespace {

// fcollect moves bytes per PE with the widest unsigned type that divides the
// size and both addresses.
int fcollect(int team, void *dst, const void *src, uint64_t bytes, cudaStream_t st, char *err) {
  const uint64_t a = (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src | bytes;
  int rc, bits;
  NV_LOCK;
  if (a % 8 == 0) {
    bits = 64;
    rc = nvshmemx_uint64_fcollect_on_stream((nvshmem_team_t)team, (uint64_t *)dst, (const uint64_t *)src, bytes / 8, st);
  } else if (a % 4 == 0) {
    bits = 32;
    rc = nvshmemx_uint32_fcollect_on_stream((nvshmem_team_t)team, (uint32_t *)dst, (const uint32_t *)src, bytes / 4, st);
  } else if (a % 2 == 0) {
    bits = 16;
    rc = nvshmemx_uint16_fcollect_on_stream((nvshmem_team_t)team, (uint16_t *)dst, (const uint16_t *)src, bytes / 2, st);
  } else {
    bits = 8;
    rc = nvshmemx_uint8_fcollect_on_stream((nvshmem_team_t)team, (uint8_t *)dst, (const uint8_t *)src, bytes, st);
  }
  if (rc != 0) return atp_fail(err, "nvshmemx_uint%d_fcollect_on_stream(team %d, %llu bytes): error %d", bits, team, (unsigned long long)bytes, rc);
  return 0;
}

int broadcast(int team, void *dst, const void *src, uint64_t bytes, int root, cudaStream_t st, char *err) {
  const uint64_t a = (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src | bytes;
  int rc, bits;
  NV_LOCK;
  if (a % 8 == 0) {
    bits = 64;
    rc = nvshmemx_uint64_broadcast_on_stream((nvshmem_team_t)team, (uint64_t *)dst, (const uint64_t *)src, bytes / 8, root, st);
  } else if (a % 4 == 0) {
    bits = 32;
    rc = nvshmemx_uint32_broadcast_on_stream((nvshmem_team_t)team, (uint32_t *)dst, (const uint32_t *)src, bytes / 4, root, st);
  } else if (a % 2 == 0) {
    bits = 16;
    rc = nvshmemx_uint16_broadcast_on_stream((nvshmem_team_t)team, (uint16_t *)dst, (const uint16_t *)src, bytes / 2, root, st);
  } else {
    bits = 8;
    rc = nvshmemx_uint8_broadcast_on_stream((nvshmem_team_t)team, (uint8_t *)dst, (const uint8_t *)src, bytes, root, st);
  }
  if (rc != 0)
    return atp_fail(err, "nvshmemx_uint%d_broadcast_on_stream(team %d, %llu bytes, root %d): error %d", bits, team, (unsigned long long)bytes, root, rc);
  return 0;
}

// ATP_RED calls one typed reduction (T_ is the element type in scope).
#define ATP_RED(FN)                                                                                 \
  do {                                                                                              \
    int rc_;                                                                                        \
    {                                                                                               \
      NV_LOCK;                                                                                      \
      rc_ = FN((nvshmem_team_t)team, (T_ *)dst, (const T_ *)src, (size_t)n, st);                    \
    }                                                                                               \
    if (rc_ != 0) return atp_fail(err, #FN "(team %d, %llu elements): error %d", team, (unsigned long long)n, rc_); \
    return 0;                                                                                       \
  } while (0)

// reduce runs nvshmemx_<type>_<sum|max>_reduce_on_stream (scatter false) or
// _reducescatter_on_stream (scatter true); avg is a sum here (the caller
// scales).
int reduce(bool scatter, int team, void *dst, const void *src, uint64_t n, int dtype, int redop, cudaStream_t st, char *err) {
  const bool mx = redop == ATP_NV_MAX;
#ifndef ATP_NV_HAVE_REDUCESCATTER
  if (scatter) return atp_fail(err, "reduce-scatter: this NVSHMEM has no nvshmemx_*_reducescatter_on_stream");
#endif
  switch (dtype) {
    case ATP_NV_F32: {
      typedef float T_;
#ifdef ATP_NV_HAVE_REDUCESCATTER
      if (scatter) {
        if (mx) ATP_RED(nvshmemx_float_max_reducescatter_on_stream);
        ATP_RED(nvshmemx_float_sum_reducescatter_on_stream);
      }
#endif
      if (mx) ATP_RED(nvshmemx_float_max_reduce_on_stream);
      ATP_RED(nvshmemx_float_sum_reduce_on_stream);
    }
    case ATP_NV_F64: {
      typedef double T_;
#ifdef ATP_NV_HAVE_REDUCESCATTER
      if (scatter) {
        if (mx) ATP_RED(nvshmemx_double_max_reducescatter_on_stream);
        ATP_RED(nvshmemx_double_sum_reducescatter_on_stream);
      }
#endif
      if (mx) ATP_RED(nvshmemx_double_max_reduce_on_stream);
      ATP_RED(nvshmemx_double_sum_reduce_on_stream);
    }
    case ATP_NV_I32: {
      typedef int T_;
#ifdef ATP_NV_HAVE_REDUCESCATTER
      if (scatter) {
        if (mx) ATP_RED(nvshmemx_int_max_reducescatter_on_stream);
        ATP_RED(nvshmemx_int_sum_reducescatter_on_stream);
      }
#endif
      if (mx) ATP_RED(nvshmemx_int_max_reduce_on_stream);
      ATP_RED(nvshmemx_int_sum_reduce_on_stream);
    }
    case ATP_NV_BF16: {
#ifdef ATP_NV_HAVE_BF16_REDUCE
      typedef __nv_bfloat16 T_;
#ifdef ATP_NV_HAVE_REDUCESCATTER
      if (scatter) {
        if (mx) ATP_RED(nvshmemx_bfloat16_max_reducescatter_on_stream);
        ATP_RED(nvshmemx_bfloat16_sum_reducescatter_on_stream);
      }
#endif
      if (mx) ATP_RED(nvshmemx_bfloat16_max_reduce_on_stream);
      ATP_RED(nvshmemx_bfloat16_sum_reduce_on_stream);
#else
      return atp_fail(err, "this NVSHMEM has no bfloat16 reductions");
#endif
    }
  }
  return atp_fail(err, "reduction of dtype %d: expected f32, f64, i32 or bf16", dtype);
}

#undef ATP_RED

uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }

// staging_done orders the next reuse of the team's staging after every PE
// has finished this chunk: PEs leave a collective at different times, and
// NVSHMEM leaves concurrent access to symmetric memory by a collective and
// by anything else undefined, so a PE that overwrote its staging with the
// next chunk while a slower peer's collective still read it (or wrote into
// it) corrupted that peer's result. Seen on 2 PEs sharing a GPU under MPS:
// reduce-scatters of 32 MiB parts (6 chunks of the 16 MiB staging) wrong by
// up to 12 % in some runs; parts that fit one chunk never.
void staging_done(int team, cudaStream_t st) {
  NV_LOCK;
  nvshmemx_barrier_on_stream((nvshmem_team_t)team, st);
}

} // namespace

extern "C" {

int atp_nv_allgather(int team, int npes, uint64_t dst, uint64_t src, uint64_t bytes, int direct, uint64_t scratch,
                     uint64_t scratch_bytes, uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  cudaStream_t st = (cudaStream_t)(uintptr_t)stream;
  if (bytes == 0) return 0;
  if (direct) return fcollect(team, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, st, err);
  const uint64_t chunk = align_down(scratch_bytes / (uint64_t)(npes + 1), 256);
  if (chunk == 0) return atp_fail(err, "all-gather: %llu bytes of staging are too few for %d PEs", (unsigned long long)scratch_bytes, npes);
  char *in = (char *)(uintptr_t)scratch, *out = in + chunk;
  for (uint64_t off = 0; off < bytes; off += chunk) {
    const uint64_t c = std::min(chunk, bytes - off);
    CK(cudaMemcpyAsync(in, (const char *)(uintptr_t)src + off, c, cudaMemcpyDeviceToDevice, st));
    if (fcollect(team, out, in, c, st, err)) return 1;
    // Row k of out (c bytes) is part k's bytes [off, off+c).
    CK(cudaMemcpy2DAsync((char *)(uintptr_t)dst + off, bytes, out, c, c, npes, cudaMemcpyDeviceToDevice, st));
    staging_done(team, st);
  }
  return 0;
}

int atp_nv_reducescatter(int team, int npes, uint64_t dst, uint64_t src, uint64_t n, int dtype, int redop, int direct,
                         uint64_t scratch, uint64_t scratch_bytes, uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  cudaStream_t st = (cudaStream_t)(uintptr_t)stream;
  const int es = atp_dtype_size(dtype);
  if (es == 0) return atp_fail(err, "reduce-scatter: unknown dtype %d", dtype);
  if (n == 0) return 0;
  const uint64_t part = n * es;
  const double scale = 1.0 / npes;
#ifdef ATP_NV_HAVE_REDUCESCATTER
  if (direct) {
    if (reduce(true, team, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, dtype, redop, st, err)) return 1;
    return redop == ATP_NV_AVG ? atp_scale((void *)(uintptr_t)dst, n, dtype, scale, st, err) : 0;
  }
  const uint64_t chunk = align_down(scratch_bytes / (uint64_t)(npes + 1), 256) / es; // elements
  if (chunk == 0) return atp_fail(err, "reduce-scatter: %llu bytes of staging are too few for %d PEs", (unsigned long long)scratch_bytes, npes);
  char *in = (char *)(uintptr_t)scratch, *out = in + npes * chunk * es;
  for (uint64_t e = 0; e < n; e += chunk) {
    const uint64_t c = std::min(chunk, n - e);
    // Row k of in (c elements) is elements [e, e+c) of part k of src.
    CK(cudaMemcpy2DAsync(in, c * es, (const char *)(uintptr_t)src + e * es, part, c * es, npes, cudaMemcpyDeviceToDevice, st));
    if (reduce(true, team, out, in, c, dtype, redop, st, err)) return 1;
    if (redop == ATP_NV_AVG && atp_scale(out, c, dtype, scale, st, err)) return 1;
    CK(cudaMemcpyAsync((char *)(uintptr_t)dst + e * es, out, c * es, cudaMemcpyDeviceToDevice, st));
    staging_done(team, st);
  }
  return 0;
#else
  // Without reducescatter: reduce the npes parts of each chunk everywhere and
  // keep this PE's.
  (void)direct;
  const int me = nvshmem_team_my_pe((nvshmem_team_t)team);
  const uint64_t chunk = align_down(scratch_bytes / (uint64_t)(2 * npes), 256) / es;
  if (chunk == 0) return atp_fail(err, "reduce-scatter: %llu bytes of staging are too few for %d PEs", (unsigned long long)scratch_bytes, npes);
  char *in = (char *)(uintptr_t)scratch, *out = in + npes * chunk * es;
  for (uint64_t e = 0; e < n; e += chunk) {
    const uint64_t c = std::min(chunk, n - e);
    CK(cudaMemcpy2DAsync(in, c * es, (const char *)(uintptr_t)src + e * es, part, c * es, npes, cudaMemcpyDeviceToDevice, st));
    if (reduce(false, team, out, in, npes * c, dtype, redop, st, err)) return 1;
    if (redop == ATP_NV_AVG && atp_scale(out + me * c * es, c, dtype, scale, st, err)) return 1;
    CK(cudaMemcpyAsync((char *)(uintptr_t)dst + e * es, out + me * c * es, c * es, cudaMemcpyDeviceToDevice, st));
    staging_done(team, st);
  }
  return 0;
#endif
}

int atp_nv_allreduce(int team, int npes, uint64_t buf, uint64_t n, int dtype, int redop, uint64_t scratch,
                     uint64_t scratch_bytes, uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  cudaStream_t st = (cudaStream_t)(uintptr_t)stream;
  const int es = atp_dtype_size(dtype);
  if (es == 0) return atp_fail(err, "all-reduce: unknown dtype %d", dtype);
  const uint64_t chunk = align_down(scratch_bytes / 2, 256) / es;
  if (chunk == 0) return atp_fail(err, "all-reduce: %llu bytes of staging are too few", (unsigned long long)scratch_bytes);
  char *in = (char *)(uintptr_t)scratch, *out = in + chunk * es;
  for (uint64_t e = 0; e < n; e += chunk) {
    const uint64_t c = std::min(chunk, n - e);
    char *b = (char *)(uintptr_t)buf + e * es;
    CK(cudaMemcpyAsync(in, b, c * es, cudaMemcpyDeviceToDevice, st));
    if (reduce(false, team, out, in, c, dtype, redop, st, err)) return 1;
    if (redop == ATP_NV_AVG && atp_scale(out, c, dtype, 1.0 / npes, st, err)) return 1;
    CK(cudaMemcpyAsync(b, out, c * es, cudaMemcpyDeviceToDevice, st));
    staging_done(team, st);
  }
  return 0;
}

int atp_nv_broadcast(int team, int me, int root, uint64_t buf, uint64_t bytes, uint64_t scratch, uint64_t scratch_bytes,
                     uint64_t stream, char *err) {
  if (atp_use_world_device(err)) return 1;
  cudaStream_t st = (cudaStream_t)(uintptr_t)stream;
  const uint64_t chunk = align_down(scratch_bytes / 2, 256);
  if (chunk == 0) return atp_fail(err, "broadcast: %llu bytes of staging are too few", (unsigned long long)scratch_bytes);
  char *in = (char *)(uintptr_t)scratch, *out = in + chunk;
  for (uint64_t off = 0; off < bytes; off += chunk) {
    const uint64_t c = std::min(chunk, bytes - off);
    char *b = (char *)(uintptr_t)buf + off;
    if (me == root) CK(cudaMemcpyAsync(in, b, c, cudaMemcpyDeviceToDevice, st));
    if (broadcast(team, out, in, c, root, st, err)) return 1;
    if (me != root) CK(cudaMemcpyAsync(b, out, c, cudaMemcpyDeviceToDevice, st));
  }
  return 0;
}

// ---- CUDA runtime helpers -----------------------------------------------------

int atp_nv_device_count(int *n, char *err) {
  CK(cudaGetDeviceCount(n));
  return 0;
}

int atp_nv_device_info(int device, char *name, int namelen, char *pci, int pcilen, char *err) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  snprintf(name, namelen, "%s", prop.name);
  CK(cudaDeviceGetPCIBusId(pci, pcilen, device));
  return 0;
}

int atp_nv_stream_create(int device, uint64_t *stream, char *err) {
  if (atp_use_device(device, err)) return 1;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *stream = (uint64_t)(uintptr_t)s;
  return 0;
}

int atp_nv_stream_destroy(int device, uint64_t stream, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaStreamDestroy((cudaStream_t)(uintptr_t)stream));
  return 0;
}

int atp_nv_stream_sync(int device, uint64_t stream, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaStreamSynchronize((cudaStream_t)(uintptr_t)stream));
  return 0;
}

int atp_nv_event_create(int device, uint64_t *event, char *err) {
  if (atp_use_device(device, err)) return 1;
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  *event = (uint64_t)(uintptr_t)e;
  return 0;
}

int atp_nv_event_destroy(int device, uint64_t event, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaEventDestroy((cudaEvent_t)(uintptr_t)event));
  return 0;
}

int atp_nv_event_record(int device, uint64_t event, uint64_t stream, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaEventRecord((cudaEvent_t)(uintptr_t)event, (cudaStream_t)(uintptr_t)stream));
  return 0;
}

int atp_nv_event_query(int device, uint64_t event, char *err) {
  if (atp_use_device(device, err)) return -1;
  cudaError_t e = cudaEventQuery((cudaEvent_t)(uintptr_t)event);
  if (e == cudaSuccess) return 0;
  if (e == cudaErrorNotReady) return 1;
  atp_fail(err, "cudaEventQuery: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  return -1;
}

int atp_nv_stream_wait_event(int device, uint64_t stream, uint64_t event, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaStreamWaitEvent((cudaStream_t)(uintptr_t)stream, (cudaEvent_t)(uintptr_t)event, 0));
  return 0;
}

int atp_nv_memcpy_async(int device, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaMemcpyAsync((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToDevice,
                     (cudaStream_t)(uintptr_t)stream));
  return 0;
}

int atp_nv_memset_async(int device, uint64_t dst, int value, uint64_t bytes, uint64_t stream, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaMemsetAsync((void *)(uintptr_t)dst, value, bytes, (cudaStream_t)(uintptr_t)stream));
  return 0;
}

static int allocator_stream(int device, cudaStream_t *s, char *err) {
  if (device < 0 || device >= 64) return atp_fail(err, "device %d: expected an ordinal below 64", device);
  std::lock_guard<std::mutex> lock(alloc_mu);
  if (alloc_stream[device] == NULL) CK(cudaStreamCreateWithFlags(&alloc_stream[device], cudaStreamNonBlocking));
  *s = alloc_stream[device];
  return 0;
}

int atp_nv_dev_alloc(int device, uint64_t bytes, uint64_t *ptr, char *err) {
  if (atp_use_device(device, err)) return 1;
  cudaStream_t s;
  if (allocator_stream(device, &s, err)) return 1;
  void *p = NULL;
  CK(cudaMallocAsync(&p, bytes > 0 ? bytes : 1, s));
  CK(cudaStreamSynchronize(s));
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

int atp_nv_dev_free(int device, uint64_t ptr, char *err) {
  if (atp_use_device(device, err)) return 1;
  cudaStream_t s;
  if (allocator_stream(device, &s, err)) return 1;
  CK(cudaFreeAsync((void *)(uintptr_t)ptr, s));
  return 0;
}

int atp_nv_htod(int device, uint64_t dst, const void *src, uint64_t bytes, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaMemcpy((void *)(uintptr_t)dst, src, bytes, cudaMemcpyHostToDevice));
  return 0;
}

int atp_nv_dtoh(int device, void *dst, uint64_t src, uint64_t bytes, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaMemcpy(dst, (const void *)(uintptr_t)src, bytes, cudaMemcpyDeviceToHost));
  return 0;
}

int atp_nv_host_alloc(int device, uint64_t bytes, uint64_t *host, uint64_t *dev, char *err) {
  if (atp_use_device(device, err)) return 1;
  void *h = NULL, *d = NULL;
  CK(cudaHostAlloc(&h, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(h, 0, bytes);
  CK(cudaHostGetDevicePointer(&d, h, 0));
  *host = (uint64_t)(uintptr_t)h;
  *dev = (uint64_t)(uintptr_t)d;
  return 0;
}

int atp_nv_host_free(int device, uint64_t host, char *err) {
  if (atp_use_device(device, err)) return 1;
  CK(cudaFreeHost((void *)(uintptr_t)host));
  return 0;
}

} // extern "C"
