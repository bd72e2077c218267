// atp_nvshmem.h: the plain C interface of libasynctp_nvshmem.so, the NVSHMEM
// transport's native half (see README.md). comm/nvshmem dlopens the library
// and calls these functions through a table of pointers; this header is
// included by the .cu sources (which define the functions) and by the cgo
// loader (which only needs the declarations and the structs), so it uses no
// CUDA or NVSHMEM type.
//
// Conventions:
//   - Device and host addresses travel as uint64_t; streams and events as
//     uint64_t handles (a cudaStream_t / cudaEvent_t, which are also
//     CUstream / CUevent).
//   - Every fallible function returns 0 on success and nonzero on failure,
//     after writing a NUL-terminated message of at most ATP_NV_ERRLEN bytes
//     (naming the CUDA or NVSHMEM call and its error) into err.
//   - Functions that take a device ordinal make it current first
//     (cudaSetDevice), so they may be called from any OS thread; the others
//     use the device given to atp_nv_init.
//   - NVSHMEM host calls are serialised by a mutex inside the library
//     (NVSHMEM is initialised with NVSHMEM_THREAD_SERIALIZED).
#ifndef ATP_NVSHMEM_H
#define ATP_NVSHMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ATP_NV_API __attribute__((visibility("default")))
#else
#define ATP_NV_API
#endif

// ATP_NV_ABI changes whenever a signature or struct below changes; the Go
// side refuses a library built from another version of this header.
#define ATP_NV_ABI 1
#define ATP_NV_ERRLEN 512
// The largest group the exchange kernels handle (their per-peer tables are
// kernel parameters, passed by value: about 2.5 KB at 64).
#define ATP_NV_MAXP 64
// Blocks per peer (senders) and receiver blocks of the exchange kernel; the
// symmetric signal arrays are sized for these maxima.
#define ATP_NV_MAXS 4
#define ATP_NV_MAXR 4

// Element types: the numbering of tensor.DType for the first four.
enum {
  ATP_NV_F32 = 1,
  ATP_NV_BF16 = 2,
  ATP_NV_I32 = 3,
  ATP_NV_F64 = 4,
};

// Reductions: the numbering of comm.ReduceOp.
enum {
  ATP_NV_SUM = 0,
  ATP_NV_AVG = 1,
  ATP_NV_MAX = 2,
};

// Exchange modes.
enum {
  ATP_NV_COPY = 0,   // each received part is copied to dst at its offset
  ATP_NV_REDUCE = 1, // the received parts and this PE's own are reduced into dst
};

// Capabilities of the NVSHMEM the library was built against (atp_nv_info).
enum {
  ATP_NV_CAP_BF16_REDUCE = 1,   // nvshmemx_bfloat16_{sum,max}_reduce*_on_stream
  ATP_NV_CAP_REDUCESCATTER = 2, // nvshmemx_*_reducescatter_on_stream
};

// Failures the kernels record (atp_nv_errrec.code).
enum {
  ATP_NV_ERR_DATA_TIMEOUT = 1,    // a sender's data did not arrive in time
  ATP_NV_ERR_ACK_TIMEOUT = 2,     // a receiver did not free its staging in time
  ATP_NV_ERR_BARRIER_TIMEOUT = 3, // a peer did not reach the barrier in time
  ATP_NV_ERR_NO_P2P = 4,          // nvshmem_ptr gave no address for a peer
};

// What a kernel that gave up records, in host memory mapped for the device
// (one record per group). code is written last.
typedef struct {
  int32_t code;  // ATP_NV_ERR_*, 0 while nothing failed
  int32_t peer;  // the group rank waited for
  int32_t op;    // the op id given in the parameters
  int32_t block; // the block that gave up
  uint64_t waited_ns;
} atp_nv_errrec;

