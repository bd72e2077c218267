package nccl

// The checks an op makes before it calls NCCL, on a Comm with no NCCL
// behind it (they must fail before any C call).

import (
	"errors"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

// fakeBuffer is device memory that does not exist: enough for the checks.
type fakeBuffer struct {
	dev  int
	dt   tensor.DType
	n    int
	addr uint64
}

func (b *fakeBuffer) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA, Index: b.dev} }
func (b *fakeBuffer) DType() tensor.DType   { return b.dt }
func (b *fakeBuffer) Len() int              { return b.n }
func (b *fakeBuffer) Ptr() uint64           { return b.addr }

// otherBuffer is on a GPU but has no Ptr.
type otherBuffer struct{ fakeBuffer }

func (b *otherBuffer) Ptr() {}

func fakeTensor(t *testing.T, dev int, dt tensor.DType, addr uint64, shape ...int) *tensor.Tensor {
	t.Helper()
	n := tensor.Shape(shape).Numel()
	x, err := tensor.New(&fakeBuffer{dev: dev, dt: dt, n: n, addr: addr}, 0, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func fakeComm(rank, size int) *Comm {
	w := newWorld(Library{}, 0, nil, rank, size, defaultOptions())
	c := &Comm{w: w, rank: rank, size: size, label: "world", name: comm.GroupName("world", seqRanks(size)), members: seqRanks(size)}
	c.h.Store(1) // never called: the checks fail first
	return c
}

func TestOpChecks(t *testing.T) {
	c := fakeComm(1, 2)
	host := tensor.MustHost(tensor.Float32, 4, 3)
	dev := func(addr uint64, shape ...int) *tensor.Tensor {
		return fakeTensor(t, 0, tensor.Float32, addr, shape...)
	}
	gpu1 := fakeTensor(t, 1, tensor.Float32, 0x1000, 4, 3)
	dead := fakeTensor(t, 0, tensor.Float32, 0, 4, 3)
	nop, _ := tensor.New(&otherBuffer{fakeBuffer{dt: tensor.Float32, n: 12}}, 0, 4, 3)
	big := dev(0x10000, 4, 3)  // 48 bytes at 0x10000
	part0, _ := big.Rows(0, 2) // rank 0's part
	mid, _ := big.Rows(1, 3)   // overlapping, not in place
	tcs := []struct {
		name, op, want string
		call           func() (comm.Work, error)
	}{
		{"host tensor", comm.OpAllReduce, "is on cpu: expected a tensor on cuda:0",
			func() (comm.Work, error) { return c.AllReduce(host, comm.Sum, nil) }},
		{"other GPU", comm.OpAllReduce, "is on cuda:1: expected a tensor on cuda:0",
			func() (comm.Work, error) { return c.AllReduce(gpu1, comm.Sum, nil) }},
		{"no memory", comm.OpBroadcast, "expected device memory, found none",
			func() (comm.Work, error) { return c.Broadcast(dead, 0, nil) }},
		{"no Ptr", comm.OpAllReduce, "expected device memory whose buffer has Ptr()",
			func() (comm.Work, error) { return c.AllReduce(nop, comm.Sum, nil) }},
		{"stream type", comm.OpAllReduce, "stream string: expected a *cuda.Stream",
			func() (comm.Work, error) { return c.AllReduce(big, comm.Sum, "stream 7") }},
		{"check first", comm.OpAllGather, "expected shape",
			func() (comm.Work, error) { return c.AllGather(dev(0x20000, 3, 3), dev(0x30000, 2, 3), nil) }},
		{"all-gather overlap", comm.OpAllGather, "overlaps dst",
			func() (comm.Work, error) { return c.AllGather(big, part0, nil) }},
		{"all-gather mid overlap", comm.OpAllGather, "overlaps dst",
			func() (comm.Work, error) { return c.AllGather(big, mid, nil) }},
		{"reduce-scatter overlap", comm.OpReduceScatter, "overlaps src",
			func() (comm.Work, error) { return c.ReduceScatter(part0, big, comm.Sum, nil) }},
		{"all-to-all overlap", comm.OpAllToAllV, "expected disjoint buffers",
			func() (comm.Work, error) { return c.AllToAllV(big, mid, []int{1, 1}, []int{2, 2}, nil) }},
	}
	for _, tc := range tcs {
		w, err := tc.call()
		var e *comm.Error
		switch {
		case err == nil:
			t.Errorf("%s: no error (work %v)", tc.name, w)
		case w != nil:
			t.Errorf("%s: a non-nil Work with the error %v", tc.name, err)
		case !errors.As(err, &e) || e.Op != tc.op || e.Rank != 1 || e.Group != "world[0 1]":
			t.Errorf("%s: %v: expected a *comm.Error for %s on world[0 1], rank 1", tc.name, err, tc.op)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %v: want it to contain %q", tc.name, err, tc.want)
		}
	}
	// Zero-sized ops move nothing and need no NCCL call.
	empty := dev(0x40000, 0, 3)
	if w, err := c.AllReduce(empty, comm.Sum, nil); err != nil || w != comm.Done {
		t.Errorf("empty all-reduce: %v, %v", w, err)
	}
	if w, err := c.AllToAllV(dev(0x50000, 0, 3), dev(0x60000, 0, 3), []int{0, 0}, []int{0, 0}, nil); err != nil || w != comm.Done {
		t.Errorf("empty all-to-all-v: %v, %v", w, err)
	}
	// In place is fine; it would go to NCCL, which this Comm does not have,
	// so only the stream resolution is checked here.
	if st, err := c.streamOf(comm.OpAllGather, (*cuda.Stream)(nil)); err != nil || st != nil {
		t.Errorf("a nil *cuda.Stream: %v, %v (want the legacy default stream)", st, err)
	}
}

func TestSplitChecks(t *testing.T) {
	c := fakeComm(0, 2)
	for _, tc := range []struct {
		color, key int
		want       string
	}{{-2, 0, "color -2: expected 0 ≤ color"}, {1 << 40, 0, "expected 0 ≤ color"}, {0, 1 << 40, "expected a 32-bit integer"}} {
		_, err := c.Split(tc.color, tc.key)
		var e *comm.Error
		if !errors.As(err, &e) || e.Op != comm.OpSplit || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Split(%d, %d): %v, want a *comm.Error containing %q", tc.color, tc.key, err, tc.want)
		}
	}
}

func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		a, na, b, nb uintptr
		want         bool
	}{{0, 10, 10, 10, false}, {0, 10, 9, 10, true}, {5, 1, 0, 10, true}, {0, 0, 0, 10, false}, {20, 5, 0, 20, false}} {
		if got := overlaps(tc.a, tc.na, tc.b, tc.nb); got != tc.want {
			t.Errorf("overlaps(%d, %d, %d, %d) = %v", tc.a, tc.na, tc.b, tc.nb, got)
		}
	}
}
