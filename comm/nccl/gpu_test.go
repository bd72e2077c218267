package nccl

// Tests on a GPU, in this process: a world of one rank. They skip, saying
// why, without libnccl.so.2 or a GPU.

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

func TestMain(m *testing.M) {
	// NVLink multicast (NVLS) stays off on the shared GPU machines; the
	// children of the multi-process tests inherit it.
	if os.Getenv("NCCL_NVLS_ENABLE") == "" {
		os.Setenv("NCCL_NVLS_ENABLE", "0")
	}
	os.Exit(m.Run())
}

// gpus returns the number of GPUs, or skips when NCCL or a GPU is missing.
func gpus(tb testing.TB) int {
	tb.Helper()
	if _, err := Load(); err != nil {
		tb.Skipf("no NCCL: %v", err)
	}
	if err := cuda.Init(); err != nil {
		tb.Skipf("no GPU: %v", err)
	}
	n, err := cuda.DeviceCount()
	if err != nil || n == 0 {
		tb.Skipf("no GPU: %d devices, %v", n, err)
	}
	return n
}

// newStream makes a stream on dev, destroyed at the end of the test.
func newStream(tb testing.TB, dev int) *cuda.Stream {
	tb.Helper()
	var s *cuda.Stream
	err := cuda.OnDevice(dev, func(*cuda.Context) (err error) { s, err = cuda.NewStream(); return err })
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cuda.OnDevice(dev, func(*cuda.Context) error { s.Synchronize(); return s.Destroy() }) })
	return s
}

func TestWorldOfOne(t *testing.T) {
	gpus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := New(ctx, nil, 0, 1, 0, WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v; %s on cuda:%d", c.Library(), c.Name(), c.Device())
	if c.Name() != "world[0]" || c.Rank() != 0 || c.Size() != 1 {
		t.Errorf("name %q, rank %d, size %d", c.Name(), c.Rank(), c.Size())
	}
	t.Run("own-stream", func(t *testing.T) {
		commtest.RunRank(t, c, commtest.WithMemory(suiteMemory(t, 0, nil)))
	})
	t.Run("caller-stream", func(t *testing.T) {
		s := newStream(t, 0)
		commtest.RunRank(t, c, commtest.WithMemory(suiteMemory(t, 0, s)), commtest.WithStream(s))
	})
	t.Run("cross-stream", func(t *testing.T) { streamCases(t, c) })
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	buf, _ := newRawMemory(t, 0, nil).Alloc(tensor.Float32, 4)
	if _, err := c.AllReduce(buf, comm.Sum, nil); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("all-reduce after Close: %v, want comm.ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// TestAbortOfOne: Abort fails pending and later ops of every group of the
// world with an error naming the rank and wrapping the cause.
func TestAbortOfOne(t *testing.T) {
	gpus(t)
	c, err := New(context.Background(), nil, 0, 1, 0, WithTimeout(time.Minute), WithLabel("tp"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.SplitNamed(0, 0, "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if sub.Name() != "dp[0]" {
		t.Errorf("split name %q, want dp[0]", sub.Name())
	}
	boom := errors.New("boom")
	c.Abort(boom)
	buf, _ := newRawMemory(t, 0, nil).Alloc(tensor.Float32, 4)
	for _, g := range []comm.Comm{c, sub} {
		_, err := g.AllReduce(buf, comm.Sum, nil)
		var e *comm.Error
		if !errors.Is(err, boom) || !errors.Is(err, comm.ErrAborted) || !errors.As(err, &e) || e.Group != g.Name() ||
			!strings.Contains(err.Error(), "world rank 0 aborted") {
			t.Errorf("%s: %v: want a *comm.Error naming world rank 0 that wraps boom and comm.ErrAborted", g.Name(), err)
		}
	}
	if err := c.Barrier(); !errors.Is(err, boom) {
		t.Errorf("barrier after abort: %v", err)
	}
}

// streamCases: ops queued on one stream, waited for by another stream that
// then copies the results back; every rank checks its own results from
// inputs it can compute for every rank.
func streamCases(t *testing.T, c *Comm) {
	p, me, dev := c.Size(), c.Rank(), c.Device()
	ops, reader := newStream(t, dev), newStream(t, dev)
	mem := newRawMemory(t, dev, nil)
	val := func(r, i int) float32 { return float32((r+1)*(i%7+1)) / 4 }
	upload := func(f func(i int) float32, shape ...int) *tensor.Tensor {
		h := tensor.MustHost(tensor.Float32, shape...)
		for i := range h.F32() {
			h.F32()[i] = f(i)
		}
		d, err := mem.Alloc(tensor.Float32, shape...)
		if err == nil {
			err = mem.Upload(d, h)
		}
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// read waits for w on the reader stream and copies d back on it.
	read := func(what string, w comm.Work, err error, d *tensor.Tensor) []float32 {
		t.Helper()
		if err == nil {
			err = w.Wait(reader)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		h := tensor.MustHost(tensor.Float32, d.Shape()...)
		ptr, _ := devAddr(d)
		hp, n := hostData(h)
		err = cuda.OnDevice(dev, func(*cuda.Context) error {
			if err := cuda.CopyDtoHAsync(hp, ptr, n, reader); err != nil {
				return err
			}
			return reader.Synchronize()
		})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return h.F32()
	}
	check := func(what string, got []float32, want func(i int) float32) {
		t.Helper()
		for i, g := range got {
			if w := want(i); g != w {
				t.Errorf("%s: element %d = %v, want %v", what, i, g, w)
				return
			}
		}
	}
	const n = 840 << 10 // 3.4 MB, long enough to be in flight when Wait is called; 840 = lcm(1..8)
	x := upload(func(i int) float32 { return val(me, i) }, n)
	w, err := c.AllReduce(x, comm.Sum, ops)
	check("all-reduce", read("all-reduce", w, err, x), func(i int) float32 {
		var s float32
		for r := range p {
			s += val(r, i)
		}
		return s
	})

	src := upload(func(i int) float32 { return val(me, i) }, n/p)
	dst := upload(func(int) float32 { return -1 }, n)
	w, err = c.AllGather(dst, src, ops)
	check("all-gather", read("all-gather", w, err, dst), func(i int) float32 { return val(i/(n/p), i%(n/p)) })

	full := upload(func(i int) float32 { return val(me, i) }, n)
	part := upload(func(int) float32 { return -1 }, n/p)
	w, err = c.ReduceScatter(part, full, comm.Max, ops)
	check("reduce-scatter", read("reduce-scatter", w, err, part), func(i int) float32 { return val(p-1, me*(n/p)+i) })

	// all-to-all: rank me sends (j+1) rows of 4 to rank j, row k = 1000·me + 10·j + k.
	var send, recv []int
	for j := range p {
		send, recv = append(send, j+1), append(recv, me+1)
	}
	rows := p * (p + 1) / 2
	a2a := upload(func(i int) float32 {
		row, j := i/4, 0
		for row >= j+1 {
			row -= j + 1
			j++
		}
		return float32(1000*me + 10*j + row)
	}, rows, 4)
	out := upload(func(int) float32 { return -1 }, p*(me+1), 4)
	w, err = c.AllToAllV(out, a2a, send, recv, ops)
	check("all-to-all-v", read("all-to-all-v", w, err, out), func(i int) float32 {
		row := i / 4
		return float32(1000*(row/(me+1)) + 10*me + row%(me+1))
	})

	b := upload(func(i int) float32 { return val(me, i) }, 1000)
	w, err = c.Broadcast(b, p-1, ops)
	check("broadcast", read("broadcast", w, err, b), func(i int) float32 { return val(p-1, i) })
}
