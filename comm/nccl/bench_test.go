package nccl

// Bus bandwidth of the collectives, nccl-tests style: size is the larger
// buffer in bytes (all-reduce: the buffer; all-gather: the output;
// reduce-scatter: the input; all-to-all: the send buffer), algbw = size /
// time, busbw = algbw · busFactor (2(n-1)/n for all-reduce, (n-1)/n for the
// others). bf16 data.
//
// Time is taken on the GPU, as bench/torch_nccl.py does for PyTorch: CUDA
// events recorded on the stream before the first and after the last of the
// timed ops (after warm-up ops and a synchronisation). Each benchmark
// reports it as us/op (and algGB/s, busGB/s); host-us/op is the host's time
// for the same loop, from before the first op is queued until the stream
// has drained, and ns/op is that loop only (the buffers, their zeroing, the
// warm-up and the freeing are outside the benchmark timer).

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

var (
	benchOps   = []string{comm.OpAllGather, comm.OpReduceScatter, comm.OpAllReduce, comm.OpAllToAllV}
	benchSizes = []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20}
)

func sizeName(b int) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

// benchCase is one op of one size on one rank, with its buffers.
type benchCase struct {
	op    string
	bytes int // nccl-tests' size: the larger buffer
	run   func(s *cuda.Stream) (comm.Work, error)
	mem   *rawMemory
	bufs  []*tensor.Tensor
}

// newBenchCase allocates the buffers of op with a larger buffer of about
// bytes (bf16 elements, rounded down to a multiple of the group size).
func newBenchCase(c *Comm, mem *rawMemory, op string, bytes int) (*benchCase, error) {
	p := c.Size()
	n := max(bytes/2/p*p, p) // elements of the larger buffer
	bc := &benchCase{op: op, bytes: 2 * n, mem: mem}
	var err error
	alloc := func(k int) *tensor.Tensor {
		t, aerr := mem.Alloc(tensor.BFloat16, k)
		if aerr != nil {
			err = aerr
			return nil
		}
		bc.bufs = append(bc.bufs, t)
		return t
	}
	switch op {
	case comm.OpAllReduce:
		buf := alloc(n)
		bc.run = func(s *cuda.Stream) (comm.Work, error) { return c.AllReduce(buf, comm.Sum, s) }
	case comm.OpAllGather:
		dst, src := alloc(n), alloc(n/p)
		bc.run = func(s *cuda.Stream) (comm.Work, error) { return c.AllGather(dst, src, s) }
	case comm.OpReduceScatter:
		dst, src := alloc(n/p), alloc(n)
		bc.run = func(s *cuda.Stream) (comm.Work, error) { return c.ReduceScatter(dst, src, comm.Sum, s) }
	case comm.OpAllToAllV:
		dst, src := alloc(n), alloc(n)
		counts := make([]int, p)
		for i := range counts {
			counts[i] = n / p
		}
		bc.run = func(s *cuda.Stream) (comm.Work, error) { return c.AllToAllV(dst, src, counts, counts, s) }
	default:
		return nil, fmt.Errorf("no benchmark for %s", op)
	}
	if err != nil {
		bc.free()
		return nil, err
	}
	return bc, nil
}

// free gives the buffers back (after the stream has drained).
func (bc *benchCase) free() { bc.mem.free(bc.bufs...) }

