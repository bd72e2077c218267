package nvshmem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/tensor"
)

// childMissing: rank 1 does not join rank 0's all-reduce (see
// TestMissingRank).
func childMissing(t *testing.T) {
	const timeout = 2 * time.Second
	ch := newChild(t, WithTimeout(timeout))
	buf, err := ch.mem.Alloc(tensor.Float32, 8)
	if err != nil {
		t.Fatal(err)
	}
	if ch.rank == 0 {
		start := time.Now()
		wk, err := ch.world.AllReduce(buf, comm.Sum, nil)
		if err == nil {
			err = wk.Wait(nil)
		}
		took := time.Since(start)
		t.Logf("rank 0: after %v: %v", took.Round(time.Millisecond), err)
		var ce *comm.Error
		switch {
		case !errors.Is(err, comm.ErrTimeout) || !errors.As(err, &ce):
			t.Errorf("rank 0: got %v, want a *comm.Error wrapping comm.ErrTimeout", err)
		case !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), comm.OpAllReduce):
			t.Errorf("rank 0: %v: want the error to name rank 1 and the op", err)
		case took > 2*timeout+2*time.Second:
			t.Errorf("rank 0: failed after %v, want within about %v", took, timeout)
		}
		start = time.Now()
		if _, err := ch.world.AllReduce(buf, comm.Sum, nil); err == nil || time.Since(start) > time.Second {
			t.Errorf("rank 0: the op after the failure: %v after %v, want an error at once", err, time.Since(start))
		}
	} else {
		time.Sleep(2*timeout + time.Second) // never joins
	}
	// Rank 0's Close returns the failure without finalising; rank 1's
	// finalize waits for rank 0 until its deadline. Neither is an error here.
	err = ch.world.Close()
	t.Logf("rank %d: close: %v", ch.rank, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ch.store.Barrier(ctx, "done", ch.size); err != nil {
		t.Errorf("rank %d: %v", ch.rank, err)
	}
	ch.closeStore()
}

// childConformance: commtest's suite, on plain device memory.
func childConformance(t *testing.T) {
	ch := newChild(t)
	defer ch.close(t)
	start := time.Now()
	commtest.RunRank(t, ch.world, commtest.WithMemory(ch.mem))
	t.Logf("rank %d: the suite took %v", ch.rank, time.Since(start).Round(time.Millisecond))
}

func symPtr(t *testing.T, x *tensor.Tensor) uint64 {
	t.Helper()
	b, ok := x.Buffer().(*SymmetricBuffer)
	if !ok {
		t.Fatalf("%v is not symmetric", x)
	}
	return b.Ptr() + uint64(x.Offset()*x.DType().Size())
}

func (ch *child) sym(t *testing.T, dt tensor.DType, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := ch.world.AllocSymmetric(shape, dt)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func (ch *child) upload(t *testing.T, x *tensor.Tensor, vals []float64) {
	t.Helper()
	h := tensor.MustHost(x.DType(), x.Shape()...)
	if err := h.SetFloat64s(vals); err != nil {
		t.Fatal(err)
	}
	if err := ch.mem.Upload(x, h); err != nil {
		t.Fatal(err)
	}
}

func (ch *child) download(t *testing.T, x *tensor.Tensor) []float64 {
	t.Helper()
	h := tensor.MustHost(x.DType(), x.Shape()...)
	if err := ch.mem.Download(h, x); err != nil {
		t.Fatal(err)
	}
	v, _ := h.Float64s()
	return v
}

// childSmoke: each PE puts n ints into its neighbour's symmetric buffer and
// sets the neighbour's signal word; a second kernel waits for the signal
// from the other side and counts the wrong ints. Two rounds.
func childSmoke(t *testing.T) {
	ch := newChild(t)
	defer ch.close(t)
	w := ch.world
	const n = 4096
	buf := ch.sym(t, tensor.Int32, n)
	src := ch.sym(t, tensor.Int32, n)
	sig := ch.sym(t, tensor.Float64, 1) // 8 bytes: a uint64 signal word
	bad, err := ch.mem.Alloc(tensor.Int32, 1)
	if err != nil {
		t.Fatal(err)
	}
	peer, from := (ch.rank+1)%ch.size, (ch.rank+ch.size-1)%ch.size
	t.Logf("rank %d: P2P address of rank %d's buffer: %#x", ch.rank, peer, buf.Buffer().(*SymmetricBuffer).PeerPtr(peer))
	for round := 1; round <= 2; round++ {
		value, expect := 10*round+ch.rank+1, 10*round+from+1
		st := uint64(w.Stream())
		if err := cSmokePut(symPtr(t, buf), symPtr(t, src), symPtr(t, sig), n, value, peer, uint64(round), st); err != nil {
			t.Fatal(err)
		}
		if err := cSmokeWait(symPtr(t, buf), symPtr(t, sig), n, expect, uint64(round), bad.Buffer().(*DeviceBuffer).Ptr(), st); err != nil {
			t.Fatal(err)
		}
		if err := w.drain("smoke"); err != nil {
			t.Fatal(err)
		}
		if got := ch.download(t, bad); got[0] != 0 {
			t.Errorf("rank %d, round %d: the wait kernel counted %v wrong ints from rank %d", ch.rank, round, got[0], from)
		}
		got := ch.download(t, buf)
		for i, v := range got {
			if int(v) != expect*1000+i {
				t.Fatalf("rank %d, round %d: buf[%d] = %v, want %d (from rank %d)", ch.rank, round, i, v, expect*1000+i, from)
			}
		}
		if err := w.Barrier(); err != nil { // before the next round overwrites buf
			t.Fatal(err)
		}
	}
	for _, x := range []*tensor.Tensor{buf, src, sig} {
		if err := w.FreeSymmetric(x); err != nil {
			t.Error(err)
		}
	}
}

// input is rank q's value i of a case: small integers, exact in bf16 sums.
func input(name string, q, i int) float64 {
	h := 0
	for _, c := range name {
		h = h*31 + int(c)
	}
	return float64((h+7*q+3*i)%41 - 20)
}

func inputs(name string, q, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = input(name, q, i)
	}
	return v
}

