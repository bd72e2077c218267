package comm_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestGrid: world 8 = dp 4 × tp 2, ep 4. The group layout is also checked
// over every world size by commtest.
func TestGrid(t *testing.T) {
	names := make([][]string, 8)
	onRanks(t, 8, func(c comm.Comm, b tensor.Backend) error {
		g, err := comm.NewGrid(c, 4, 2, 4)
		if err != nil {
			return err
		}
		defer g.Close()
		names[c.Rank()] = []string{g.TPGroup.Name(), g.DPGroup.Name(), g.EPGroup.Name(), g.EDPGroup.Name()}
		// A sum over TP then DP is a sum over the world.
		buf, _ := tensor.FromFloat64([]float64{float64(c.Rank())}, 1)
		if err := wait(g.TPGroup.AllReduce(buf, comm.Sum, nil)); err != nil {
			return err
		}
		if err := wait(g.DPGroup.AllReduce(buf, comm.Sum, nil)); err != nil {
			return err
		}
		if buf.F64()[0] != 28 {
			return fmt.Errorf("tp then dp sum: %v, want 28", buf.F64()[0])
		}
		return nil
	})
	want := map[int][]string{
		0: {"tp[0 1]", "dp[0 2 4 6]", "ep[0 1 2 3]", "edp[0 4]"},
		5: {"tp[4 5]", "dp[1 3 5 7]", "ep[4 5 6 7]", "edp[1 5]"},
		6: {"tp[6 7]", "dp[0 2 4 6]", "ep[4 5 6 7]", "edp[2 6]"},
	}
	for r, w := range want {
		if strings.Join(names[r], " ") != strings.Join(w, " ") {
			t.Errorf("rank %d: groups %v, want %v", r, names[r], w)
		}
	}
}

func TestGridErrors(t *testing.T) {
	c := local.NewWorld(1)[0]
	for _, s := range [][3]int{{1, 2, 1}, {0, 1, 1}, {1, 1, 2}, {1, 1, 0}} {
		_, err := comm.NewGrid(c, s[0], s[1], s[2])
		var e *comm.Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), "expected") {
			t.Errorf("NewGrid(dp %d, tp %d, ep %d): %v", s[0], s[1], s[2], err)
		}
	}
}

func TestGroupName(t *testing.T) {
	long := make([]int, 12)
	for i := range long {
		long[i] = 2 * i
	}
	for _, tc := range []struct {
		ranks []int
		want  string
	}{
		{[]int{2, 3}, "tp[2 3]"},
		{nil, "tp[]"},
		{long, "tp[0 2 4 6 8 10 12 14 ... 22 (12 ranks)]"},
	} {
		if got := comm.GroupName("tp", tc.ranks); got != tc.want {
			t.Errorf("GroupName(%v) = %q, want %q", tc.ranks, got, tc.want)
		}
	}
}

// onRanks runs fn on every rank of a local world of n, each with its own
// CPU backend, and fails the test with the ranks' errors.
func onRanks(t *testing.T, n int, fn func(c comm.Comm, b tensor.Backend) error) {
	t.Helper()
	err := local.Run(n, func(c comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		if err := fn(c, b); err != nil {
			return err
		}
		return b.Err()
	}, local.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
}

// wait runs an op and waits on its work.
func wait(w comm.Work, err error) error {
	if err != nil {
		return err
	}
	return w.Wait(nil)
}

type symWorld struct{ comm.Comm }

func (symWorld) AllocSymmetric([]int, tensor.DType) (*tensor.Tensor, error) { return nil, nil }
func (symWorld) FreeSymmetric(*tensor.Tensor) error                         { return nil }
func (symWorld) PeerPtr(*tensor.Tensor, int) (uint64, error)                { return 0, nil }

type wrapped struct{ comm.Comm }

func (w wrapped) Unwrap() comm.Comm { return w.Comm }

// SymmetricOf finds the capability through decorators, and says when there
// is none.
func TestSymmetricOf(t *testing.T) {
	base := local.NewWorld(1)[0]
	if _, ok := comm.SymmetricOf(base); ok {
		t.Fatal("comm/local has no symmetric memory")
	}
	sym := symWorld{base}
	for _, c := range []comm.Comm{sym, wrapped{sym}, wrapped{wrapped{sym}}} {
		if s, ok := comm.SymmetricOf(c); !ok || s != comm.SymmetricMemory(sym) {
			t.Errorf("%T: got %v, %v; want the wrapped transport's", c, s, ok)
		}
	}
	if _, ok := comm.SymmetricOf(wrapped{base}); ok {
		t.Error("a wrapper of a transport without symmetric memory has none")
	}
}