// timeIt queues warm ops on s and waits for them, then queues iters ops
// between two timing events and waits for the last. It returns the time per
// op on the GPU (between the events) and on the host (from before the first
// timed op is queued until the end event has completed). start and stop, if
// not nil, run just before the timed loop and just after it (the benchmark
// timer).
func (bc *benchCase) timeIt(dev int, s *cuda.Stream, warm, iters int, start, stop func()) (gpu, host time.Duration, err error) {
	err = cuda.OnDevice(dev, func(*cuda.Context) error {
		t0, err := cuda.NewEvent(true)
		if err != nil {
			return err
		}
		defer t0.Destroy()
		t1, err := cuda.NewEvent(true)
		if err != nil {
			return err
		}
		defer t1.Destroy()
		for range warm {
			if _, err := bc.run(s); err != nil {
				return err
			}
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		if start != nil {
			start()
		}
		began := time.Now()
		if err := t0.Record(s); err != nil {
			return err
		}
		for range iters {
			if _, err := bc.run(s); err != nil {
				return err
			}
		}
		if err := t1.Record(s); err != nil {
			return err
		}
		if err := t1.Synchronize(); err != nil {
			return err
		}
		host = time.Since(began)
		if stop != nil {
			stop()
		}
		gpu, err = cuda.Elapsed(t0, t1)
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return gpu / time.Duration(iters), host / time.Duration(iters), nil
}

// us is a duration in microseconds.
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// gbps is bytes per op time in GB/s (10⁹ bytes).
func gbps(bytes int, per time.Duration) float64 { return float64(bytes) / per.Seconds() / 1e9 }

func BenchmarkBusBandwidth(b *testing.B) {
	n := gpus(b)
	b.Run("ranks=1", func(b *testing.B) {
		c, err := New(context.Background(), nil, 0, 1, 0, WithTimeout(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		s, mem := newStream(b, 0), newRawMemory(b, 0, nil)
		for _, op := range benchOps {
			for _, size := range benchSizes {
				b.Run(op+"/"+sizeName(size), func(b *testing.B) {
					b.StopTimer() // until the timed loop
					bc, err := newBenchCase(c, mem, op, size)
					if err != nil {
						b.Fatal(err)
					}
					defer bc.free()
					per, host, err := bc.timeIt(0, s, 3, b.N, b.StartTimer, b.StopTimer)
					if err != nil {
						b.Fatal(err)
					}
					alg := gbps(bc.bytes, per)
					b.ReportMetric(us(per), "us/op")
					b.ReportMetric(us(host), "host-us/op")
					b.ReportMetric(alg, "algGB/s")
					b.ReportMetric(alg*busFactor(op, 1), "busGB/s")
				})
			}
		}
	})
	if n < 2 {
		b.Logf("NCCL needs one GPU per rank; this machine has %d: no multi-process benchmark", n)
		return
	}
	ranks := min(n, 8)
	b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
		rows := multiBench(b, ranks) // once, whatever b.N
		for _, r := range rows {
			if r.bytes == benchSizes[len(benchSizes)-1] {
				b.ReportMetric(r.busbw, r.op+"-"+sizeName(r.bytes)+"-busGB/s")
			}
		}
	})
}

// benchRow is one line of the multi-process table.
type benchRow struct {
	op           string
	bytes        int
	us           float64
	algbw, busbw float64
}

var multiBenchOnce struct {
	sync.Once
	rows []benchRow
}

// multiBench runs the sweep with one process per GPU, once per process, and
// prints rank 0's table.
func multiBench(b *testing.B, ranks int) []benchRow {
	multiBenchOnce.Do(func() {
		res := runChildren(b, "bench", ranks, 9*time.Minute)
		for _, c := range res {
			if c.Err != nil {
				b.Fatalf("rank %d: %v; its output:\n%s", c.Rank, c.Err, c.Out)
			}
		}
		sc := bufio.NewScanner(strings.NewReader(res[0].Out))
		for sc.Scan() {
			f := strings.Split(sc.Text(), "\t")
			if len(f) != 6 || f[0] != "BUSBW" {
				continue
			}
			var r benchRow
			r.op = f[1]
			r.bytes, _ = strconv.Atoi(f[2])
			r.us, _ = strconv.ParseFloat(f[3], 64)
			r.algbw, _ = strconv.ParseFloat(f[4], 64)
			r.busbw, _ = strconv.ParseFloat(f[5], 64)
			multiBenchOnce.rows = append(multiBenchOnce.rows, r)
		}
		fmt.Printf("\nNCCL bus bandwidth, %d ranks (one process per GPU), bf16, nccl-tests conventions (time: the slowest rank's GPU time per op, CUDA events around the loop)\n", ranks)
		fmt.Printf("%-16s %10s %12s %12s %12s\n", "op", "size", "time (us)", "algbw GB/s", "busbw GB/s")
		for _, r := range multiBenchOnce.rows {
			fmt.Printf("%-16s %10s %12.1f %12.2f %12.2f\n", r.op, sizeName(r.bytes), r.us, r.algbw, r.busbw)
		}
	})
	if len(multiBenchOnce.rows) == 0 {
		b.Fatal("the children reported no measurement")
	}
	return multiBenchOnce.rows
}

// benchChild is one rank of the multi-process sweep; rank 0 prints
// "BUSBW\top\tbytes\tus\talgbw\tbusbw" lines with the slowest rank's time.
func benchChild(t *testing.T, c *Comm) {
	dev := c.Device()
	s, mem := newStream(t, dev), newRawMemory(t, dev, nil)
	slowest, err := mem.Alloc(tensor.Float64, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range benchOps {
		for _, size := range benchSizes {
			bc, err := newBenchCase(c, mem, op, size)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Barrier(); err != nil {
				t.Fatal(err)
			}
			iters := min(max((1<<30)/size, 10), 500)
			per, _, err := bc.timeIt(dev, s, 5, iters, nil, nil)
			bc.free()
			if err != nil {
				t.Fatalf("%s %s: %v", op, sizeName(size), err)
			}
			// The slowest rank's time, as nccl-tests reports it.
			h := tensor.MustHost(tensor.Float64, 1)
			h.F64()[0] = per.Seconds()
			if err := mem.Upload(slowest, h); err != nil {
				t.Fatal(err)
			}
			w, err := c.AllReduce(slowest, comm.Max, nil)
			if err == nil {
				err = w.Wait(nil)
			}
			if err == nil {
				err = mem.Download(h, slowest)
			}
			if err != nil {
				t.Fatal(err)
			}
			per = time.Duration(h.F64()[0] * float64(time.Second))
			alg := gbps(bc.bytes, per)
			if c.Rank() == 0 {
				fmt.Printf("BUSBW\t%s\t%d\t%.1f\t%.3f\t%.3f\n", op, bc.bytes, float64(per)/float64(time.Microsecond), alg, alg*busFactor(op, c.Size()))
			}
		}
	}
}
