//go:build asynctp_emu

package peercopy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// TestEmuSignalWaits: a wait whose words reach the target passes; a word
// left short fails the next Sync naming it, and only the raising wait then
// sets the short words to the target (so stream waits on them pass).
func TestEmuSignalWaits(t *testing.T) {
	for _, raising := range []bool{false, true} {
		b := emuworld.Backend(t)
		words := b.Zeros(tensor.Int32, 2*3) // three 64-bit words
		status := b.Zeros(tensor.Int32, 4)
		h, _ := tensor.FromInt32([]int32{7, 0, 5, 0, 9, 0}, 6) // word 1 (5) is short of 6
		b.Upload(words, h)
		what := func(i int) error { return fmt.Errorf("signal %d never came", i) }
		wait := waitSignals
		if raising {
			wait = waitSignalsRaising
		}
		wait(b, cudabackend.DevicePtr(words), 3, 5, time.Second, status, what) // all ≥ 5: passes
		if err := b.Sync(); err != nil {
			t.Fatalf("raising=%v: every word at its target: %v", raising, err)
		}
		wait(b, cudabackend.DevicePtr(words), 3, 6, 20*time.Millisecond, status, what)
		err := b.Sync()
		if err == nil || !strings.Contains(err.Error(), "signal 1 never came") {
			t.Fatalf("raising=%v: word 1 short of its target: Sync gave %v, want an error naming signal 1", raising, err)
		}
		// The backend refuses every op after the failure (its error is
		// sticky) until it is cleared: read the words the wait left.
		got := rawInt32s(t, b, words)
		want := []int32{7, 0, 5, 0, 9, 0}
		if raising {
			want = []int32{7, 0, 6, 0, 9, 0}
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("raising=%v: words after the deadline %v, want %v", raising, got, want)
			}
		}
	}
}
