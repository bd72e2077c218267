package nccl

// The cost of an op on the host, against a fake libnccl and a fake libcuda
// built here with the C compiler (see fake_test.go): they count the calls
// an op makes, and the fake NCCL behaves like NCCL 2.19 and later on a
// non-blocking communicator: every group (and every collective of a
// communicator of several ranks) goes to a launch thread, the communicator
// answers ncclInProgress for FAKE_LAUNCH_US microseconds, and refuses any
// call meanwhile. A Go sleep lasts about a millisecond on Linux, so a host
// wait that sleeps there costs every op a millisecond (all-to-all-v took
// 1.06 ms per op at every size on an H200 that way).

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

// fakeOpsNCCL is libnccl for the op path: per-communicator state, launch
// threads emulated by a time after which ncclCommGetAsyncError says
// ncclSuccess, and counters read back through ncclGetErrorString(1000).
const fakeOpsNCCL = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks, rank, state; long long readyAt; } fcomm;
typedef fcomm *ncclComm_t;

static char last[512], report[1024];
static int depth, grouped;
static long groupStart, groupEnd, sends, recvs, colls, polls, busy, launches;
static long long sendElems, recvElems;

static long long now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static long long launchNs(void) {
  const char *e = getenv("FAKE_LAUNCH_US");
  return (e ? atoll(e) : 30) * 1000LL;
}
/* Work handed to NCCL's launch thread: ncclInProgress until it is done. */
static int launch(fcomm *c) { launches++; c->state = 7; c->readyAt = now() + launchNs(); return 7; }
/* ncclCommEnsureReady: no call while the communicator is in progress. */
static int refused(fcomm *c) {
  if (c->state != 7) return 0;
  busy++;
  snprintf(last, sizeof last, "Attempt to use communicator before the previous operation returned ncclSuccess");
  return 1;
}
static fcomm *groupComm; /* the communicator of the open group */
static int coll(fcomm *c) {
  if (refused(c)) return 4;
  colls++;
  if (c->nranks == 1) return 0; /* ncclLaunchOneRank: a copy, no group */
  if (depth > 0) { grouped++; groupComm = c; return 0; }
  return launch(c);
}

int ncclGetVersion(int *v) { *v = 22803; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) { memset(id, 1, sizeof *id); return 0; }
int ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
  fcomm *c = calloc(1, sizeof *c);
  c->nranks = nranks;
  c->rank = rank;
  *comm = c;
  return launch(c);
}
int ncclCommGetAsyncError(ncclComm_t c, int *state) {
  polls++;
  if (c->state == 7 && now() >= c->readyAt) c->state = getenv("FAKE_ASYNC_FAIL") ? 6 : 0;
  *state = c->state;
  return 0;
}
int ncclCommAbort(ncclComm_t c) { return 0; }
int ncclCommFinalize(ncclComm_t c) { return 0; }
int ncclCommDestroy(ncclComm_t c) { return 0; }
int ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *newcomm, void *config) { return 5; }
int ncclCommCount(ncclComm_t c, int *n) { *n = c->nranks; return 0; }
int ncclCommUserRank(ncclComm_t c, int *r) { *r = c->rank; return 0; }
int ncclAllGather(const void *s, void *r, size_t n, int dt, ncclComm_t c, void *st) { return coll(c); }
int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, void *st) { return coll(c); }
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, void *st) { return coll(c); }
int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, ncclComm_t c, void *st) { return coll(c); }
int ncclSend(const void *s, size_t n, int dt, int peer, ncclComm_t c, void *st) {
  if (refused(c)) return 4;
  sends++;
  sendElems += n;
  if (depth > 0) { grouped++; groupComm = c; return 0; }
  return launch(c);
}
int ncclRecv(void *r, size_t n, int dt, int peer, ncclComm_t c, void *st) {
  if (refused(c)) return 4;
  recvs++;
  recvElems += n;
  if (depth > 0) { grouped++; groupComm = c; return 0; }
  return launch(c);
}
int ncclGroupStart(void) { groupStart++; depth++; return 0; }
int ncclGroupEnd(void) {
  groupEnd++;
  if (--depth > 0 || grouped == 0) return 0;
  grouped = 0;
  return launch(groupComm);
}
const char *ncclGetErrorString(int r) {
  if (r != 1000) return "fake result";
  snprintf(report, sizeof report,
    "groupStart=%ld groupEnd=%ld send=%ld recv=%ld sendElems=%lld recvElems=%lld colls=%ld polls=%ld busy=%ld launches=%ld",
    groupStart, groupEnd, sends, recvs, sendElems, recvElems, colls, polls, busy, launches);
  return report;
}
const char *ncclGetLastError(ncclComm_t c) { return last; }
`

// fakeCUDA is libcuda for the op path: one device, fake addresses, events
// that complete FAKE_EVENT_US microseconds after they are recorded, and
// counters read back through cuGetErrorString(9999).
const fakeCUDA = `
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uintptr_t CUhandle;

