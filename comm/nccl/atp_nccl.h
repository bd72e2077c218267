// The C half of package nccl: the table of NCCL entry points filled from
// libnccl.so.2 with dlsym, and the trampolines Go calls (cgo cannot call a C
// function pointer directly).
//
// This header deliberately does not include nccl.h (nor any CUDA header): the
// package must build and test on machines without NCCL. It declares what the
// Go side needs with the layout and calling convention of nccl.h, checked
// against nccl.h.in of NCCL 2.28.3 (and the 2.28 ncclConfig_v22800 struct as
// repeated by several independent copies of that header):
//   - ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums, passed as int;
//   - ncclComm_t and cudaStream_t are pointers; they are declared here as
//     uintptr_t, which the x86-64 and AArch64 C ABIs pass exactly like a
//     pointer, so the Go side never holds a foreign pointer in a pointer type;
//   - device buffers (const void* sendbuff, void* recvbuff) are uintptr_t
//     device addresses for the same reason;
//   - ncclUniqueId is a struct of 128 chars, passed by value to
//     ncclCommInitRankConfig (the trampoline dereferences a pointer to it);
//   - ncclConfig_t is the 2.28 layout, filled like NCCL_CONFIG_INITIALIZER.
#ifndef ASYNCTP_NCCL_H
#define ASYNCTP_NCCL_H

#include <stddef.h>
#include <stdint.h>

typedef int atp_ncclResult;
typedef uintptr_t atp_ncclComm;
typedef uintptr_t atp_cudaStream;

// NCCL_UNIQUE_ID_BYTES
#define ATP_NCCL_UNIQUE_ID_BYTES 128

typedef struct {
	char internal[ATP_NCCL_UNIQUE_ID_BYTES];
} atp_ncclUniqueId;

// ncclConfig_v22800 (nccl.h of NCCL 2.28): the fields up to netName date from
// 2.17, splitShare from 2.18, trafficClass and commName from 2.25,
// collnetEnable..nvlsCTAs from 2.27, the last two from 2.28. NCCL copies
// min(size, its own sizeof) bytes and ignores the fields newer than
// `version`, so a newer library accepts this struct and an older one reads
// the prefix it knows.
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
	int trafficClass;
	const char *commName;
	int collnetEnable;
	int CTAPolicy;
	int shrinkShare;
	int nvlsCTAs;
	int nChannelsPerNetPeer;
	int nvlinkCentricSched;
} atp_ncclConfig;

// The header version the config struct describes: NCCL_VERSION(2, 28, 3).
#define ATP_NCCL_CONFIG_VERSION 22803
// NCCL_API_MAGIC / the magic of NCCL_CONFIG_INITIALIZER.
#define ATP_NCCL_CONFIG_MAGIC 0xcafebeefu

// The entry points resolved from libnccl. Member names are the API names.
typedef struct {
	atp_ncclResult (*ncclGetVersion)(int *);
	atp_ncclResult (*ncclGetUniqueId)(atp_ncclUniqueId *);
	atp_ncclResult (*ncclCommInitRankConfig)(atp_ncclComm *, int, atp_ncclUniqueId, int, atp_ncclConfig *);
	atp_ncclResult (*ncclCommGetAsyncError)(atp_ncclComm, atp_ncclResult *);
	atp_ncclResult (*ncclCommAbort)(atp_ncclComm);
	atp_ncclResult (*ncclCommFinalize)(atp_ncclComm);
	atp_ncclResult (*ncclCommDestroy)(atp_ncclComm);
	atp_ncclResult (*ncclCommSplit)(atp_ncclComm, int, int, atp_ncclComm *, atp_ncclConfig *);
	atp_ncclResult (*ncclCommCount)(atp_ncclComm, int *);
	atp_ncclResult (*ncclCommUserRank)(atp_ncclComm, int *);
	atp_ncclResult (*ncclAllGather)(uintptr_t, uintptr_t, size_t, int, atp_ncclComm, atp_cudaStream);
	atp_ncclResult (*ncclReduceScatter)(uintptr_t, uintptr_t, size_t, int, int, atp_ncclComm, atp_cudaStream);
	atp_ncclResult (*ncclAllReduce)(uintptr_t, uintptr_t, size_t, int, int, atp_ncclComm, atp_cudaStream);
	atp_ncclResult (*ncclBroadcast)(uintptr_t, uintptr_t, size_t, int, int, atp_ncclComm, atp_cudaStream);
	atp_ncclResult (*ncclSend)(uintptr_t, size_t, int, int, atp_ncclComm, atp_cudaStream);
	atp_ncclResult (*ncclRecv)(uintptr_t, size_t, int, int, atp_ncclComm, atp_cudaStream);
	atp_ncclResult (*ncclGroupStart)(void);
	atp_ncclResult (*ncclGroupEnd)(void);
	const char *(*ncclGetErrorString)(atp_ncclResult);
	const char *(*ncclGetLastError)(atp_ncclComm);
} atp_nccl_api;

