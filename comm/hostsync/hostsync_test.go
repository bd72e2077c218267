package hostsync_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/hostsync"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
)

// device counts its Syncs and fails them once err is set.
type device struct {
	syncs atomic.Int64
	err   error
}

func (d *device) Sync() error {
	d.syncs.Add(1)
	return d.err
}

// wrappedWorld is a comm/local world of n ranks, each behind the
// decorator, all waiting for dev.
func wrappedWorld(dev *device, opts ...local.Option) func(t *testing.T, n int) []comm.Comm {
	return func(t *testing.T, n int) []comm.Comm {
		ranks := local.NewWorld(n, opts...)
		for r, c := range ranks {
			ranks[r] = hostsync.New(c, dev)
		}
		return ranks
	}
}

// The decorated transport passes the transports' conformance suite (every
// op, dtype, split and local error, a missing rank and an abort), and
// waits for the device before every op.
func TestConformance(t *testing.T) {
	dev := &device{}
	commtest.Run(t, wrappedWorld(dev), commtest.Sizes(1, 2, 3, 5), commtest.Mismatch(),
		commtest.MissingRank(wrappedWorld(dev, local.WithTimeout(200*time.Millisecond)), 200*time.Millisecond))
	if dev.syncs.Load() == 0 {
		t.Fatal("no op waited for the device")
	}
}

// Each op waits for the device first; a device that failed fails the op
// with a *comm.Error naming it, before the transport runs it.
func TestSyncBeforeEachOp(t *testing.T) {
	dev := &device{}
	c := hostsync.New(local.NewWorld(1)[0], dev)
	defer c.Close()
	buf, err := tensor.FromFloat32([]float32{1, 2, 3}, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		w, err := c.AllReduce(buf, comm.Sum, "a stream the decorator ignores")
		if err != nil || w != comm.Done {
			t.Fatalf("all-reduce %d: %v, %v; want comm.Done", i, w, err)
		}
		if got := dev.syncs.Load(); got != int64(i) {
			t.Fatalf("after %d ops: %d device syncs, want %d", i, got, i)
		}
	}
	dev.err = errors.New("device lost")
	_, err = c.AllReduce(buf, comm.Sum, nil)
	var ce *comm.Error
	if !errors.As(err, &ce) || ce.Op != comm.OpAllReduce || !errors.Is(err, dev.err) {
		t.Fatalf("all-reduce after the device failed: %v; want a *comm.Error of %s wrapping %q", err, comm.OpAllReduce, dev.err)
	}
}

// symmetric is a transport with symmetric memory (its methods are not
// called).
type symmetric struct{ comm.Comm }

func (symmetric) AllocSymmetric([]int, tensor.DType) (*tensor.Tensor, error) { return nil, nil }
func (symmetric) FreeSymmetric(*tensor.Tensor) error                         { return nil }
func (symmetric) PeerPtr(*tensor.Tensor, int) (uint64, error)                { return 0, nil }

// The transport's capabilities are found through the decorator, and a
// group split from it is decorated alike.
func TestWrapper(t *testing.T) {
	inner := symmetric{local.NewWorld(1)[0]}
	c := hostsync.New(inner, &device{})
	defer c.Close()
	if s, ok := comm.SymmetricOf(c); !ok || s != comm.SymmetricMemory(inner) {
		t.Fatalf("SymmetricOf(decorated): %v, %v; want the transport's", s, ok)
	}
	for _, label := range []string{"", "tp"} {
		g, err := comm.SplitNamed(c, 0, 0, label)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := g.(*hostsync.Comm); !ok {
			t.Fatalf("split %q: a %T, want a *hostsync.Comm", label, g)
		}
	}
	if g, err := c.Split(comm.NoColor, 0); err != nil || g != nil {
		t.Fatalf("split with comm.NoColor: %v, %v; want no group", g, err)
	}
}
