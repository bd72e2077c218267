// Loading and trampolines for package nccl; see atp_nccl.h.

#define _GNU_SOURCE
#include "atp_nccl.h"

#include "dynlib.h" // defines: atp_dl_sym (a table slot), atp_dl_resolve (fills a table with dlsym)

#include <limits.h>
#include <sched.h>
#include <string.h>
#include <time.h>

// The table the trampolines call: all NULL until a library is installed.
static atp_nccl_api api;

#define SYM(member) {{#member}, offsetof(atp_nccl_api, member), 0}

// Every entry point is required. The newest are ncclCommSplit (2.18) and
// ncclCommInitRankConfig, ncclCommFinalize, ncclCommGetAsyncError's
// non-blocking states (2.14); the Go side also checks the version.
static const atp_dl_sym syms[] = {
	SYM(ncclGetVersion),
	SYM(ncclGetUniqueId),
	SYM(ncclCommInitRankConfig),
	SYM(ncclCommGetAsyncError),
	SYM(ncclCommAbort),
	SYM(ncclCommFinalize),
	SYM(ncclCommDestroy),
	SYM(ncclCommSplit),
	SYM(ncclCommCount),
	SYM(ncclCommUserRank),
	SYM(ncclAllGather),
	SYM(ncclReduceScatter),
	SYM(ncclAllReduce),
	SYM(ncclBroadcast),
	SYM(ncclSend),
	SYM(ncclRecv),
	SYM(ncclGroupStart),
	SYM(ncclGroupEnd),
	SYM(ncclGetErrorString),
	SYM(ncclGetLastError),
};

int atp_nccl_resolve(void *handle, int install, const char **missing) {
	atp_nccl_api t;
	if (atp_dl_resolve(handle, syms, ATP_DL_NSYMS(syms), &t, sizeof t, NULL, missing) != 0) {
		return -1;
	}
	if (install) {
		api = t;
	}
	return 0;
}

void atp_nccl_config_init(atp_ncclConfig *c, int blocking) {
	// NCCL_CONFIG_INITIALIZER of nccl.h 2.28.3: size, magic, version, then
	// NCCL_CONFIG_UNDEF_INT (INT_MIN) for every int and NCCL_CONFIG_UNDEF_PTR
	// (NULL) for every pointer.
	memset(c, 0, sizeof *c);
	c->size = sizeof *c;
	c->magic = ATP_NCCL_CONFIG_MAGIC;
	c->version = ATP_NCCL_CONFIG_VERSION;
	c->blocking = INT_MIN;
	c->cgaClusterSize = INT_MIN;
	c->minCTAs = INT_MIN;
	c->maxCTAs = INT_MIN;
	c->netName = NULL;
	c->splitShare = INT_MIN;
	c->trafficClass = INT_MIN;
	c->commName = NULL;
	c->collnetEnable = INT_MIN;
	c->CTAPolicy = INT_MIN;
	c->shrinkShare = INT_MIN;
	c->nvlsCTAs = INT_MIN;
	c->nChannelsPerNetPeer = INT_MIN;
	c->nvlinkCentricSched = INT_MIN;
	// Then what the caller sets.
	c->blocking = blocking;
}

void atp_nccl_config_layout(size_t *out) {
	out[0] = sizeof(atp_ncclConfig);
	out[1] = offsetof(atp_ncclConfig, magic);
	out[2] = offsetof(atp_ncclConfig, version);
	out[3] = offsetof(atp_ncclConfig, blocking);
	out[4] = offsetof(atp_ncclConfig, cgaClusterSize);
	out[5] = offsetof(atp_ncclConfig, minCTAs);
	out[6] = offsetof(atp_ncclConfig, maxCTAs);
	out[7] = offsetof(atp_ncclConfig, netName);
	out[8] = offsetof(atp_ncclConfig, splitShare);
	out[9] = offsetof(atp_ncclConfig, trafficClass);
	out[10] = offsetof(atp_ncclConfig, commName);
	out[11] = offsetof(atp_ncclConfig, collnetEnable);
	out[12] = offsetof(atp_ncclConfig, CTAPolicy);
	out[13] = offsetof(atp_ncclConfig, shrinkShare);
	out[14] = offsetof(atp_ncclConfig, nvlsCTAs);
	out[15] = offsetof(atp_ncclConfig, nChannelsPerNetPeer);
	out[16] = offsetof(atp_ncclConfig, nvlinkCentricSched);
}