// Loading: internal/dynlib opens and closes the library (dynlib.Open).
// atp_nccl_resolve looks up every entry point in handle (atp_dl_resolve of
// internal/dynlib/dynlib.h); on a missing one it
// returns -1 and sets *missing to its name. With install, the table becomes
// the one the trampolines call.
int atp_nccl_resolve(void *handle, int install, const char **missing);

// The config, filled like NCCL_CONFIG_INITIALIZER of NCCL 2.28.3, then with
// the given blocking mode.
void atp_nccl_config_init(atp_ncclConfig *c, int blocking);
// The layout of atp_ncclConfig: out[0] = sizeof, out[1 + i] = offsetof the
// i-th field after size (17 values in all), for the tests.
void atp_nccl_config_layout(size_t *out);

// An atomic load of a handle written by another thread (ncclCommSplit stores
// the new communicator from its init thread).
atp_ncclComm atp_nccl_load_handle(atp_ncclComm *p);

// One ncclSend (send = 1) or ncclRecv (send = 0) of a grouped
// point-to-point op.
typedef struct {
	uintptr_t buf;
	size_t count;
	int peer;
	int send;
} atp_nccl_p2p;

// atp_nccl_group_p2p issues ncclGroupStart, the ncclSend or ncclRecv of every
// part, and ncclGroupEnd: a whole all-to-all in one call from Go. A group it
// started is always ended, even after a failed part, so that the thread's
// group state is clean. It returns the first failure, with *failed the index
// of the failed part, or -2 when ncclGroupStart failed; otherwise
// ncclGroupEnd's result (ncclInProgress on a non-blocking communicator) with
// *failed = -1.
atp_ncclResult atp_nccl_group_p2p(const atp_nccl_p2p *parts, int n, int dt, atp_ncclComm comm, atp_cudaStream s, int *failed);

// ncclInProgress.
#define ATP_NCCL_IN_PROGRESS 7

// atp_nccl_settle polls ncclCommGetAsyncError while the communicator says
// ncclInProgress, for about spin_ns nanoseconds at most, yielding the CPU
// between polls (NCCL's own launch thread may need it). It returns the
// result of the last ncclCommGetAsyncError and leaves the state it read in
// *state. The last poll comes after the time is up, so that a caller that
// was descheduled for the whole budget still sees a state that settled
// meanwhile.
atp_ncclResult atp_nccl_settle(atp_ncclComm comm, int64_t spin_ns, atp_ncclResult *state);

// Trampolines.
atp_ncclResult atp_ncclGetVersion(int *v);
atp_ncclResult atp_ncclGetUniqueId(atp_ncclUniqueId *id);
atp_ncclResult atp_ncclCommInitRankConfig(atp_ncclComm *comm, int nranks, const atp_ncclUniqueId *id, int rank, int blocking);
atp_ncclResult atp_ncclCommGetAsyncError(atp_ncclComm comm, atp_ncclResult *state);
atp_ncclResult atp_ncclCommAbort(atp_ncclComm comm);
atp_ncclResult atp_ncclCommFinalize(atp_ncclComm comm);
atp_ncclResult atp_ncclCommDestroy(atp_ncclComm comm);
atp_ncclResult atp_ncclCommSplit(atp_ncclComm comm, int color, int key, atp_ncclComm *newcomm, int blocking);
atp_ncclResult atp_ncclCommCount(atp_ncclComm comm, int *count);
atp_ncclResult atp_ncclCommUserRank(atp_ncclComm comm, int *rank);
atp_ncclResult atp_ncclAllGather(uintptr_t send, uintptr_t recv, size_t count, int dt, atp_ncclComm comm, atp_cudaStream s);
atp_ncclResult atp_ncclReduceScatter(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, atp_ncclComm comm, atp_cudaStream s);
atp_ncclResult atp_ncclAllReduce(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, atp_ncclComm comm, atp_cudaStream s);
atp_ncclResult atp_ncclBroadcast(uintptr_t send, uintptr_t recv, size_t count, int dt, int root, atp_ncclComm comm, atp_cudaStream s);
atp_ncclResult atp_ncclSend(uintptr_t send, size_t count, int dt, int peer, atp_ncclComm comm, atp_cudaStream s);
atp_ncclResult atp_ncclRecv(uintptr_t recv, size_t count, int dt, int peer, atp_ncclComm comm, atp_cudaStream s);
atp_ncclResult atp_ncclGroupStart(void);
atp_ncclResult atp_ncclGroupEnd(void);
const char *atp_ncclGetErrorString(atp_ncclResult r);
const char *atp_ncclGetLastError(atp_ncclComm comm);

#endif
