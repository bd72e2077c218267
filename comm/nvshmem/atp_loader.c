// Loading and trampolines for package nvshmem; see atp_loader.h.

#define _GNU_SOURCE
#include "atp_loader.h"

#include "dynlib.h" // defines: atp_dl_sym (a table slot), atp_dl_resolve (fills a table with dlsym)

#include <string.h>

#define ATPG_MEMBER(f) __typeof__(&f) f;
typedef struct {
  ATPG_FUNCS(ATPG_MEMBER)
} atpg_table;

// The table the trampolines call: all NULL until a library is installed.
static atpg_table api;

// Every entry point is required.
#define ATPG_SYM(f) {{#f}, offsetof(atpg_table, f), 0},
static const atp_dl_sym syms[] = {ATPG_FUNCS(ATPG_SYM)};
#undef ATPG_SYM

const char *atpg_resolve(void *handle, int install) {
  atpg_table t;
  const char *missing = NULL;
  if (atp_dl_resolve(handle, syms, ATP_DL_NSYMS(syms), &t, sizeof t, NULL, &missing) != 0) return missing;
  if (install) api = t;
  return NULL;
}

int atpg_abi(void) { return api.atp_nv_abi(); }
int atpg_info(int *major, int *minor, int *patch, int *caps, int *uid_bytes, int *xparams_bytes) {
  return api.atp_nv_info(major, minor, patch, caps, uid_bytes, xparams_bytes);
}
int atpg_get_uniqueid(int device, void *uid, int len, char *err) { return api.atp_nv_get_uniqueid(device, uid, len, err); }
int atpg_init(int device, int rank, int npes, const void *uid, int len, int *status, char *err) {
  return api.atp_nv_init(device, rank, npes, uid, len, status, err);
}
int atpg_finalize(char *err) { return api.atp_nv_finalize(err); }
int atpg_calloc(uint64_t bytes, uint64_t *ptr, char *err) { return api.atp_nv_calloc(bytes, ptr, err); }
int atpg_free(uint64_t ptr, char *err) { return api.atp_nv_free(ptr, err); }
uint64_t atpg_ptr(uint64_t ptr, int pe) { return api.atp_nv_ptr(ptr, pe); }
int atpg_team_world(void) { return api.atp_nv_team_world(); }
int atpg_team_split_strided(int parent, int start, int stride, int size, int *team, char *err) {
  return api.atp_nv_team_split_strided(parent, start, stride, size, team, err);
}
int atpg_team_destroy(int team, char *err) { return api.atp_nv_team_destroy(team, err); }
int atpg_cumodule_init(uint64_t module, char *err) { return api.atp_nv_cumodule_init(module, err); }
int atpg_allgather(int team, int npes, uint64_t dst, uint64_t src, uint64_t bytes, int direct, uint64_t scratch,
                   uint64_t scratch_bytes, uint64_t stream, char *err) {
  return api.atp_nv_allgather(team, npes, dst, src, bytes, direct, scratch, scratch_bytes, stream, err);
}
int atpg_reducescatter(int team, int npes, uint64_t dst, uint64_t src, uint64_t n, int dtype, int redop, int direct,
                       uint64_t scratch, uint64_t scratch_bytes, uint64_t stream, char *err) {
  return api.atp_nv_reducescatter(team, npes, dst, src, n, dtype, redop, direct, scratch, scratch_bytes, stream, err);
}
int atpg_allreduce(int team, int npes, uint64_t buf, uint64_t n, int dtype, int redop, uint64_t scratch,
                   uint64_t scratch_bytes, uint64_t stream, char *err) {
  return api.atp_nv_allreduce(team, npes, buf, n, dtype, redop, scratch, scratch_bytes, stream, err);
}
int atpg_broadcast(int team, int me, int root, uint64_t buf, uint64_t bytes, uint64_t scratch, uint64_t scratch_bytes,
                   uint64_t stream, char *err) {
  return api.atp_nv_broadcast(team, me, root, buf, bytes, scratch, scratch_bytes, stream, err);
}
int atpg_exchange(const atp_nv_xparams *p, uint64_t stream, char *err) { return api.atp_nv_exchange(p, stream, err); }
int atpg_barrier(const atp_nv_bparams *p, uint64_t stream, char *err) { return api.atp_nv_barrier(p, stream, err); }
int atpg_smoke_put(uint64_t buf, uint64_t src, uint64_t sig, int nints, int value, int pe, uint64_t sigval,
                   uint64_t stream, char *err) {
  return api.atp_nv_smoke_put(buf, src, sig, nints, value, pe, sigval, stream, err);
}
int atpg_smoke_wait(uint64_t buf, uint64_t sig, int nints, int value, uint64_t sigval, uint64_t bad, uint64_t stream,
                    char *err) {
  return api.atp_nv_smoke_wait(buf, sig, nints, value, sigval, bad, stream, err);
}
int atpg_device_count(int *n, char *err) { return api.atp_nv_device_count(n, err); }
int atpg_device_info(int device, char *name, int namelen, char *pci, int pcilen, char *err) {
  return api.atp_nv_device_info(device, name, namelen, pci, pcilen, err);
}
int atpg_stream_create(int device, uint64_t *stream, char *err) { return api.atp_nv_stream_create(device, stream, err); }
int atpg_stream_destroy(int device, uint64_t stream, char *err) { return api.atp_nv_stream_destroy(device, stream, err); }
int atpg_stream_sync(int device, uint64_t stream, char *err) { return api.atp_nv_stream_sync(device, stream, err); }
int atpg_event_create(int device, uint64_t *event, char *err) { return api.atp_nv_event_create(device, event, err); }
int atpg_event_destroy(int device, uint64_t event, char *err) { return api.atp_nv_event_destroy(device, event, err); }
int atpg_event_record(int device, uint64_t event, uint64_t stream, char *err) {
  return api.atp_nv_event_record(device, event, stream, err);
}
int atpg_event_query(int device, uint64_t event, char *err) { return api.atp_nv_event_query(device, event, err); }
int atpg_stream_wait_event(int device, uint64_t stream, uint64_t event, char *err) {
  return api.atp_nv_stream_wait_event(device, stream, event, err);
}
int atpg_memcpy_async(int device, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream, char *err) {
  return api.atp_nv_memcpy_async(device, dst, src, bytes, stream, err);
}
int atpg_memset_async(int device, uint64_t dst, int value, uint64_t bytes, uint64_t stream, char *err) {
  return api.atp_nv_memset_async(device, dst, value, bytes, stream, err);
}
int atpg_dev_alloc(int device, uint64_t bytes, uint64_t *ptr, char *err) { return api.atp_nv_dev_alloc(device, bytes, ptr, err); }
int atpg_dev_free(int device, uint64_t ptr, char *err) { return api.atp_nv_dev_free(device, ptr, err); }
int atpg_htod(int device, uint64_t dst, const void *src, uint64_t bytes, char *err) {
  return api.atp_nv_htod(device, dst, src, bytes, err);
}
int atpg_dtoh(int device, void *dst, uint64_t src, uint64_t bytes, char *err) {
  return api.atp_nv_dtoh(device, dst, src, bytes, err);
}
int atpg_host_alloc(int device, uint64_t bytes, uint64_t *host, uint64_t *dev, char *err) {
  return api.atp_nv_host_alloc(device, bytes, host, dev, err);
}
int atpg_host_free(int device, uint64_t host, char *err) { return api.atp_nv_host_free(device, host, err); }

int atpg_read_rec(uint64_t host, int idx, atp_nv_errrec *out) {
  volatile atp_nv_errrec *r = (volatile atp_nv_errrec *)(uintptr_t)host + idx;
  out->code = r->code;
  __sync_synchronize();
  out->peer = r->peer;
  out->op = r->op;
  out->block = r->block;
  out->waited_ns = r->waited_ns;
  return out->code;
}

void atpg_clear_rec(uint64_t host, int idx) {
  volatile atp_nv_errrec *r = (volatile atp_nv_errrec *)(uintptr_t)host + idx;
  r->code = 0;
  r->peer = 0;
  r->op = 0;
  r->block = 0;
  r->waited_ns = 0;
  __sync_synchronize();
}
