// Loading and trampolines for package nvshmem: the table of the entry points
// of libasynctp_nvshmem.so (declared in cuda/nvshmem/atp_nvshmem.h), filled
// with dlsym, and one C function per entry point for cgo to call (cgo cannot
// call through a function pointer). The trampolines are named atpg_* so
// that they never interpose on the library's own atp_nv_* symbols.
#ifndef ATP_LOADER_H
#define ATP_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "atp_nvshmem.h"

#define ATPG_FUNCS(X)                                                                                 \
  X(atp_nv_abi)                                                                                       \
  X(atp_nv_info)                                                                                      \
  X(atp_nv_get_uniqueid)                                                                              \
  X(atp_nv_init)                                                                                      \
  X(atp_nv_finalize)                                                                                  \
  X(atp_nv_calloc)                                                                                    \
  X(atp_nv_free)                                                                                      \
  X(atp_nv_ptr)                                                                                       \
  X(atp_nv_team_world)                                                                                \
  X(atp_nv_team_split_strided)                                                                        \
  X(atp_nv_team_destroy)                                                                              \
  X(atp_nv_cumodule_init)                                                                             \
  X(atp_nv_allgather)                                                                                 \
  X(atp_nv_reducescatter)                                                                             \
  X(atp_nv_allreduce)                                                                                 \
  X(atp_nv_broadcast)                                                                                 \
  X(atp_nv_exchange)                                                                                  \
  X(atp_nv_barrier)                                                                                   \
  X(atp_nv_smoke_put)                                                                                 \
  X(atp_nv_smoke_wait)                                                                                \
  X(atp_nv_device_count)                                                                              \
  X(atp_nv_device_info)                                                                               \
  X(atp_nv_stream_create)                                                                             \
  X(atp_nv_stream_destroy)                                                                            \
  X(atp_nv_stream_sync)                                                                               \
  X(atp_nv_event_create)                                                                              \
  X(atp_nv_event_destroy)                                                                             \
  X(atp_nv_event_record)                                                                              \
  X(atp_nv_event_query)                                                                               \
  X(atp_nv_stream_wait_event)                                                                         \
  X(atp_nv_memcpy_async)                                                                              \
  X(atp_nv_memset_async)                                                                              \
  X(atp_nv_dev_alloc)                                                                                 \
  X(atp_nv_dev_free)                                                                                  \
  X(atp_nv_htod)                                                                                      \
  X(atp_nv_dtoh)                                                                                      \
  X(atp_nv_host_alloc)                                                                                \
  X(atp_nv_host_free)

// internal/dynlib opens and closes the library (dynlib.Open).
// atpg_resolve looks every entry point up in handle (atp_dl_resolve of
// internal/dynlib/dynlib.h); it returns NULL, or the
// name of the first one missing. With install, the table is installed for
// the trampolines.
const char *atpg_resolve(void *handle, int install);

int atpg_abi(void);
int atpg_info(int *major, int *minor, int *patch, int *caps, int *uid_bytes, int *xparams_bytes);
int atpg_get_uniqueid(int device, void *uid, int len, char *err);
int atpg_init(int device, int rank, int npes, const void *uid, int len, int *status, char *err);
int atpg_finalize(char *err);
int atpg_calloc(uint64_t bytes, uint64_t *ptr, char *err);
int atpg_free(uint64_t ptr, char *err);
uint64_t atpg_ptr(uint64_t ptr, int pe);
int atpg_team_world(void);
int atpg_team_split_strided(int parent, int start, int stride, int size, int *team, char *err);
int atpg_team_destroy(int team, char *err);
int atpg_cumodule_init(uint64_t module, char *err);
int atpg_allgather(int team, int npes, uint64_t dst, uint64_t src, uint64_t bytes, int direct, uint64_t scratch,
                   uint64_t scratch_bytes, uint64_t stream, char *err);
int atpg_reducescatter(int team, int npes, uint64_t dst, uint64_t src, uint64_t n, int dtype, int redop, int direct,
                       uint64_t scratch, uint64_t scratch_bytes, uint64_t stream, char *err);
int atpg_allreduce(int team, int npes, uint64_t buf, uint64_t n, int dtype, int redop, uint64_t scratch,
                   uint64_t scratch_bytes, uint64_t stream, char *err);
int atpg_broadcast(int team, int me, int root, uint64_t buf, uint64_t bytes, uint64_t scratch, uint64_t scratch_bytes,
                   uint64_t stream, char *err);
int atpg_exchange(const atp_nv_xparams *p, uint64_t stream, char *err);
int atpg_barrier(const atp_nv_bparams *p, uint64_t stream, char *err);
int atpg_smoke_put(uint64_t buf, uint64_t src, uint64_t sig, int nints, int value, int pe, uint64_t sigval,
                   uint64_t stream, char *err);
int atpg_smoke_wait(uint64_t buf, uint64_t sig, int nints, int value, uint64_t sigval, uint64_t bad, uint64_t stream,
                    char *err);
int atpg_device_count(int *n, char *err);
int atpg_device_info(int device, char *name, int namelen, char *pci, int pcilen, char *err);
int atpg_stream_create(int device, uint64_t *stream, char *err);
int atpg_stream_destroy(int device, uint64_t stream, char *err);
int atpg_stream_sync(int device, uint64_t stream, char *err);
int atpg_event_create(int device, uint64_t *event, char *err);
int atpg_event_destroy(int device, uint64_t event, char *err);
int atpg_event_record(int device, uint64_t event, uint64_t stream, char *err);
int atpg_event_query(int device, uint64_t event, char *err);
int atpg_stream_wait_event(int device, uint64_t stream, uint64_t event, char *err);
int atpg_memcpy_async(int device, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream, char *err);
int atpg_memset_async(int device, uint64_t dst, int value, uint64_t bytes, uint64_t stream, char *err);
int atpg_dev_alloc(int device, uint64_t bytes, uint64_t *ptr, char *err);
int atpg_dev_free(int device, uint64_t ptr, char *err);
int atpg_htod(int device, uint64_t dst, const void *src, uint64_t bytes, char *err);
int atpg_dtoh(int device, void *dst, uint64_t src, uint64_t bytes, char *err);
int atpg_host_alloc(int device, uint64_t bytes, uint64_t *host, uint64_t *dev, char *err);
int atpg_host_free(int device, uint64_t host, char *err);


// Records of failed kernels, in mapped host memory (atp_nv_host_alloc):
// atpg_read_rec copies record idx (its code first) and returns the code;
// atpg_clear_rec zeroes it.
int atpg_read_rec(uint64_t host, int idx, atp_nv_errrec *out);
void atpg_clear_rec(uint64_t host, int idx);

#endif