// childSymmetric: the collectives on symmetric tensors, on the world and on
// the TP and DP groups of a grid.
func childSymmetric(t *testing.T) {
	ch := newChild(t)
	defer ch.close(t)
	groups := []comm.Comm{ch.world}
	if ch.size%2 == 0 {
		g, err := comm.NewGrid(ch.world, ch.size/2, 2, ch.size)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		groups = append(groups, g.TPGroup, g.EPGroup)
		for _, c := range []comm.Comm{g.TPGroup, g.EPGroup} {
			t.Logf("rank %d: %s runs on %s", ch.rank, c.Name(), c.(*Comm).Path())
		}
	}
	for _, c := range groups {
		ch.symmetricCases(t, c)
	}
}

func (ch *child) symmetricCases(t *testing.T, c comm.Comm) {
	p, me := c.Size(), c.Rank()
	wait := func(what string, wk comm.Work, err error) {
		t.Helper()
		if err == nil {
			err = wk.Wait(nil)
		}
		if err != nil {
			t.Fatalf("%s on %s: %v", what, c.Name(), err)
		}
	}
	expect := func(what string, got, want []float64) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s on %s, rank %d: got %v, want %v", what, c.Name(), me, head(got), head(want))
		}
	}
	const rows, cols = 3, 5
	n := rows * cols
	// Every rank allocates the same tensors in the same order: they are
	// world-collective, so all groups of the loop allocate them together.
	src := ch.sym(t, tensor.Float32, rows, cols)
	dst := ch.sym(t, tensor.Float32, ch.size*rows, cols)
	all := ch.sym(t, tensor.BFloat16, ch.size*rows, cols)
	part := ch.sym(t, tensor.BFloat16, rows, cols)
	a2a := ch.sym(t, tensor.Float32, ch.size*rows, cols)
	defer func() {
		for _, x := range []*tensor.Tensor{src, dst, all, part, a2a} {
			if err := ch.world.FreeSymmetric(x); err != nil {
				t.Error(err)
			}
		}
	}()
	gdst, err := dst.Rows(0, p*rows)
	if err != nil {
		t.Fatal(err)
	}
	gall, _ := all.Rows(0, p*rows)

	ch.upload(t, src, inputs("ag", me, n))
	wk, err := c.AllGather(gdst, src, nil)
	wait("all-gather", wk, err)
	var want []float64
	for q := range p {
		want = append(want, inputs("ag", q, n)...)
	}
	expect("symmetric all-gather", ch.download(t, gdst), want)

	ch.upload(t, gall, inputs("rs", me, p*n))
	wk, err = c.ReduceScatter(part, gall, comm.Sum, nil)
	wait("reduce-scatter", wk, err)
	want = make([]float64, n)
	for q := range p {
		for i, v := range inputs("rs", q, p*n)[me*n : (me+1)*n] {
			want[i] += v
		}
	}
	expect("symmetric reduce-scatter(sum) bf16", ch.download(t, part), want)

	ch.upload(t, src, inputs("ar", me, n))
	wk, err = c.AllReduce(src, comm.Max, nil)
	wait("all-reduce", wk, err)
	for i := range want {
		want[i] = input("ar", 0, i)
		for q := 1; q < p; q++ {
			want[i] = max(want[i], input("ar", q, i))
		}
	}
	expect("symmetric all-reduce(max)", ch.download(t, src), want)

	ch.upload(t, src, inputs("bc", me, n))
	wk, err = c.Broadcast(src, p-1, nil)
	wait("broadcast", wk, err)
	expect("symmetric broadcast", ch.download(t, src), inputs("bc", p-1, n))

	// All-to-all-v: rank i sends (i+j)%rows+1 rows of cols to rank j, from
	// a view of dst into a view of a2a (symmetric allocations have the same
	// size everywhere; the counts differ between ranks).
	var send, recv []int
	for q := range p {
		send = append(send, (me+q)%rows+1)
		recv = append(recv, (q+me)%rows+1)
	}
	sumOf := func(v []int) (s int) {
		for _, x := range v {
			s += x
		}
		return s
	}
	a2aSrc, _ := dst.Rows(0, sumOf(send))
	a2aDst, _ := a2a.Rows(0, sumOf(recv))
	ch.upload(t, a2aSrc, inputs("a2a", me, sumOf(send)*cols))
	wk, err = c.AllToAllV(a2aDst, a2aSrc, send, recv, nil)
	wait("all-to-all-v", wk, err)
	want = want[:0]
	for q := range p {
		off := 0
		for j := range me {
			off += (q+j)%rows + 1
		}
		in := inputs("a2a", q, p*rows*cols)
		want = append(want, in[off*cols:(off+recv[q])*cols]...)
	}
	expect("symmetric all-to-all-v", ch.download(t, a2aDst), want)
}

