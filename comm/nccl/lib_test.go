package nccl

// Tests that need neither NCCL nor a GPU: the C declarations against what
// was checked in nccl.h, the type mappings, the loader's errors.

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// TestConfigLayout: atp_ncclConfig has the layout of ncclConfig_v22800 in
// nccl.h.in of NCCL 2.28.3 on LP64 (x86-64, AArch64): 8-byte size_t and
// pointers, 4-byte ints, natural alignment.
func TestConfigLayout(t *testing.T) {
	size, off := configLayout()
	if size != 80 {
		t.Errorf("sizeof(ncclConfig_t) = %d, want 80", size)
	}
	want := map[string]uintptr{
		"magic": 8, "version": 12, "blocking": 16, "cgaClusterSize": 20, "minCTAs": 24, "maxCTAs": 28,
		"netName": 32, "splitShare": 40, "trafficClass": 44, "commName": 48, "collnetEnable": 56,
		"CTAPolicy": 60, "shrinkShare": 64, "nvlsCTAs": 68, "nChannelsPerNetPeer": 72, "nvlinkCentricSched": 76,
	}
	for _, f := range configFields {
		if off[f] != want[f] {
			t.Errorf("offsetof(ncclConfig_t, %s) = %d, want %d", f, off[f], want[f])
		}
	}
}

// TestConfigInitializer: the config is NCCL_CONFIG_INITIALIZER of 2.28.3
// (size, magic 0xcafebeef, NCCL_VERSION(2,28,3), everything else
// NCCL_CONFIG_UNDEF_INT / NULL), with blocking set.
func TestConfigInitializer(t *testing.T) {
	for _, blocking := range []int{0, 1} {
		c := defaultConfig(blocking)
		if c.Size != 80 || c.Magic != 0xcafebeef || c.Version != 22803 {
			t.Errorf("blocking %d: size %d, magic %#x, version %d; want 80, 0xcafebeef, 22803", blocking, c.Size, c.Magic, c.Version)
		}
		if !c.NilPointers {
			t.Errorf("blocking %d: netName or commName is not NULL", blocking)
		}
		for f, v := range c.Ints {
			want := int32(math.MinInt32)
			if f == "blocking" {
				want = int32(blocking)
			}
			if v != want {
				t.Errorf("blocking %d: %s = %d, want %d", blocking, f, v, want)
			}
		}
		if len(c.Ints) != 12 {
			t.Errorf("checked %d int fields, want 12", len(c.Ints))
		}
	}
	if got := decodeVersion(22803).Code(); got != 22803 {
		t.Errorf("NCCL_VERSION(2,28,3) round trip: %d", got)
	}
	if uniqueIDBytes != 128 {
		t.Errorf("NCCL_UNIQUE_ID_BYTES = %d, want 128", uniqueIDBytes)
	}
	if ncclSplitNoColor != comm.NoColor {
		t.Errorf("NCCL_SPLIT_NOCOLOR %d != comm.NoColor %d", ncclSplitNoColor, comm.NoColor)
	}
}

func TestDataTypes(t *testing.T) {
	for _, tc := range []struct {
		dt   tensor.DType
		want int
	}{{tensor.Float32, 7}, {tensor.BFloat16, 9}, {tensor.Int32, 2}, {tensor.Float64, 8}} {
		if got, err := dataType(tc.dt); err != nil || got != tc.want {
			t.Errorf("dataType(%v) = %d, %v; want %d", tc.dt, got, err, tc.want)
		}
	}
	if _, err := dataType(tensor.Invalid); err == nil || !strings.Contains(err.Error(), "expected f32, bf16, i32 or f64") {
		t.Errorf("dataType(invalid): %v", err)
	}
}

func TestReduceOps(t *testing.T) {
	for _, tc := range []struct {
		op   comm.ReduceOp
		want int
	}{{comm.Sum, 0}, {comm.Max, 2}, {comm.Avg, 4}} {
		if got, err := redOp(tc.op); err != nil || got != tc.want {
			t.Errorf("redOp(%v) = %d, %v; want %d", tc.op, got, err, tc.want)
		}
	}
	if _, err := redOp(comm.ReduceOp(9)); err == nil {
		t.Error("redOp(9): no error")
	}
}

func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		code int
		want Version
	}{{22803, Version{2, 28, 3}}, {21805, Version{2, 18, 5}}, {2804, Version{2, 8, 4}}, {30002, Version{3, 0, 2}}} {
		v := decodeVersion(tc.code)
		if v != tc.want || v.Code() != tc.code {
			t.Errorf("decodeVersion(%d) = %v (code %d), want %v", tc.code, v, v.Code(), tc.want)
		}
	}
	if !(Version{2, 17, 1}).Less(MinVersion) || (Version{2, 28, 3}).Less(MinVersion) {
		t.Error("Less is wrong around MinVersion")
	}
	if s := (Library{Path: "libnccl.so.2", Version: Version{2, 28, 3}}).String(); s != "NCCL 2.28.3 (libnccl.so.2)" {
		t.Errorf("Library.String() = %q", s)
	}
}

