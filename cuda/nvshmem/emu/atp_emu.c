// atp_emu.c: a CPU emulation of libasynctp_nvshmem.so, for tests on machines
// without a GPU or NVSHMEM. It exports the same C interface (atp_nvshmem.h)
// with host memory for device memory, so that comm/nvshmem's multi-process
// tests (TestEmulated) run the real Go side end to end: UID bootstrap,
// arena, P2P detection, Split with slots and barriers, every op, the
// watchdog, Close.
//
//   cc -O2 -shared -fPIC -pthread -o libatp_emu.so atp_emu.c -lrt
//
// Model:
//   - PEs are processes. Each PE's symmetric heap is a POSIX shared-memory
//     segment (named after the unique id) that every PE maps, so a
//     symmetric address translates to a peer's copy like nvshmem_ptr does.
//     NVSHMEM's mode is "limited MPG" (several PEs on one GPU): no teams,
//     every op runs on the exchange kernels.
//   - A stream is a worker thread running its jobs in order; an event is a
//     (stream, job number) pair; the legacy stream (0) runs jobs at once.
//   - A kernel launch is a job that runs every block on its own thread and
//     joins them. Each block runs its CUDA threads one after the other, so
//     the block-level code below mirrors atp_exchange.cu with the
//     per-thread loops written out. Signals are release stores and
//     acquire loads on the peers' mappings.
// Not emulated: NVSHMEM's team collectives (they fail), timing, the CUDA
// memory model beyond acquire/release.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../atp_nvshmem.h"

#define EMU_HEAP (1ull << 32) // bytes of each PE's heap segment (sparse)
#define EMU_UID 128

static int fail(char *err, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, ATP_NV_ERRLEN, fmt, ap);
    va_end(ap);
  }
  return 1;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// ---- the world ----------------------------------------------------------------

typedef struct {
  uint64_t count, gen; // the process-shared barrier
} ctl_t;

static struct {
  int rank, npes, inited;
  char name[64];
  char *heap[ATP_NV_MAXP];
  uint64_t brk;
  ctl_t *ctl;
} W;

static void *map_segment(const char *name, uint64_t bytes, int create, char *err) {
  int fd = -1;
  for (int i = 0; i < 60000 && fd < 0; i++) { // a peer's segment may not exist yet
    fd = shm_open(name, O_RDWR | (create ? O_CREAT : 0), 0600);
    if (fd < 0 && (create || errno != ENOENT)) break;
    if (fd < 0) usleep(1000);
  }
  if (fd < 0) {
    fail(err, "emu: shm_open(%s): %s", name, strerror(errno));
    return NULL;
  }
  if (create && ftruncate(fd, (off_t)bytes) != 0) {
    fail(err, "emu: ftruncate(%s): %s", name, strerror(errno));
    close(fd);
    return NULL;
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    fail(err, "emu: mmap(%s): %s", name, strerror(errno));
    return NULL;
  }
  return p;
}

static void barrier_all(void) {
  uint64_t gen = __atomic_load_n(&W.ctl->gen, __ATOMIC_ACQUIRE);
  if (__atomic_fetch_add(&W.ctl->count, 1, __ATOMIC_ACQ_REL) == (uint64_t)W.npes - 1) {
    __atomic_store_n(&W.ctl->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&W.ctl->gen, gen + 1, __ATOMIC_RELEASE);
    return;
  }
  while (__atomic_load_n(&W.ctl->gen, __ATOMIC_ACQUIRE) == gen) usleep(50);
}

// peer_addr translates this PE's symmetric address p to pe's copy.
static char *peer_addr(uint64_t p, int pe) {
  uint64_t off = p - (uint64_t)(uintptr_t)W.heap[W.rank];
  if (off >= EMU_HEAP || pe < 0 || pe >= W.npes) return NULL;
  return W.heap[pe] + off;
}

int atp_nv_abi(void) { return ATP_NV_ABI; }

int atp_nv_info(int *major, int *minor, int *patch, int *caps, int *uid_bytes, int *xparams_bytes) {
  *major = 0, *minor = 0, *patch = 0, *caps = 0;
  *uid_bytes = EMU_UID;
  *xparams_bytes = (int)sizeof(atp_nv_xparams);
  return 0;
}

