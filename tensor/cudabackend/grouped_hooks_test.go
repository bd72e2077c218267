package cudabackend

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// The grouped engine's hooks of the fused expert path (GroupedWait,
// GroupedSignal; EngineGroupedMatMulHooked) on an sm_90 GPU; they skip
// elsewhere, saying why.
//
//	./build/tensor_cudabackend.test -test.run 'TestGroupedEngineHooks' -test.v

// hookBlocks is the number of 128-row blocks of counts in group-major
// order (grouped_sm90.cu's blk_s[G]).
func hookBlocks(counts []int) int {
	n := 0
	for _, c := range counts {
		n += (c + EngineTileM - 1) / EngineTileM
	}
	return n
}

// u64Words uploads vals as 64-bit flags (gemm_engine_test.go's helpers).
func u64Words(t *testing.T, g *Backend, vals []uint64) *tensor.Tensor {
	t.Helper()
	x := flagWords(g, len(vals))
	setFlags(t, g, x, vals)
	return x
}

// TestGroupedEngineHooks: with every block's flag already at the target,
// the hooked forward (wait and signal) gives the plain engine's bits; the
// signal leaves ⌈N/256⌉·Value in each block's flag and nothing past the
// step's blocks; a block whose flag never rises fails the next Sync with
// ErrGEMMWaitTimeout naming it, within about the timeout.
func TestGroupedEngineHooks(t *testing.T) {
	g := openGroupedEngine(t)
	gc := groupedEngineCases()[1] // empty groups, 1, 127, 128, 129 rows
	off, _ := gc.offsets()
	G, K := len(gc.counts), gc.k
	nb := hookBlocks(gc.counts)
	offs, a, w, m, N := groupedForwardInputs(t, g, gc, 17)
	plain, hooked := g.Zeros(tensor.BFloat16, m, N), g.Zeros(tensor.BFloat16, m, N)
	if err := g.EngineGroupedMatMul(plain, a, w, offs, true, 1, 0); err != nil {
		t.Fatal(err)
	}
	ready := make([]uint64, nb+4)
	for i := range ready {
		ready[i] = 7
	}
	wf := u64Words(t, g, ready)
	sf := g.Zeros(tensor.Int32, 2*(nb+4))
	o := GroupedOptions{Wait: &GroupedWait{Flags: DevicePtr(wf), Target: 7, Timeout: time.Second},
		Signal: &GroupedSignal{Flags: DevicePtr(sf), Value: 3}}
	if err := g.EngineGroupedMatMulHooked(hooked, a, w, offs, true, 1, 0, o); err != nil {
		t.Fatal(err)
	}
	got, want := testutil.Download(g, hooked), testutil.Download(g, plain)
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	nonzero := false
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Fatalf("hooked[%d] = %v, plain engine %v: expected identical bits", i, got[i], want[i])
		}
		nonzero = nonzero || want[i] != 0
	}
	if !nonzero {
		t.Fatal("the plain engine's output is all zeros: the comparison proves nothing")
	}
	numN := uint64(ceilDiv(N, EngineTileN))
	for q, v := range readFlags(t, g, sf) {
		want := uint64(0)
		if q < nb {
			want = 3 * numN
		}
		if v != want {
			t.Errorf("signal flag of block %d = %d, want %d (%d blocks, %d column tiles)", q, v, want, nb, numN)
		}
	}

	// Block 3 never ready.
	g2 := openGroupedEngine(t)
	offs2 := g2.Zeros(tensor.Int32, G+1)
	g2.Upload(offs2, mustI32(t, off))
	a2, w2, c2 := g2.Zeros(tensor.BFloat16, m, K), g2.Zeros(tensor.BFloat16, G, N, K), g2.Zeros(tensor.BFloat16, m, N)
	ready[3] = 6
	wf2 := u64Words(t, g2, ready)
	start := time.Now()
	err := g2.EngineGroupedMatMulHooked(c2, a2, w2, offs2, true, 1, 0, GroupedOptions{Wait: &GroupedWait{Flags: DevicePtr(wf2), Target: 7, Timeout: 100 * time.Millisecond}})
	if err == nil {
		err = g2.Sync()
	}
	if err == nil || !errors.Is(err, ErrGEMMWaitTimeout) || !strings.Contains(err.Error(), "block 3 of a's 128-row blocks") {
		t.Fatalf("a block whose flag never rises: %v, want ErrGEMMWaitTimeout naming block 3", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the timed-out call took %v, want about the 100ms timeout", d)
	}
	t.Logf("%v", err)
}

// TestGroupedOptionsCheck: bad hook arguments are refused before a launch,
// saying what was expected (no GPU needed: checked first).
func TestGroupedOptionsCheck(t *testing.T) {
	for _, tc := range []struct {
		o    GroupedOptions
		want string
	}{
		{GroupedOptions{Wait: &GroupedWait{Flags: 12, Timeout: time.Second}}, "8-byte aligned"},
		{GroupedOptions{Wait: &GroupedWait{Flags: 16}}, "Timeout = 0s, expected > 0"},
		{GroupedOptions{Signal: &GroupedSignal{}}, "Signal.Flags = 0x0"},
	} {
		if err := tc.o.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check(%+v) = %v, want an error containing %q", tc.o, err, tc.want)
		}
	}
	if err := (GroupedOptions{Wait: &GroupedWait{Flags: 16, Timeout: time.Second}, Signal: &GroupedSignal{Flags: 8}}).check(); err != nil {
		t.Errorf("valid hooks: %v", err)
	}
}
