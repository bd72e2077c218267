package nccl

// The loader and the init path against a fake libnccl built here with the C
// compiler cgo uses: it exports the NCCL entry points with nccl.h 2.28's
// types and checks what it is given (the config struct field by field, the
// unique id passed by value), so the cgo layer is exercised end to end on
// machines without NCCL. Loading installs the library for the life of the
// process, so the checks run in a child process.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
)

const fakeEnv = "ASYNCTP_NCCL_TEST_FAKE"

const fakeSource = `
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
/* ncclConfig_v22800, as in nccl.h of NCCL 2.28.3. */
typedef struct ncclConfig_v22800 {
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
} ncclConfig_t;
typedef void *ncclComm_t;

#ifndef FAKE_VERSION
#define FAKE_VERSION 22803
#endif

static char last[512];
static int polls, aborts, object;

int ncclGetVersion(int *v) { *v = FAKE_VERSION; return 0; }
int ncclGetUniqueId(ncclUniqueId *id) {
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(7 * i + 1);
  return 0;
}
int ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *c) {
  for (int i = 0; i < 128; i++)
    if (id.internal[i] != (char)(7 * i + 1)) { snprintf(last, sizeof last, "unique id garbled at byte %d", i); return 4; }
  int undef = c->cgaClusterSize == INT_MIN && c->minCTAs == INT_MIN && c->maxCTAs == INT_MIN &&
    c->splitShare == INT_MIN && c->trafficClass == INT_MIN && c->collnetEnable == INT_MIN &&
    c->CTAPolicy == INT_MIN && c->shrinkShare == INT_MIN && c->nvlsCTAs == INT_MIN &&
    c->nChannelsPerNetPeer == INT_MIN && c->nvlinkCentricSched == INT_MIN && !c->netName && !c->commName;
  if (c->size != sizeof(ncclConfig_t) || c->magic != 0xcafebeef || c->version != 22803 || c->blocking != 0 || !undef) {
    snprintf(last, sizeof last, "bad config: size %zu magic %#x version %u blocking %d, others undefined %d",
      c->size, c->magic, c->version, c->blocking, undef);
    return 4;
  }
  if (nranks != 3 || rank != 1) { snprintf(last, sizeof last, "rank %d of %d", rank, nranks); return 4; }
  *comm = &object;
  polls = 0;
  return 7; /* ncclInProgress: poll ncclCommGetAsyncError */
}
int ncclCommGetAsyncError(ncclComm_t comm, int *state) {
  *state = (getenv("FAKE_NEVER_READY") || ++polls < 3) ? 7 : 0;
  return 0;
}
int ncclCommAbort(ncclComm_t comm) { snprintf(last, sizeof last, "aborted %d", ++aborts); return 0; }
int ncclCommFinalize(ncclComm_t comm) { return 0; }
int ncclCommDestroy(ncclComm_t comm) { return 0; }
#ifndef NO_SPLIT
int ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) { return 0; }
#endif
int ncclCommCount(ncclComm_t comm, int *n) { *n = 3; return 0; }
int ncclCommUserRank(ncclComm_t comm, int *r) { *r = 1; return 0; }
int ncclAllGather(const void *s, void *r, size_t n, int dt, ncclComm_t comm, void *st) { return 0; }
int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, ncclComm_t comm, void *st) { return 0; }
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t comm, void *st) { return 0; }
int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, ncclComm_t comm, void *st) { return 0; }
int ncclSend(const void *s, size_t n, int dt, int peer, ncclComm_t comm, void *st) { return 0; }
int ncclRecv(void *r, size_t n, int dt, int peer, ncclComm_t comm, void *st) { return 0; }
int ncclGroupStart(void) { return 0; }
int ncclGroupEnd(void) { return 0; }
const char *ncclGetErrorString(int r) { return r == 4 ? "invalid argument (fake)" : "fake result"; }
const char *ncclGetLastError(ncclComm_t comm) { return last; }
`

// buildFake compiles the fake library with extra -D flags.
func buildFake(t *testing.T, name string, defines ...string) string {
	t.Helper()
	return buildShared(t, name, fakeSource, defines...)
}

// runFake runs TestFakeChild in mode with the library at lib.
func runFake(t *testing.T, mode, lib string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fakeEnv+"="+mode, EnvLibNCCL+"="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFakeChild") {
		t.Errorf("%s: %v\n%s", mode, err, out)
	}
}

func TestFakeLibrary(t *testing.T) {
	runFake(t, "ok", buildFake(t, "libnccl-fake.so"))
	runFake(t, "old", buildFake(t, "libnccl-old.so", "-DFAKE_VERSION=21701"))

	nosplit := buildFake(t, "libnccl-nosplit.so", "-DNO_SPLIT")
	_, err := openLibrary(nosplit, true)
	if err == nil || !strings.Contains(err.Error(), "has no symbol ncclCommSplit") {
		t.Errorf("a library without ncclCommSplit: %v", err)
	}
}

// TestFakeChild is not a test: it is the body of TestFakeLibrary's children.
func TestFakeChild(t *testing.T) {
	mode := os.Getenv(fakeEnv)
	if mode == "" {
		t.Skip("not a child process: this is the body of TestFakeLibrary's children")
	}
	lib, err := Load()
	if mode == "old" {
		if err == nil || !strings.Contains(err.Error(), "is NCCL 2.17.1; this package needs 2.18.0 or newer") {
			t.Errorf("Load of NCCL 2.17.1: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if lib.Version != (Version{2, 28, 3}) || lib.Path != os.Getenv(EnvLibNCCL) {
		t.Errorf("Load: %v", lib)
	}
	id, err := uniqueID()
	if err != nil || len(id) != 128 || id[0] != 1 || id[1] != 8 || id[127] != byte((7*127+1)%256) {
		t.Fatalf("uniqueID: %v, %v", id, err)
	}

	// The config and the id reach NCCL intact; ncclInProgress is polled.
	w := newWorld(lib, 0, nil, 1, 3, defaultOptions())
	ctx := context.Background()
	h, out, err := initHandle(ctx, w, id, time.Now(), time.Now().Add(5*time.Second))
	if err != nil || h == 0 || out == nil {
		t.Fatalf("initHandle: %v (last error %q)", err, lastError())
	}
	if s, err := state(h); err != nil || s != Success {
		t.Errorf("state: %v, %v", s, err)
	}

	garbled := append([]byte(nil), id...)
	garbled[5] ^= 0xff
	_, _, err = initHandle(ctx, w, garbled, time.Now(), time.Now().Add(5*time.Second))
	if !errors.Is(err, InvalidArgument) || !strings.Contains(err.Error(), "unique id garbled at byte 5") ||
		!strings.Contains(err.Error(), "ncclInvalidArgument: invalid argument (fake)") {
		t.Errorf("garbled id: %v", err)
	}

	os.Setenv("FAKE_NEVER_READY", "1")
	start := time.Now()
	_, _, err = initHandle(ctx, w, id, start, start.Add(100*time.Millisecond))
	if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(err.Error(), "init #0 on world[0 1 2], world rank 1, did not complete") {
		t.Errorf("init that never completes: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("timed out after %v, want about 100ms", took)
	}
	if !strings.Contains(lastError(), "aborted") {
		t.Errorf("the communicator was not aborted: last error %q", lastError())
	}
	if got := abortHandle(h); got != Success {
		t.Errorf("abort: %v", got)
	}
}