func head(v []float64) []float64 {
	if len(v) > 12 {
		return v[:12]
	}
	return v
}

// childBench times all-gather, reduce-scatter and all-to-all on plain device
// memory (so through the staging) from 4 KiB to 256 MiB of the whole
// buffer (all-gather's output, reduce-scatter's input, all-to-all's input);
// rank 0 prints one BENCH line per op and size.
func childBench(t *testing.T) {
	ch := newChild(t)
	defer ch.close(t)
	w, p := ch.world, ch.size
	sizes := []int64{4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20}
	for _, op := range []string{"all-gather", "reduce-scatter", "all-to-all"} {
		for _, size := range sizes {
			rows := int(size / 256 / int64(p)) // rows of 64 f32 per rank part
			a, err := ch.mem.Alloc(tensor.Float32, p*rows, 64)
			if err != nil {
				t.Fatal(err)
			}
			bshape := []int{rows, 64}
			if op == "all-to-all" {
				bshape = []int{p * rows, 64}
			}
			b, err := ch.mem.Alloc(tensor.Float32, bshape...)
			if err != nil {
				t.Fatal(err)
			}
			counts := make([]int, p)
			for i := range counts {
				counts[i] = rows
			}
			run := func() (comm.Work, error) {
				switch op {
				case "all-gather":
					return w.AllGather(a, b, nil)
				case "reduce-scatter":
					return w.ReduceScatter(b, a, comm.Sum, nil)
				}
				return w.AllToAllV(b, a, counts, counts, nil)
			}
			iters := min(20, max(3, int((1<<30)/size)))
			var last comm.Work
			for range 2 { // warm-up
				if last, err = run(); err != nil {
					t.Fatal(err)
				}
			}
			if err := last.Wait(nil); err != nil {
				t.Fatal(err)
			}
			if err := w.Barrier(); err != nil { // everyone starts together
				t.Fatal(err)
			}
			start := time.Now()
			for range iters {
				if last, err = run(); err != nil {
					t.Fatal(err)
				}
			}
			if err := last.Wait(nil); err != nil {
				t.Fatal(err)
			}
			per := time.Since(start) / time.Duration(iters)
			busbw := float64(size) * float64(p-1) / float64(p) / per.Seconds() / 1e9
			if ch.rank == 0 {
				fmt.Printf("BENCH op=%s bytes=%d pes=%d path=%q us=%.1f busbw_GBps=%.2f\n", op, size, p, w.Path(), float64(per.Microseconds()), busbw)
			}
			a.Buffer().(*DeviceBuffer).Free()
			b.Buffer().(*DeviceBuffer).Free()
		}
	}
}

// BenchmarkCollectives times all-gather, reduce-scatter and all-to-all
// between 2 PEs (on one GPU when the machine has one: then the figures share
// one GPU's memory system and SMs, time-sliced between the two processes,
// and show the mechanics, not NVLink speed), from 4 KiB to 256 MiB, through
// the staging (WithStaging 64 MiB). Run it once: -test.benchtime 1x.
func BenchmarkCollectives(b *testing.B) {
	outs := runChildren(b, needGPU(b), "bench", 2, "auto", 10*time.Minute, stagingEnv+"="+strconv.Itoa(64<<20))
	if b.Failed() || len(outs) == 0 {
		return
	}
	lines := outputLines(outs[0], "BENCH ")
	var table strings.Builder
	fmt.Fprintf(&table, "%-15s %12s %12s %12s\n", "op", "bytes", "time µs", "busbw GB/s")
	for _, l := range lines {
		f := map[string]string{}
		for kv := range strings.FieldsSeq(l) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		fmt.Fprintf(&table, "%-15s %12s %12s %12s\n", f["op"], f["bytes"], f["us"], f["busbw_GBps"])
		if f["bytes"] == strconv.Itoa(256<<20) {
			if v, err := strconv.ParseFloat(f["busbw_GBps"], 64); err == nil {
				b.ReportMetric(v, f["op"]+"-256MiB-busbw-GB/s")
			}
		}
	}
	b.Logf("2 PEs, %d lines:\n%s", len(lines), table.String())
	for b.Loop() {
	}
}