// The parameters of one exchange kernel (atp_nv_exchange), passed by value.
//
// Each pair (this PE → peer j) moves send_bytes[j] bytes from src +
// send_off[j] into j's staging, in rounds of at most cap bytes; each pair
// (peer i → this PE) moves recv_bytes[i] bytes, copied (COPY) to dst +
// recv_off[i] or reduced (REDUCE) with this PE's own part, src +
// self_src_off, into dst + self_dst_off. In COPY mode self_bytes bytes are
// also copied from src + self_src_off to dst + self_dst_off (skipped when
// both are the same address). See README.md for the protocol.
typedef struct {
  int32_t npes;  // group size, ≤ ATP_NV_MAXP
  int32_t me;    // this PE's group rank
  int32_t mode;  // ATP_NV_COPY or ATP_NV_REDUCE
  int32_t dtype; // REDUCE: ATP_NV_F32, _BF16, _I32 or _F64
  int32_t redop; // REDUCE: ATP_NV_SUM, _AVG or _MAX
  int32_t nsend; // sender blocks per peer, ≤ ATP_NV_MAXS
  int32_t nrecv; // receiver blocks, ≤ ATP_NV_MAXR
  int32_t depth; // staging slots per pair (rounds in flight)
  int64_t cap;   // bytes per round and pair, a multiple of 256
  uint64_t stage;       // symmetric: npes·depth·cap bytes
  uint64_t flags;       // symmetric uint64[npes·ATP_NV_MAXS], by sender
  uint64_t acks;        // symmetric uint64[npes·ATP_NV_MAXR], by receiver
  uint64_t send_rounds; // device uint64[npes·ATP_NV_MAXS]
  uint64_t recv_rounds; // device uint64[npes·ATP_NV_MAXR]
  uint64_t errdev;      // device uint32: nonzero once a block gave up
  uint64_t errhost;     // device address of the group's mapped atp_nv_errrec
  uint64_t src;
  uint64_t dst;
  int64_t self_src_off;
  int64_t self_dst_off;
  int64_t self_bytes;
  int64_t timeout_ns; // a wait longer than this gives up (0: never)
  int32_t op_id;
  int32_t pad;
  int32_t pe[ATP_NV_MAXP]; // world PE of each group rank
  int64_t send_off[ATP_NV_MAXP];
  int64_t send_bytes[ATP_NV_MAXP];
  int64_t recv_off[ATP_NV_MAXP];
  int64_t recv_bytes[ATP_NV_MAXP];
} atp_nv_xparams;

// The parameters of a barrier kernel (atp_nv_barrier): each PE sets its
// word bar[me] on every peer to gen, then waits for bar[i] ≥ gen from all.
typedef struct {
  int32_t npes;
  int32_t me;
  int32_t op_id;
  int32_t pad;
  uint64_t bar;     // symmetric uint64[npes]
  uint64_t errdev;  // as in atp_nv_xparams
  uint64_t errhost; //
  uint64_t gen;     // this barrier's generation, 1, 2, ...
  int64_t timeout_ns;
  int32_t pe[ATP_NV_MAXP];
} atp_nv_bparams;

// ---- library -------------------------------------------------------------

// ATP_NV_ABI of the library.
ATP_NV_API int atp_nv_abi(void);
// The NVSHMEM version the library was built against, its capabilities
// (ATP_NV_CAP_*), the size of a unique id, sizeof(atp_nv_xparams).
ATP_NV_API int atp_nv_info(int *major, int *minor, int *patch, int *caps, int *uid_bytes, int *xparams_bytes);

// ---- NVSHMEM: bootstrap, heap, teams ------------------------------------

// nvshmemx_get_uniqueid into uid (len must be the unique id size).
ATP_NV_API int atp_nv_get_uniqueid(int device, void *uid, int len, char *err);
// cudaSetDevice(device), then nvshmemx_set_attr_uniqueid_args and
// nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID); checks that this PE is
// rank of npes; *status is nvshmemx_init_status() (NVSHMEM_STATUS_*: 2
// initialised, 3 limited MPG, 4 full MPG). NVSHMEM's init exits the process
// on some failures; see README.md.
ATP_NV_API int atp_nv_init(int device, int rank, int npes, const void *uid, int len, int *status, char *err);
ATP_NV_API int atp_nv_finalize(char *err);
// nvshmem_calloc(1, bytes): collective over all PEs; zeroed.
ATP_NV_API int atp_nv_calloc(uint64_t bytes, uint64_t *ptr, char *err);
ATP_NV_API int atp_nv_free(uint64_t ptr, char *err);
// nvshmem_ptr: the address through which this PE reaches pe's copy of the
// symmetric ptr with loads and stores (P2P), or 0.
ATP_NV_API uint64_t atp_nv_ptr(uint64_t ptr, int pe);
ATP_NV_API int atp_nv_team_world(void);
// nvshmem_team_split_strided(parent, start, stride, size, NULL, 0, team):
// collective over parent; *team is -1 (NVSHMEM_TEAM_INVALID) on the PEs
// outside the new team.
ATP_NV_API int atp_nv_team_split_strided(int parent, int start, int stride, int size, int *team, char *err);
ATP_NV_API int atp_nv_team_destroy(int team, char *err);
// nvshmemx_cumodule_init on a module loaded with the driver API (for an
// image of kernels that call NVSHMEM device functions; unused while those
// kernels build into libasynctp_nvshmem.so instead of a loaded module).
ATP_NV_API int atp_nv_cumodule_init(uint64_t module, char *err);

// ---- NVSHMEM on-stream collectives (the team path) ------------------------
// scratch is symmetric (scratch_bytes on every PE of the team); data that is
// not in the symmetric heap is staged through it in chunks. With direct, dst
// and src are symmetric and used as they are.

