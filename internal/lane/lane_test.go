package lane

import (
	"errors"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestCPUOrderAndPoison: on the CPU a call's ops run one after another in
// issue order on the lane's goroutine; the op after a failed one does not
// run and reports the first failure; End's Work returns once every op has
// run, and a new call starts clean.
func TestCPUOrderAndPoison(t *testing.T) {
	l, err := New(cpu.New(), nil, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	boom := errors.New("boom")
	var ran []int
	op := func(i int, fail bool) Op {
		return func(comm.Stream) (comm.Work, error) {
			ran = append(ran, i)
			if fail {
				return nil, boom
			}
			return comm.Done, nil
		}
	}
	if l.Active() {
		t.Fatal("a new lane is active")
	}
	l.Begin()
	var ws []comm.Work
	for i := range 5 {
		ws = append(ws, l.Run(op(i, i == 2)))
	}
	if err := l.End().Wait(nil); err != nil {
		t.Fatalf("End: %v, want nil", err)
	}
	if l.Active() {
		t.Fatal("the lane is active after End")
	}
	if !slices.Equal(ran, []int{0, 1, 2}) {
		t.Fatalf("ops ran %v, want [0 1 2] (in order, none after the failure)", ran)
	}
	for i, w := range ws {
		if err := w.Wait(nil); (i >= 2) != errors.Is(err, boom) {
			t.Fatalf("op %d: %v, want the failure from op 2 on", i, err)
		}
	}
	ran = nil
	l.Begin()
	w := l.Run(op(7, false))
	if err := w.Wait(nil); err != nil || !slices.Equal(ran, []int{7}) {
		t.Fatalf("the next call: %v, ran %v; want a clean start", err, ran)
	}
	if err := l.End().Wait(nil); err != nil {
		t.Fatal(err)
	}
	if err := l.End().Wait(nil); err != nil {
		t.Fatalf("End without a call: %v, want nil", err)
	}
}