atp_ncclComm atp_nccl_load_handle(atp_ncclComm *p) {
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

// ---- trampolines ----------------------------------------------------------

atp_ncclResult atp_ncclGetVersion(int *v) { return api.ncclGetVersion(v); }

atp_ncclResult atp_ncclGetUniqueId(atp_ncclUniqueId *id) { return api.ncclGetUniqueId(id); }

atp_ncclResult atp_ncclCommInitRankConfig(atp_ncclComm *comm, int nranks, const atp_ncclUniqueId *id, int rank, int blocking) {
	// NCCL copies the config before returning.
	atp_ncclConfig cfg;
	atp_nccl_config_init(&cfg, blocking);
	return api.ncclCommInitRankConfig(comm, nranks, *id, rank, &cfg);
}

atp_ncclResult atp_ncclCommGetAsyncError(atp_ncclComm comm, atp_ncclResult *state) {
	return api.ncclCommGetAsyncError(comm, state);
}

atp_ncclResult atp_ncclCommAbort(atp_ncclComm comm) { return api.ncclCommAbort(comm); }

atp_ncclResult atp_ncclCommFinalize(atp_ncclComm comm) { return api.ncclCommFinalize(comm); }

atp_ncclResult atp_ncclCommDestroy(atp_ncclComm comm) { return api.ncclCommDestroy(comm); }

atp_ncclResult atp_ncclCommSplit(atp_ncclComm comm, int color, int key, atp_ncclComm *newcomm, int blocking) {
	atp_ncclConfig cfg;
	atp_nccl_config_init(&cfg, blocking);
	return api.ncclCommSplit(comm, color, key, newcomm, &cfg);
}

atp_ncclResult atp_ncclCommCount(atp_ncclComm comm, int *count) { return api.ncclCommCount(comm, count); }

atp_ncclResult atp_ncclCommUserRank(atp_ncclComm comm, int *rank) { return api.ncclCommUserRank(comm, rank); }

atp_ncclResult atp_ncclAllGather(uintptr_t send, uintptr_t recv, size_t count, int dt, atp_ncclComm comm, atp_cudaStream s) {
	return api.ncclAllGather(send, recv, count, dt, comm, s);
}

atp_ncclResult atp_ncclReduceScatter(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, atp_ncclComm comm, atp_cudaStream s) {
	return api.ncclReduceScatter(send, recv, count, dt, op, comm, s);
}

atp_ncclResult atp_ncclAllReduce(uintptr_t send, uintptr_t recv, size_t count, int dt, int op, atp_ncclComm comm, atp_cudaStream s) {
	return api.ncclAllReduce(send, recv, count, dt, op, comm, s);
}

atp_ncclResult atp_ncclBroadcast(uintptr_t send, uintptr_t recv, size_t count, int dt, int root, atp_ncclComm comm, atp_cudaStream s) {
	return api.ncclBroadcast(send, recv, count, dt, root, comm, s);
}

atp_ncclResult atp_ncclSend(uintptr_t send, size_t count, int dt, int peer, atp_ncclComm comm, atp_cudaStream s) {
	return api.ncclSend(send, count, dt, peer, comm, s);
}

atp_ncclResult atp_ncclRecv(uintptr_t recv, size_t count, int dt, int peer, atp_ncclComm comm, atp_cudaStream s) {
	return api.ncclRecv(recv, count, dt, peer, comm, s);
}

atp_ncclResult atp_ncclGroupStart(void) { return api.ncclGroupStart(); }

atp_ncclResult atp_ncclGroupEnd(void) { return api.ncclGroupEnd(); }

const char *atp_ncclGetErrorString(atp_ncclResult r) { return api.ncclGetErrorString(r); }

const char *atp_ncclGetLastError(atp_ncclComm comm) { return api.ncclGetLastError(comm); }

// ---- several calls in one crossing from Go --------------------------------

atp_ncclResult atp_nccl_group_p2p(const atp_nccl_p2p *parts, int n, int dt, atp_ncclComm comm, atp_cudaStream s, int *failed) {
	*failed = -2;
	atp_ncclResult r = api.ncclGroupStart();
	if (r != 0) {
		return r;
	}
	*failed = -1;
	atp_ncclResult res = 0;
	for (int i = 0; i < n; i++) {
		const atp_nccl_p2p *p = &parts[i];
		atp_ncclResult q = p->send ? api.ncclSend(p->buf, p->count, dt, p->peer, comm, s)
		                           : api.ncclRecv(p->buf, p->count, dt, p->peer, comm, s);
		if (q != 0 && res == 0) {
			res = q;
			*failed = i;
		}
	}
	r = api.ncclGroupEnd();
	return res != 0 ? res : r;
}

static int64_t atp_nccl_now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

atp_ncclResult atp_nccl_settle(atp_ncclComm comm, int64_t spin_ns, atp_ncclResult *state) {
	int64_t end = atp_nccl_now_ns() + spin_ns;
	for (;;) {
		int expired = atp_nccl_now_ns() >= end;
		atp_ncclResult r = api.ncclCommGetAsyncError(comm, state);
		if (r != 0 || *state != ATP_NCCL_IN_PROGRESS || expired) {
			return r;
		}
		sched_yield();
	}
}