// dst (npes·bytes) ← every PE's src (bytes), in team order (fcollect).
ATP_NV_API int atp_nv_allgather(int team, int npes, uint64_t dst, uint64_t src, uint64_t bytes, int direct,
                                uint64_t scratch, uint64_t scratch_bytes, uint64_t stream, char *err);
// dst (n elements) ← reduction of part me of every PE's src (npes·n).
ATP_NV_API int atp_nv_reducescatter(int team, int npes, uint64_t dst, uint64_t src, uint64_t n, int dtype, int redop,
                                    int direct, uint64_t scratch, uint64_t scratch_bytes, uint64_t stream,
                                    char *err);
// buf (n elements) ← reduction of every PE's buf.
ATP_NV_API int atp_nv_allreduce(int team, int npes, uint64_t buf, uint64_t n, int dtype, int redop, uint64_t scratch,
                                uint64_t scratch_bytes, uint64_t stream, char *err);
// buf (bytes) ← root's buf; root is a team rank.
ATP_NV_API int atp_nv_broadcast(int team, int me, int root, uint64_t buf, uint64_t bytes, uint64_t scratch,
                                uint64_t scratch_bytes, uint64_t stream, char *err);

// ---- the exchange kernels (the P2P path) ---------------------------------

ATP_NV_API int atp_nv_exchange(const atp_nv_xparams *p, uint64_t stream, char *err);
ATP_NV_API int atp_nv_barrier(const atp_nv_bparams *p, uint64_t stream, char *err);

// ---- smoke test of put/signal on the symmetric heap ----------------------

// One block: fills src (symmetric, nints ints) with value·1000 + i, then
// nvshmemx_putmem_signal_block into pe's buf and sets pe's sig to sigval.
ATP_NV_API int atp_nv_smoke_put(uint64_t buf, uint64_t src, uint64_t sig, int nints, int value, int pe,
                                uint64_t sigval, uint64_t stream, char *err);
// One block: nvshmem_signal_wait_until(sig ≥ sigval), then counts the ints
// of buf that differ from value·1000 + i into *(int *)bad (device memory).
ATP_NV_API int atp_nv_smoke_wait(uint64_t buf, uint64_t sig, int nints, int value, uint64_t sigval, uint64_t bad,
                                 uint64_t stream, char *err);

// ---- CUDA runtime helpers -------------------------------------------------

ATP_NV_API int atp_nv_device_count(int *n, char *err);
// The device's name and PCI bus id ("0000:65:00.0").
ATP_NV_API int atp_nv_device_info(int device, char *name, int namelen, char *pci, int pcilen, char *err);
// A non-blocking stream.
ATP_NV_API int atp_nv_stream_create(int device, uint64_t *stream, char *err);
ATP_NV_API int atp_nv_stream_destroy(int device, uint64_t stream, char *err);
ATP_NV_API int atp_nv_stream_sync(int device, uint64_t stream, char *err);
// An event without timing.
ATP_NV_API int atp_nv_event_create(int device, uint64_t *event, char *err);
ATP_NV_API int atp_nv_event_destroy(int device, uint64_t event, char *err);
ATP_NV_API int atp_nv_event_record(int device, uint64_t event, uint64_t stream, char *err);
// 0: completed, 1: not yet, -1: error (in err).
ATP_NV_API int atp_nv_event_query(int device, uint64_t event, char *err);
ATP_NV_API int atp_nv_stream_wait_event(int device, uint64_t stream, uint64_t event, char *err);
ATP_NV_API int atp_nv_memcpy_async(int device, uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream,
                                   char *err);
ATP_NV_API int atp_nv_memset_async(int device, uint64_t dst, int value, uint64_t bytes, uint64_t stream, char *err);
// Device memory from the stream-ordered allocator (cudaMallocAsync on a
// stream of the library, then synchronised), so that allocating and freeing
// never wait for the kernels of other streams. Free only memory no queued
// work still uses.
ATP_NV_API int atp_nv_dev_alloc(int device, uint64_t bytes, uint64_t *ptr, char *err);
ATP_NV_API int atp_nv_dev_free(int device, uint64_t ptr, char *err);
// Synchronous copies between host memory and the device (the legacy stream,
// which does not wait for the library's non-blocking streams).
ATP_NV_API int atp_nv_htod(int device, uint64_t dst, const void *src, uint64_t bytes, char *err);
ATP_NV_API int atp_nv_dtoh(int device, void *dst, uint64_t src, uint64_t bytes, char *err);
// Pinned host memory mapped for the device: *host for the CPU, *dev for
// kernels.
ATP_NV_API int atp_nv_host_alloc(int device, uint64_t bytes, uint64_t *host, uint64_t *dev, char *err);
ATP_NV_API int atp_nv_host_free(int device, uint64_t host, char *err);

#ifdef __cplusplus
}
#endif

#endif // ATP_NVSHMEM_H