int atp_nv_get_uniqueid(int device, void *uid, int len, char *err) {
  (void)device;
  if (len != EMU_UID) return fail(err, "emu: a unique id has %d bytes, not %d", EMU_UID, len);
  memset(uid, 0, len);
  snprintf((char *)uid, len, "%x%x%x", (unsigned)getpid(), (unsigned)now_ns(), (unsigned)rand());
  return 0;
}

int atp_nv_init(int device, int rank, int npes, const void *uid, int len, int *status, char *err) {
  (void)device;
  if (W.inited) return fail(err, "emu: already initialised");
  if (len != EMU_UID || npes < 1 || npes > ATP_NV_MAXP) return fail(err, "emu: init: bad arguments");
  W.rank = rank, W.npes = npes;
  snprintf(W.name, sizeof W.name, "/atpemu-%.40s", (const char *)uid);
  char name[96];
  snprintf(name, sizeof name, "%s-ctl", W.name);
  if ((W.ctl = map_segment(name, sizeof(ctl_t), 1, err)) == NULL) return 1;
  snprintf(name, sizeof name, "%s-%d", W.name, rank);
  if ((W.heap[rank] = map_segment(name, EMU_HEAP, 1, err)) == NULL) return 1;
  barrier_all(); // every segment exists
  for (int q = 0; q < npes; q++) {
    if (q == rank) continue;
    snprintf(name, sizeof name, "%s-%d", W.name, q);
    if ((W.heap[q] = map_segment(name, EMU_HEAP, 0, err)) == NULL) return 1;
  }
  barrier_all(); // everyone mapped everything: the names can go
  snprintf(name, sizeof name, "%s-%d", W.name, rank);
  shm_unlink(name);
  if (rank == 0) {
    snprintf(name, sizeof name, "%s-ctl", W.name);
    shm_unlink(name);
  }
  W.inited = 1;
  *status = 3; // limited MPG: several PEs on one "GPU"
  return 0;
}

int atp_nv_finalize(char *err) {
  (void)err;
  barrier_all();
  W.inited = 0;
  return 0;
}

int atp_nv_calloc(uint64_t bytes, uint64_t *ptr, char *err) {
  W.brk = (W.brk + 255) / 256 * 256;
  if (W.brk + bytes > EMU_HEAP) return fail(err, "emu: the symmetric heap is full");
  char *p = W.heap[W.rank] + W.brk;
  W.brk += bytes > 0 ? bytes : 1;
  memset(p, 0, bytes);
  barrier_all();
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

int atp_nv_free(uint64_t ptr, char *err) {
  (void)ptr, (void)err;
  barrier_all(); // collective; the emulated heap never reuses memory
  return 0;
}

uint64_t atp_nv_ptr(uint64_t ptr, int pe) { return (uint64_t)(uintptr_t)peer_addr(ptr, pe); }
int atp_nv_team_world(void) { return 0; }
int atp_nv_team_split_strided(int parent, int start, int stride, int size, int *team, char *err) {
  (void)parent, (void)start, (void)stride, (void)size, (void)team;
  return fail(err, "emu: teams are not emulated");
}
int atp_nv_team_destroy(int team, char *err) {
  (void)team;
  return fail(err, "emu: teams are not emulated");
}
int atp_nv_cumodule_init(uint64_t module, char *err) {
  (void)module;
  return fail(err, "emu: no modules");
}

#define NO_TEAMS return fail(err, "emu: NVSHMEM collectives are not emulated")
int atp_nv_allgather(int team, int npes, uint64_t dst, uint64_t src, uint64_t bytes, int direct, uint64_t scratch,
                     uint64_t scratch_bytes, uint64_t stream, char *err) {
  NO_TEAMS;
}
int atp_nv_reducescatter(int team, int npes, uint64_t dst, uint64_t src, uint64_t n, int dtype, int redop, int direct,
                         uint64_t scratch, uint64_t scratch_bytes, uint64_t stream, char *err) {
  NO_TEAMS;
}
int atp_nv_allreduce(int team, int npes, uint64_t buf, uint64_t n, int dtype, int redop, uint64_t scratch,
                     uint64_t scratch_bytes, uint64_t stream, char *err) {
  NO_TEAMS;
}
int atp_nv_broadcast(int team, int me, int root, uint64_t buf, uint64_t bytes, uint64_t scratch, uint64_t scratch_bytes,
                     uint64_t stream, char *err) {
  NO_TEAMS;
}

// ---- streams and events ----------------------------------------------------------

typedef struct job {
  void (*fn)(void *);
  void *arg;
  struct job *next;
} job_t;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  job_t *head, *tail;
  uint64_t queued, done;
  int stop;
  pthread_t th;
} stream_t;