static char report[1024];
static long eventCreate, eventDestroy, eventRecord, eventQuery, eventSync, streamSync, ctxSync, copies, allocs;
static unsigned long long copyDst, copySrc, copyBytes, next = 0x100000000ULL, handles = 0x1000;
static long long recordedAt[4096];

static long long now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static long long eventNs(void) {
  const char *e = getenv("FAKE_EVENT_US");
  return (e ? atoll(e) : 0) * 1000LL;
}

CUresult cuGetErrorName(CUresult r, const char **s) {
  if (r != 9999) return 1;
  *s = "FAKE_COUNTS";
  return 0;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  if (r != 9999) return 1;
  snprintf(report, sizeof report,
    "eventCreate=%ld eventDestroy=%ld eventRecord=%ld eventQuery=%ld eventSync=%ld streamSync=%ld ctxSync=%ld copies=%ld copyDst=%llu copySrc=%llu copyBytes=%llu allocs=%ld",
    eventCreate, eventDestroy, eventRecord, eventQuery, eventSync, streamSync, ctxSync, copies, copyDst, copySrc, copyBytes, allocs);
  *s = report;
  return 0;
}
CUresult cuInit(unsigned int f) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int i) { *d = i; return i == 0 ? 0 : 101; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { snprintf(name, len, "fake"); return 0; }
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) { *v = 1; return 0; }
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { *b = 1ULL << 34; return 0; }
CUresult cuDevicePrimaryCtxRetain(CUhandle *c, CUdevice d) { *c = 0xc0; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return 0; }
CUresult cuCtxSetCurrent(CUhandle c) { return 0; }
CUresult cuCtxGetCurrent(CUhandle *c) { *c = 0xc0; return 0; }
CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { ctxSync++; return 0; }
CUresult cuCtxGetStreamPriorityRange(int *l, int *g) { *l = 0; *g = -5; return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = *t = 1ULL << 34; return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { allocs++; *p = next; next += (n + 0xfffff) & ~0xfffffULL; return 0; }
CUresult cuMemFree_v2(CUdeviceptr p) { return 0; }
CUresult cuMemAllocHost_v2(void **p, size_t n) { return 2; }
CUresult cuMemFreeHost(void *p) { return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUhandle st) { return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUhandle st) { return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUhandle st) {
  copies++; copyDst = d; copySrc = s; copyBytes += n; return 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return 0; }
CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return 0; }
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { return 0; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUhandle s) { return 0; }
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUhandle s) { return 0; }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUhandle s) { return 0; }
CUresult cuStreamCreate(CUhandle *s, unsigned int f) { *s = handles++; return 0; }
CUresult cuStreamCreateWithPriority(CUhandle *s, unsigned int f, int p) { *s = handles++; return 0; }
CUresult cuStreamDestroy_v2(CUhandle s) { return 0; }
CUresult cuStreamSynchronize(CUhandle s) { streamSync++; return 0; }
CUresult cuStreamQuery(CUhandle s) { return 0; }
CUresult cuStreamWaitEvent(CUhandle s, CUhandle e, unsigned int f) { return 0; }
CUresult cuStreamWaitValue32_v2(CUhandle s, CUdeviceptr a, uint32_t v, unsigned int f) { return 0; }
CUresult cuStreamWriteValue32_v2(CUhandle s, CUdeviceptr a, uint32_t v, unsigned int f) { return 0; }
CUresult cuStreamWaitValue64_v2(CUhandle s, CUdeviceptr a, uint64_t v, unsigned int f) { return 0; }
CUresult cuStreamWriteValue64_v2(CUhandle s, CUdeviceptr a, uint64_t v, unsigned int f) { return 0; }
CUresult cuEventCreate(CUhandle *e, unsigned int f) { eventCreate++; *e = handles++; return 0; }
CUresult cuEventDestroy_v2(CUhandle e) { eventDestroy++; return 0; }
CUresult cuEventRecord(CUhandle e, CUhandle s) { eventRecord++; recordedAt[e % 4096] = now(); return 0; }
CUresult cuEventSynchronize(CUhandle e) { eventSync++; return 0; }
CUresult cuEventQuery(CUhandle e) { eventQuery++; return now() < recordedAt[e % 4096] + eventNs() ? 600 : 0; }
CUresult cuEventElapsedTime_v2(float *ms, CUhandle a, CUhandle b) { *ms = 0; return 0; }
CUresult cuModuleLoadDataEx(CUhandle *m, const void *img, unsigned int n, int *o, void **v) { return 200; }
CUresult cuModuleUnload(CUhandle m) { return 0; }
CUresult cuModuleGetFunction(CUhandle *f, CUhandle m, const char *name) { return 500; }
CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *n, CUhandle m, const char *name) { return 500; }
CUresult cuLaunchKernel(CUhandle f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
  unsigned int bz, unsigned int sh, CUhandle s, void **p, void **x) { return 0; }