func TestResultNames(t *testing.T) {
	if RemoteError.Name() != "ncclRemoteError" || InProgress.Name() != "ncclInProgress" || Result(42).Name() != "ncclResult(42)" {
		t.Errorf("names: %s %s %s", RemoteError.Name(), InProgress.Name(), Result(42).Name())
	}
	e := &Error{Call: "ncclAllReduce", Result: InvalidArgument, Last: "count overflow"}
	if !errors.Is(e, InvalidArgument) || !strings.Contains(e.Error(), "nccl: ncclAllReduce: ncclInvalidArgument") ||
		!strings.Contains(e.Error(), "count overflow") {
		t.Errorf("Error: %v", e)
	}
}

// TestMissingLibrary: the loader's errors name the library and how to get
// it, and never crash.
func TestMissingLibrary(t *testing.T) {
	_, err := openLibrary("/nonexistent/libnccl.so.2", true)
	if err == nil {
		t.Fatal("opened /nonexistent/libnccl.so.2")
	}
	want := "nccl: cannot load /nonexistent/libnccl.so.2 (named by ASYNCTP_LIBNCCL; it comes with the NCCL package or PyTorch's nvidia-nccl wheel): "
	if !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("error %q, want it to start with %q and carry dlerror's text", err, want)
	}

	l, err := openLibrary(DefaultLibrary, false)
	if err == nil {
		l.Close()
		t.Skip("libnccl.so.2 is installed here: the message of a missing one cannot be checked")
	}
	want = "nccl: cannot load libnccl.so.2 (set ASYNCTP_LIBNCCL to its path; it comes with the NCCL package or PyTorch's nvidia-nccl wheel): "
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want it to start with %q", err, want)
	}
}

// TestLoadFromEnv: Load and New honour ASYNCTP_LIBNCCL.
func TestLoadFromEnv(t *testing.T) {
	if installed.Load() {
		t.Skip("a library is already loaded in this process")
	}
	t.Setenv(EnvLibNCCL, "/nonexistent")
	_, err := Load()
	if err == nil || !strings.HasPrefix(err.Error(), "nccl: cannot load /nonexistent (named by ASYNCTP_LIBNCCL;") {
		t.Errorf("Load: %v", err)
	}
	_, err2 := Load() // remembered
	if err2 == nil || err2.Error() != err.Error() {
		t.Errorf("second Load: %v", err2)
	}
	if _, err := New(context.Background(), nil, 0, 1, 0); err == nil || !strings.Contains(err.Error(), "cannot load /nonexistent") {
		t.Errorf("New without the library: %v", err)
	}
}

func TestNewArguments(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		rank, size, dev int
		want            string
	}{
		{0, 0, 0, "expected 0 ≤ rank < size"},
		{2, 2, 0, "expected 0 ≤ rank < size"},
		{-1, 2, 0, "expected 0 ≤ rank < size"},
		{0, 1, -1, "expected a CUDA ordinal ≥ 0"},
		{0, 2, 0, "expected a rendezvous store"},
	} {
		_, err := New(ctx, nil, tc.rank, tc.size, tc.dev)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(rank %d, size %d, device %d): %v, want an error containing %q", tc.rank, tc.size, tc.dev, err, tc.want)
		}
	}
}

func TestOptions(t *testing.T) {
	o := defaultOptions()
	for _, f := range []Option{WithTimeout(-1), WithHeartbeat(0, 0)} {
		f(&o)
	}
	if o.timeout != DefaultTimeout || o.heartbeat != DefaultHeartbeat || o.lostAfter != DefaultLostAfter {
		t.Errorf("defaults not kept: %+v", o)
	}
	WithHeartbeat(100e6, 50e6)(&o) // lost ≤ interval keeps the default
	if o.heartbeat != 100e6 || o.lostAfter != DefaultLostAfter {
		t.Errorf("WithHeartbeat(100ms, 50ms): %v, %v", o.heartbeat, o.lostAfter)
	}
	WithHeartbeat(-1, 0)(&o)
	if o.heartbeat >= 0 {
		t.Errorf("WithHeartbeat(-1) did not turn heartbeats off")
	}
	if o.blocking != 0 {
		t.Errorf("blocking = %d: communicators must be non-blocking", o.blocking)
	}
}

func TestBusFactor(t *testing.T) {
	for _, tc := range []struct {
		op   string
		n    int
		want float64
	}{
		{comm.OpAllReduce, 8, 1.75}, {comm.OpAllReduce, 1, 0}, {comm.OpAllGather, 4, 0.75},
		{comm.OpReduceScatter, 2, 0.5}, {comm.OpAllToAllV, 8, 0.875}, {comm.OpBroadcast, 8, 1},
	} {
		if got := busFactor(tc.op, tc.n); got != tc.want {
			t.Errorf("busFactor(%s, %d) = %v, want %v", tc.op, tc.n, got, tc.want)
		}
	}
}