typedef struct {
  stream_t *s;
  uint64_t ticket; // done once s->done ≥ ticket
} event_t;

static void *worker(void *arg) {
  stream_t *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->head == NULL && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    if (s->head == NULL) break;
    job_t *j = s->head;
    s->head = j->next;
    if (s->head == NULL) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    j->fn(j->arg);
    free(j);
    pthread_mutex_lock(&s->mu);
    s->done++;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

// enqueue runs fn(arg) after the stream's earlier jobs (at once on the
// legacy stream) and returns its job number.
static uint64_t enqueue(uint64_t stream, void (*fn)(void *), void *arg) {
  stream_t *s = (stream_t *)(uintptr_t)stream;
  if (s == NULL) {
    fn(arg);
    return 0;
  }
  job_t *j = calloc(1, sizeof *j);
  j->fn = fn, j->arg = arg;
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = j;
  else s->head = j;
  s->tail = j;
  uint64_t t = ++s->queued;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return t;
}

static void wait_done(stream_t *s, uint64_t ticket) {
  if (s == NULL) return;
  pthread_mutex_lock(&s->mu);
  while (s->done < ticket) pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

static void nop(void *arg) { (void)arg; }

int atp_nv_stream_create(int device, uint64_t *stream, char *err) {
  (void)device, (void)err;
  stream_t *s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_create(&s->th, NULL, worker, s);
  *stream = (uint64_t)(uintptr_t)s;
  return 0;
}

int atp_nv_stream_destroy(int device, uint64_t stream, char *err) {
  (void)device, (void)err;
  stream_t *s = (stream_t *)(uintptr_t)stream;
  pthread_mutex_lock(&s->mu);
  s->stop = 1; // the worker finishes the queued jobs and ends; s leaks
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_detach(s->th);
  return 0;
}

int atp_nv_stream_sync(int device, uint64_t stream, char *err) {
  (void)device, (void)err;
  stream_t *s = (stream_t *)(uintptr_t)stream;
  if (s != NULL) wait_done(s, enqueue(stream, nop, NULL));
  return 0;
}

int atp_nv_event_create(int device, uint64_t *event, char *err) {
  (void)device, (void)err;
  *event = (uint64_t)(uintptr_t)calloc(1, sizeof(event_t));
  return 0;
}

int atp_nv_event_destroy(int device, uint64_t event, char *err) {
  (void)device, (void)err;
  free((void *)(uintptr_t)event);
  return 0;
}

int atp_nv_event_record(int device, uint64_t event, uint64_t stream, char *err) {
  (void)device, (void)err;
  event_t *e = (event_t *)(uintptr_t)event;
  e->s = (stream_t *)(uintptr_t)stream;
  e->ticket = enqueue(stream, nop, NULL);
  return 0;
}

int atp_nv_event_query(int device, uint64_t event, char *err) {
  (void)device, (void)err;
  event_t *e = (event_t *)(uintptr_t)event;
  if (e->s == NULL) return 0;
  pthread_mutex_lock(&e->s->mu);
  int done = e->s->done >= e->ticket;
  pthread_mutex_unlock(&e->s->mu);
  return done ? 0 : 1;
}

typedef struct {
  stream_t *s;
  uint64_t ticket;
} waitarg_t;

static void wait_job(void *arg) {
  waitarg_t *w = arg;
  wait_done(w->s, w->ticket);
  free(w);
}

int atp_nv_stream_wait_event(int device, uint64_t stream, uint64_t event, char *err) {
  (void)device, (void)err;
  event_t *e = (event_t *)(uintptr_t)event;
  waitarg_t *w = malloc(sizeof *w);
  w->s = e->s, w->ticket = e->ticket;
  enqueue(stream, wait_job, w);
  return 0;
}

typedef struct {
  char *dst;
  const char *src;
  uint64_t bytes;
  int value;
} copyarg_t;

static void copy_job(void *arg) {
  copyarg_t *c = arg;
  memmove(c->dst, c->src, c->bytes);
  free(c);
}

static void set_job(void *arg) {
  copyarg_t *c = arg;
  memset(c->dst, c->value, c->bytes);
  free(c);
}

int atp_nv_memcpy_async(int device, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream, char *err) {
  (void)device, (void)err;
  copyarg_t *c = malloc(sizeof *c);
  c->dst = (char *)(uintptr_t)dst, c->src = (const char *)(uintptr_t)src, c->bytes = bytes;
  enqueue(stream, copy_job, c);
  return 0;
}

int atp_nv_memset_async(int device, uint64_t dst, int value, uint64_t bytes, uint64_t stream, char *err) {
  (void)device, (void)err;
  copyarg_t *c = malloc(sizeof *c);
  c->dst = (char *)(uintptr_t)dst, c->value = value, c->bytes = bytes;
  enqueue(stream, set_job, c);
  return 0;
}

int atp_nv_dev_alloc(int device, uint64_t bytes, uint64_t *ptr, char *err) {
  (void)device;
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (p == NULL) return fail(err, "emu: out of memory");
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

int atp_nv_dev_free(int device, uint64_t ptr, char *err) {
  (void)device, (void)err;
  free((void *)(uintptr_t)ptr);
  return 0;
}

int atp_nv_htod(int device, uint64_t dst, const void *src, uint64_t bytes, char *err) {
  (void)device, (void)err;
  memcpy((void *)(uintptr_t)dst, src, bytes);
  return 0;
}

int atp_nv_dtoh(int device, void *dst, uint64_t src, uint64_t bytes, char *err) {
  (void)device, (void)err;
  memcpy(dst, (const void *)(uintptr_t)src, bytes);
  return 0;
}

int atp_nv_host_alloc(int device, uint64_t bytes, uint64_t *host, uint64_t *dev, char *err) {
  (void)device;
  void *p = calloc(1, bytes);
  if (p == NULL) return fail(err, "emu: out of memory");
  *host = *dev = (uint64_t)(uintptr_t)p;
  return 0;
}

int atp_nv_host_free(int device, uint64_t host, char *err) {
  (void)device, (void)err;
  free((void *)(uintptr_t)host);
  return 0;
}

int atp_nv_device_count(int *n, char *err) {
  (void)err;
  *n = 1;
  return 0;
}

int atp_nv_device_info(int device, char *name, int namelen, char *pci, int pcilen, char *err) {
  (void)device, (void)err;
  snprintf(name, namelen, "CPU emulator");
  snprintf(pci, pcilen, "emu");
  return 0;
}

// ---- the kernels ------------------------------------------------------------------

typedef struct {
  uint32_t *dev;
  atp_nv_errrec *host;
  int op;
  int64_t timeout_ns;
} fail_t;

static void give_up(const fail_t *f, int code, int peer, int block, uint64_t waited) {
  uint32_t zero = 0;
  if (__atomic_compare_exchange_n(f->dev, &zero, (uint32_t)code, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    f->host->peer = peer, f->host->op = f->op, f->host->block = block, f->host->waited_ns = waited;
    __atomic_store_n(&f->host->code, code, __ATOMIC_RELEASE);
  }
}

static int wait_ge(const uint64_t *p, uint64_t v, const fail_t *f, int code, int peer, int block) {
  if (__atomic_load_n(p, __ATOMIC_ACQUIRE) >= v) return 1;
  uint64_t start = now_ns();
  for (uint32_t i = 1;; i++) {
    if (__atomic_load_n(p, __ATOMIC_ACQUIRE) >= v) return 1;
    if ((i & 15) == 0) {
      if (__atomic_load_n(f->dev, __ATOMIC_ACQUIRE) != 0) return 0;
      uint64_t waited = now_ns() - start;
      if (f->timeout_ns > 0 && waited > (uint64_t)f->timeout_ns) {
        give_up(f, code, peer, block, waited);
        return 0;
      }
      usleep(20);
    } else {
      sched_yield();
    }
  }
}

// signal sets pe's copy of the symmetric word sig to v (release).
static void signal_set(uint64_t *sig, uint64_t v, int pe) {
  __atomic_store_n((uint64_t *)peer_addr((uint64_t)(uintptr_t)sig, pe), v, __ATOMIC_RELEASE);
}

static int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }

static void slice(int64_t bytes, int k, int n, int64_t *lo, int64_t *hi) {
  int64_t per = ((bytes + n - 1) / n + 15) / 16 * 16;
  *lo = lmin(bytes, per * k);
  *hi = lmin(bytes, *lo + per);
}

static int64_t stage_slot(const atp_nv_xparams *p, int i, uint64_t g) {
  return ((int64_t)i * p->depth + (int64_t)(g % (uint64_t)p->depth)) * p->cap;
}

typedef struct {
  const atp_nv_xparams *p;
  fail_t f;
  int block;
} blockarg_t;

static void send_part(const atp_nv_xparams *p, const fail_t *f, int b, int q, int s) {
  int j = (p->me + 1 + q) % p->npes;
  int64_t bytes = p->send_bytes[j];
  if (bytes <= 0) return;
  int64_t nr = (bytes + p->cap - 1) / p->cap;
  uint64_t *rounds = (uint64_t *)(uintptr_t)p->send_rounds + j * ATP_NV_MAXS + s;
  const uint64_t *acks = (const uint64_t *)(uintptr_t)p->acks + j * ATP_NV_MAXR;
  uint64_t *flag = (uint64_t *)(uintptr_t)p->flags + p->me * ATP_NV_MAXS + s;
  uint64_t g0 = *rounds;
  char *peer_stage = peer_addr(p->stage, p->pe[j]);
  if (peer_stage == NULL) {
    give_up(f, ATP_NV_ERR_NO_P2P, j, b, 0);
    return;
  }
  const char *src = (const char *)(uintptr_t)p->src + p->send_off[j];
  for (int64_t t = 0; t < nr; t++) {
    uint64_t g = g0 + t + 1;
    if (g > (uint64_t)p->depth)
      for (int r = 0; r < p->nrecv; r++)
        if (!wait_ge(acks + r, g - p->depth, f, ATP_NV_ERR_ACK_TIMEOUT, j, b)) return;
    int64_t chunk = lmin(p->cap, bytes - t * p->cap), lo, hi;
    slice(chunk, s, p->nsend, &lo, &hi);
    memcpy(peer_stage + stage_slot(p, p->me, g) + lo, src + t * p->cap + lo, hi - lo);
    signal_set(flag, g, p->pe[j]);
  }
  for (int r = 0; r < p->nrecv; r++)
    if (!wait_ge(acks + r, g0 + nr, f, ATP_NV_ERR_ACK_TIMEOUT, j, b)) return;
  *rounds = g0 + nr;
}

static void receive_copy(const atp_nv_xparams *p, const fail_t *f, int b, int r) {
  const char *stage = (const char *)(uintptr_t)p->stage;
  char *dst = (char *)(uintptr_t)p->dst;
  for (int q = 1; q < p->npes; q++) {
    int i = (p->me + p->npes - q) % p->npes;
    int64_t bytes = p->recv_bytes[i];
    if (bytes <= 0) continue;
    int64_t nr = (bytes + p->cap - 1) / p->cap;
    uint64_t *rounds = (uint64_t *)(uintptr_t)p->recv_rounds + i * ATP_NV_MAXR + r;
    const uint64_t *flags = (const uint64_t *)(uintptr_t)p->flags + i * ATP_NV_MAXS;
    uint64_t *ack = (uint64_t *)(uintptr_t)p->acks + p->me * ATP_NV_MAXR + r;
    uint64_t h0 = *rounds;
    for (int64_t t = 0; t < nr; t++) {
      uint64_t g = h0 + t + 1;
      for (int s = 0; s < p->nsend; s++)
        if (!wait_ge(flags + s, g, f, ATP_NV_ERR_DATA_TIMEOUT, i, b)) return;
      int64_t chunk = lmin(p->cap, bytes - t * p->cap), lo, hi;
      slice(chunk, r, p->nrecv, &lo, &hi);
      memcpy(dst + p->recv_off[i] + t * p->cap + lo, stage + stage_slot(p, i, g) + lo, hi - lo);
      signal_set(ack, g, p->pe[i]);
    }
    *rounds = h0 + nr;
  }
  const char *own = (const char *)(uintptr_t)p->src + p->self_src_off;
  char *to = dst + p->self_dst_off;
  if (p->self_bytes > 0 && own != to) {
    int64_t lo, hi;
    slice(p->self_bytes, r, p->nrecv, &lo, &hi);
    memcpy(to + lo, own + lo, hi - lo);
  }
}

static float bf16_to_f32(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) { // round to nearest even
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

static double load_elem(const char *p, int dt) {
  switch (dt) {
    case ATP_NV_F32: { float v; memcpy(&v, p, 4); return v; }
    case ATP_NV_F64: { double v; memcpy(&v, p, 8); return v; }
    case ATP_NV_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ATP_NV_BF16: { uint16_t v; memcpy(&v, p, 2); return bf16_to_f32(v); }
  }
  return 0;
}

static void store_elem(char *p, int dt, double v) {
  switch (dt) {
    case ATP_NV_F32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case ATP_NV_F64: memcpy(p, &v, 8); break;
    case ATP_NV_I32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case ATP_NV_BF16: { uint16_t x = f32_to_bf16((float)v); memcpy(p, &x, 2); break; }
  }
}

static int elem_size(int dt) { return dt == ATP_NV_F64 ? 8 : dt == ATP_NV_BF16 ? 2 : 4; }

static void receive_reduce(const atp_nv_xparams *p, const fail_t *f, int b, int r) {
  int64_t bytes = p->self_bytes;
  if (bytes <= 0) return;
  int64_t nr = (bytes + p->cap - 1) / p->cap;
  uint64_t base[ATP_NV_MAXP];
  for (int i = 0; i < p->npes; i++) base[i] = ((const uint64_t *)(uintptr_t)p->recv_rounds)[i * ATP_NV_MAXR + r];
  const char *stage = (const char *)(uintptr_t)p->stage;
  int es = elem_size(p->dtype);
  for (int64_t t = 0; t < nr; t++) {
    for (int i = 0; i < p->npes; i++)
      for (int s = 0; s < p->nsend && i != p->me; s++)
        if (!wait_ge((const uint64_t *)(uintptr_t)p->flags + i * ATP_NV_MAXS + s, base[i] + t + 1, f,
                     ATP_NV_ERR_DATA_TIMEOUT, i, b))
          return;
    int64_t chunk = lmin(p->cap, bytes - t * p->cap), lo, hi;
    slice(chunk, r, p->nrecv, &lo, &hi);
    const char *own = (const char *)(uintptr_t)p->src + p->self_src_off + t * p->cap + lo;
    char *out = (char *)(uintptr_t)p->dst + p->self_dst_off + t * p->cap + lo;
    for (int64_t e = 0; e < (hi - lo) / es; e++) {
      double acc = 0;
      for (int k = 0; k < p->npes; k++) {
        double v = k == p->me ? load_elem(own + e * es, p->dtype)
                              : load_elem(stage + stage_slot(p, k, base[k] + t + 1) + lo + e * es, p->dtype);
        if (p->dtype != ATP_NV_F64 && p->dtype != ATP_NV_I32) v = (float)v;
        if (k == 0) acc = v;
        else if (p->redop == ATP_NV_MAX) acc = v > acc ? v : acc;
        else acc = p->dtype == ATP_NV_F64 || p->dtype == ATP_NV_I32 ? acc + v : (float)(acc + v);
      }
      if (p->redop == ATP_NV_AVG) acc = p->dtype == ATP_NV_F64 ? acc / p->npes : (float)(acc / p->npes);
      store_elem(out + e * es, p->dtype, acc);
    }
    for (int i = 0; i < p->npes; i++)
      if (i != p->me) signal_set((uint64_t *)(uintptr_t)p->acks + p->me * ATP_NV_MAXR + r, base[i] + t + 1, p->pe[i]);
  }
  for (int i = 0; i < p->npes; i++) ((uint64_t *)(uintptr_t)p->recv_rounds)[i * ATP_NV_MAXR + r] = base[i] + nr;
}

static void *run_block(void *arg) {
  blockarg_t *a = arg;
  const atp_nv_xparams *p = a->p;
  int senders = (p->npes - 1) * p->nsend;
  if (a->block < senders) send_part(p, &a->f, a->block, a->block / p->nsend, a->block % p->nsend);
  else if (p->mode == ATP_NV_COPY) receive_copy(p, &a->f, a->block, a->block - senders);
  else receive_reduce(p, &a->f, a->block, a->block - senders);
  return NULL;
}

static void exchange_job(void *arg) {
  atp_nv_xparams *p = arg;
  int grid = (p->npes - 1) * p->nsend + p->nrecv;
  pthread_t th[ATP_NV_MAXP * ATP_NV_MAXS + ATP_NV_MAXR];
  blockarg_t a[ATP_NV_MAXP * ATP_NV_MAXS + ATP_NV_MAXR];
  for (int b = 0; b < grid; b++) {
    a[b].p = p, a[b].block = b;
    a[b].f = (fail_t){(uint32_t *)(uintptr_t)p->errdev, (atp_nv_errrec *)(uintptr_t)p->errhost, p->op_id, p->timeout_ns};
    pthread_create(&th[b], NULL, run_block, &a[b]);
  }
  for (int b = 0; b < grid; b++) pthread_join(th[b], NULL);
  free(p);
}

int atp_nv_exchange(const atp_nv_xparams *p, uint64_t stream, char *err) {
  if (p->npes < 2 || p->npes > ATP_NV_MAXP || p->nsend < 1 || p->nsend > ATP_NV_MAXS || p->nrecv < 1 ||
      p->nrecv > ATP_NV_MAXR || p->cap <= 0 || p->cap % 256 != 0)
    return fail(err, "emu: exchange: bad parameters");
  atp_nv_xparams *c = malloc(sizeof *c);
  *c = *p;
  enqueue(stream, exchange_job, c);
  return 0;
}

static void barrier_job(void *arg) {
  atp_nv_bparams *p = arg;
  fail_t f = {(uint32_t *)(uintptr_t)p->errdev, (atp_nv_errrec *)(uintptr_t)p->errhost, p->op_id, p->timeout_ns};
  uint64_t *bar = (uint64_t *)(uintptr_t)p->bar;
  for (int i = 0; i < p->npes; i++)
    if (i != p->me) signal_set(bar + p->me, p->gen, p->pe[i]);
  for (int i = 0; i < p->npes; i++)
    if (i != p->me && !wait_ge(bar + i, p->gen, &f, ATP_NV_ERR_BARRIER_TIMEOUT, i, 0)) break;
  free(p);
}

int atp_nv_barrier(const atp_nv_bparams *p, uint64_t stream, char *err) {
  (void)err;
  atp_nv_bparams *c = malloc(sizeof *c);
  *c = *p;
  enqueue(stream, barrier_job, c);
  return 0;
}

typedef struct {
  uint64_t buf, src, sig, sigval, bad;
  int n, value, pe;
} smoke_t;

static void smoke_put_job(void *arg) {
  smoke_t *s = arg;
  int *src = (int *)(uintptr_t)s->src;
  for (int i = 0; i < s->n; i++) src[i] = s->value * 1000 + i;
  memcpy(peer_addr(s->buf, s->pe), src, (size_t)s->n * sizeof(int));
  signal_set((uint64_t *)(uintptr_t)s->sig, s->sigval, s->pe);
  free(s);
}

static void smoke_wait_job(void *arg) {
  smoke_t *s = arg;
  while (__atomic_load_n((uint64_t *)(uintptr_t)s->sig, __ATOMIC_ACQUIRE) < s->sigval) usleep(20);
  const int *buf = (const int *)(uintptr_t)s->buf;
  int bad = 0;
  for (int i = 0; i < s->n; i++) bad += buf[i] != s->value * 1000 + i;
  *(int *)(uintptr_t)s->bad += bad;
  free(s);
}

int atp_nv_smoke_put(uint64_t buf, uint64_t src, uint64_t sig, int nints, int value, int pe, uint64_t sigval,
                     uint64_t stream, char *err) {
  (void)err;
  smoke_t *s = calloc(1, sizeof *s);
  *s = (smoke_t){.buf = buf, .src = src, .sig = sig, .sigval = sigval, .n = nints, .value = value, .pe = pe};
  enqueue(stream, smoke_put_job, s);
  return 0;
}

int atp_nv_smoke_wait(uint64_t buf, uint64_t sig, int nints, int value, uint64_t sigval, uint64_t bad, uint64_t stream,
                      char *err) {
  (void)err;
  smoke_t *s = calloc(1, sizeof *s);
  *s = (smoke_t){.buf = buf, .sig = sig, .sigval = sigval, .bad = bad, .n = nints, .value = value};
  enqueue(stream, smoke_wait_job, s);
  return 0;
}