CUresult cuFuncSetAttribute(CUhandle f, int a, int v) { return 0; }
CUresult cuFuncGetAttribute(int *v, int a, CUhandle f) { return 0; }
`

const fakeOpsEnv = "ASYNCTP_NCCL_TEST_FAKE_OPS"

// counters parses "name=value ..." after the first ": " of s.
func counters(t *testing.T, s string) map[string]int64 {
	t.Helper()
	_, s, _ = strings.Cut(s, ": ")
	m := make(map[string]int64)
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			t.Fatalf("counters %q: bad field %q", s, f)
		}
		m[k] = n
	}
	return m
}

// snapshot is both fake libraries' counters and the host sleeps.
type snapshot struct{ nccl, cuda map[string]int64 }

func snap(t *testing.T) snapshot {
	t.Helper()
	return snapshot{counters(t, Result(1000).Error()), counters(t, cuda.Result(9999).Error())}
}

// since is the counters' growth from s; the sleeps are under "sleeps".
func (s snapshot) since(t *testing.T, sleeps int64) (nccl, cu map[string]int64) {
	t.Helper()
	now := snap(t)
	for k := range now.nccl {
		now.nccl[k] -= s.nccl[k]
	}
	for k := range now.cuda {
		now.cuda[k] -= s.cuda[k]
	}
	now.nccl["sleeps"] = hostSleeps.Load() - sleeps
	return now.nccl, now.cuda
}

func TestFakeOps(t *testing.T) {
	nccl := buildShared(t, "libnccl-ops.so", fakeOpsNCCL)
	cu := buildShared(t, "libcuda-fake.so", fakeCUDA)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeOpsChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fakeOpsEnv+"=1", EnvLibNCCL+"="+nccl, cuda.EnvLibCUDA+"="+cu)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFakeOpsChild") {
		t.Errorf("%v\n%s", err, out)
	}
}

// TestFakeOpsChild is not a test: it is the body of TestFakeOps's child.
func TestFakeOpsChild(t *testing.T) {
	if os.Getenv(fakeOpsEnv) == "" {
		t.Skip("not a child process: this is the body of TestFakeOps's child")
	}
	lib, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bf16 := func(addr uint64, shape ...int) *tensor.Tensor {
		return fakeTensor(t, 0, tensor.BFloat16, addr, shape...)
	}

	one, err := New(ctx, nil, 0, 1, 0, WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	t.Run("one-rank-all-to-all", func(t *testing.T) {
		// Rows to itself only: a copy on the stream, no NCCL group (whose
		// launch thread would cost every op), no host synchronisation,
		// pooled events. Each copy takes 20 µs on the "GPU": Wait(nil)
		// must not sleep for it.
		t.Setenv("FAKE_EVENT_US", "20")
		src, dst := bf16(0x10000, 4, 8), bf16(0x20000, 4, 8)
		before, sleeps := snap(t), hostSleeps.Load()
		for range n {
			w, err := one.AllToAllV(dst, src, []int{4}, []int{4}, nil)
			if err == nil {
				err = w.Wait(nil)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		nc, cu := before.since(t, sleeps)
		if nc["groupStart"] != 0 || nc["send"] != 0 || nc["recv"] != 0 || nc["launches"] != 0 {
			t.Errorf("NCCL calls for an exchange with itself: %v", nc)
		}
		last := snap(t).cuda
		if cu["copies"] != n || cu["copyBytes"] != n*4*8*2 || last["copyDst"] != 0x20000 || last["copySrc"] != 0x10000 {
			t.Errorf("copies: %v (last %#x <- %#x), want %d copies of 64 bytes from 0x10000 to 0x20000", cu, last["copyDst"], last["copySrc"], n)
		}
		checkHost(t, n, 8, nc, cu)
	})
	t.Run("one-rank-all-gather", func(t *testing.T) {
		src, dst := bf16(0x30000, 4, 8), bf16(0x40000, 4, 8)
		before, sleeps := snap(t), hostSleeps.Load()
		for range n {
			w, err := one.AllGather(dst, src, nil)
			if err == nil {
				err = w.Wait(nil)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		nc, cu := before.since(t, sleeps)
		if nc["colls"] != n || nc["groupStart"] != 0 {
			t.Errorf("NCCL calls: %v, want %d collectives", nc, n)
		}
		checkHost(t, n, 8, nc, cu)
	})
	t.Run("self-count-mismatch", func(t *testing.T) {
		_, err := one.AllToAllV(bf16(0x50000, 3, 8), bf16(0x60000, 4, 8), []int{4}, []int{3}, nil)
		var e *comm.Error
		if !errors.As(err, &e) || e.Op != comm.OpAllToAllV || !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "expected the same count") {
			t.Errorf("4 rows to itself, 3 from itself: %v", err)
		}
	})
	if err := one.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := one.AllToAllV(bf16(0x20000, 4, 8), bf16(0x10000, 4, 8), []int{4}, []int{4}, nil); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("all-to-all-v after Close: %v, want comm.ErrClosed", err)
	}

	// Rank 1 of 3, made as New would without a store: every group and
	// collective goes through NCCL's launch thread.
	d, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, err := d.PrimaryContext()
	if err != nil {
		t.Fatal(err)
	}
	o := defaultOptions()
	o.timeout = 10 * time.Second
	w := newWorld(lib, 0, cctx, 1, 3, o)
	unbind, err := w.bind()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := uniqueID()
	c, err := initWorld(ctx, w, id, time.Now(), time.Now().Add(10*time.Second))
	unbind()
	if err != nil {
		t.Fatal(err)
	}
	go w.watch()

	t.Run("three-rank-all-to-all", func(t *testing.T) {
		// Rows 1, 2, 3 to ranks 0, 1, 2; rows 2, 2, 1 from them.
		src, dst := bf16(0x100000, 6, 8), bf16(0x200000, 5, 8)
		before, sleeps := snap(t), hostSleeps.Load()
		took := make([]time.Duration, n)
		var last comm.Work
		for i := range n {
			start := time.Now()
			w, err := c.AllToAllV(dst, src, []int{1, 2, 3}, []int{2, 2, 1}, nil)
			if err != nil {
				t.Fatal(err)
			}
			took[i], last = time.Since(start), w
		}
		if err := last.Wait(nil); err != nil {
			t.Fatal(err)
		}
		nc, cu := before.since(t, sleeps)
		if nc["groupStart"] != n || nc["groupEnd"] != n || nc["send"] != 3*n || nc["recv"] != 3*n ||
			nc["sendElems"] != n*6*8 || nc["recvElems"] != n*5*8 || nc["launches"] != n {
			t.Errorf("NCCL calls: %v, want per op one group of 3 sends (48 elements) and 3 receives (40)", nc)
		}
		if nc["busy"] != 0 {
			t.Errorf("%d calls while the communicator was in progress (NCCL refuses them)", nc["busy"])
		}
		checkHost(t, n, -1, nc, cu)
		// The fake's launch thread takes 30 µs; a sleep made it 1 ms. Only
		// logged: on a loaded machine every yield of the spin can cost a
		// time slice (the sleeps above are the check).
		slices.Sort(took)
		t.Logf("median op: %v on the host (the launch thread takes 30µs)", took[n/2])
	})
	t.Run("three-rank-all-reduce", func(t *testing.T) {
		t.Setenv("FAKE_EVENT_US", "20")
		buf := bf16(0x300000, 4, 8)
		before, sleeps := snap(t), hostSleeps.Load()
		for range n {
			if _, err := c.AllReduce(buf, comm.Sum, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Barrier(); err != nil {
			t.Fatal(err)
		}
		nc, cu := before.since(t, sleeps)
		if nc["colls"] != n+1 || nc["launches"] != n+1 || nc["busy"] != 0 {
			t.Errorf("NCCL calls: %v, want %d collectives, each through the launch thread", nc, n+1)
		}
		checkHost(t, n+1, -1, nc, cu)
	})
	t.Run("three-rank-self-only", func(t *testing.T) {
		before, sleeps := snap(t), hostSleeps.Load()
		w, err := c.AllToAllV(bf16(0x400000, 2, 8), bf16(0x500000, 2, 8), []int{0, 2, 0}, []int{0, 2, 0}, nil)
		if err == nil {
			err = w.Wait(nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		nc, cu := before.since(t, sleeps)
		if nc["groupStart"] != 0 || nc["launches"] != 0 || cu["copies"] != 1 || cu["copyBytes"] != 32 {
			t.Errorf("NCCL %v, CUDA %v: want one copy of 32 bytes and no NCCL call", nc, cu)
		}
	})
	t.Run("slow-launch", func(t *testing.T) {
		// Longer than the spin: the op still completes, by sleeping.
		t.Setenv("FAKE_LAUNCH_US", "50000")
		spin := c.w.opts.spin
		c.w.opts.spin = 0
		defer func() { c.w.opts.spin = spin }()
		before, sleeps := snap(t), hostSleeps.Load()
		start := time.Now()
		w, err := c.AllToAllV(bf16(0x200000, 6, 8), bf16(0x100000, 6, 8), []int{2, 2, 2}, []int{2, 2, 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 50*time.Millisecond {
			t.Errorf("queued in %v: the launch thread takes 50ms", took)
		}
		if err := w.Wait(nil); err != nil {
			t.Fatal(err)
		}
		nc, _ := before.since(t, sleeps)
		if nc["sleeps"] == 0 || nc["busy"] != 0 || nc["launches"] != 1 {
			t.Errorf("NCCL %v: want one launch, settled with sleeps, no call while in progress", nc)
		}
	})
	t.Run("async-failure", func(t *testing.T) {
		t.Setenv("FAKE_ASYNC_FAIL", "1")
		_, err := c.AllToAllV(bf16(0x200000, 6, 8), bf16(0x100000, 6, 8), []int{2, 2, 2}, []int{2, 2, 2}, nil)
		var e *comm.Error
		if !errors.As(err, &e) || e.Op != comm.OpAllToAllV || !errors.Is(err, RemoteError) || !errors.Is(err, comm.ErrAborted) {
			t.Errorf("a launch that fails: %v, want a *comm.Error wrapping ncclRemoteError and comm.ErrAborted", err)
		}
		if _, err := c.AllReduce(bf16(0x300000, 4, 8), comm.Sum, nil); !errors.Is(err, comm.ErrAborted) {
			t.Errorf("an op after the failure: %v, want comm.ErrAborted", err)
		}
	})
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}

// checkHost checks what n ops cost the host: no host synchronisation, no
// sleep, one event recorded per op, at most events created when events ≥ 0
// (ops waited for one by one reuse a few; the watchdog recycles the events
// of the others every millisecond or so, when it gets a CPU).
func checkHost(t *testing.T, n, events int64, nc, cu map[string]int64) {
	t.Helper()
	if cu["streamSync"] != 0 || cu["ctxSync"] != 0 || cu["eventSync"] != 0 {
		t.Errorf("host synchronisations in %d ops: %v", n, cu)
	}
	if cu["eventRecord"] != n {
		t.Errorf("%d events recorded for %d ops", cu["eventRecord"], n)
	}
	if events >= 0 && cu["eventCreate"] > events || cu["allocs"] != 0 {
		t.Errorf("%d events created and %d allocations for %d ops (events are pooled)", cu["eventCreate"], cu["allocs"], n)
	}
	if nc["sleeps"] != 0 {
		t.Errorf("%d host sleeps in %d ops (a sleep lasts a millisecond)", nc["sleeps"], n)
	}
}

// buildShared compiles C source into a shared library with extra flags.
func buildShared(t *testing.T, name, source string, flags ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build a fake library: %v", cc, err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, strings.TrimSuffix(name, ".so")+".c")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, name)
	args := append([]string{"-shared", "-fPIC", "-o", lib, src}, flags...)
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", cc, args, err, out)
	}
	return lib
}
