package local_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
)

func world(opts ...local.Option) func(t *testing.T, n int) []comm.Comm {
	return func(t *testing.T, n int) []comm.Comm { return local.NewWorld(n, opts...) }
}

func TestConformance(t *testing.T) {
	commtest.Run(t, world(local.WithTimeout(20*time.Second)),
		commtest.Mismatch(),
		commtest.MissingRank(world(local.WithTimeout(300*time.Millisecond)), 300*time.Millisecond))
}

func TestConformanceAsync(t *testing.T) {
	sizes := []int{1, 2, 3, 4, 8}
	if testing.Short() {
		sizes = []int{3}
	}
	commtest.Run(t, world(local.Async(), local.WithTimeout(20*time.Second)), commtest.Sizes(sizes...), commtest.Mismatch(),
		commtest.MissingRank(world(local.Async(), local.WithTimeout(300*time.Millisecond)), 300*time.Millisecond))
}

// TestDeterministic: the same all-reduce twice gives bit-identical results on
// every rank.
func TestDeterministic(t *testing.T) {
	const n, size = 5, 1000
	run := func() [][]float32 {
		out := make([][]float32, n)
		err := local.Run(n, func(c comm.Comm) error {
			buf := tensor.MustHost(tensor.Float32, size)
			for i := range buf.F32() {
				buf.F32()[i] = float32(i%7-3)*0.1 + float32(c.Rank())*1e-3
			}
			if _, err := c.AllReduce(buf, comm.Sum, nil); err != nil {
				return err
			}
			out[c.Rank()] = buf.F32()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a, b := run(), run()
	for r := range n {
		for i := range size {
			if a[r][i] != a[0][i] || b[r][i] != a[0][i] {
				t.Fatalf("rank %d element %d: %v and %v, rank 0 %v", r, i, a[r][i], b[r][i], a[0][i])
			}
		}
	}
}

func TestInt32Reductions(t *testing.T) {
	err := local.Run(3, func(c comm.Comm) error {
		buf, _ := tensor.FromInt32([]int32{int32(c.Rank()), -int32(c.Rank())}, 2)
		if _, err := c.AllReduce(buf, comm.Sum, nil); err != nil {
			return err
		}
		if got := buf.I32(); got[0] != 3 || got[1] != -3 {
			t.Errorf("rank %d: sum %v, want [3 -3]", c.Rank(), got)
		}
		buf, _ = tensor.FromInt32([]int32{int32(c.Rank()), -int32(c.Rank())}, 2)
		if _, err := c.AllReduce(buf, comm.Max, nil); err != nil {
			return err
		}
		if got := buf.I32(); got[0] != 2 || got[1] != 0 {
			t.Errorf("rank %d: max %v, want [2 0]", c.Rank(), got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestErrorMessages pins the wording of the errors that tell a user what
// went wrong.
func TestErrorMessages(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		ranks := local.NewWorld(2, local.WithTimeout(50*time.Millisecond))
		tp, errs := split(t, ranks, "tp")
		_ = errs
		_, err := tp[0].AllReduce(tensor.MustHost(tensor.Float32, 2), comm.Sum, nil)
		want := "local: all-reduce on tp[0 1], rank 0: call #0: rank 1 did not arrive within 50ms (comm: deadline exceeded)"
		if err == nil || err.Error() != want {
			t.Errorf("got  %v\nwant %s", err, want)
		}
		// The world is poisoned: the late rank fails at once, naming the cause.
		_, err = ranks[1].AllReduce(tensor.MustHost(tensor.Float32, 2), comm.Sum, nil)
		if !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "rank 1 did not arrive") {
			t.Errorf("late rank: %v", err)
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		ranks := local.NewWorld(2, local.WithTimeout(5*time.Second))
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, c := range ranks {
			wg.Go(func() {
				if r == 0 {
					_, errs[r] = c.AllReduce(tensor.MustHost(tensor.Float32, 4), comm.Sum, nil)
				} else {
					_, errs[r] = c.AllGather(tensor.MustHost(tensor.BFloat16, 4), tensor.MustHost(tensor.BFloat16, 2), nil)
				}
			})
		}
		wg.Wait()
		for r, err := range errs {
			msg := err.Error()
			if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(msg, "all-reduce(sum) of f32(4)") || !strings.Contains(msg, "all-gather of bf16(2)") {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	})
	t.Run("shape", func(t *testing.T) {
		c := local.NewWorld(1)[0]
		_, err := c.AllGather(tensor.MustHost(tensor.Float32, 3, 2), tensor.MustHost(tensor.Float32, 2, 2), nil)
		want := "local: all-gather on world[0], rank 0: dst f32(3, 2)@cpu: expected shape (2, 2) (1 ranks × src (2, 2))"
		if err == nil || err.Error() != want {
			t.Errorf("got  %v\nwant %s", err, want)
		}
	})
	t.Run("peer failed its checks", func(t *testing.T) {
		ranks := local.NewWorld(2, local.WithTimeout(5*time.Second))
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r, c := range ranks {
			wg.Go(func() {
				counts := []int{1, 1}
				if r == 1 {
					counts = []int{1, 2} // does not sum to the 2 rows of src
				}
				_, errs[r] = c.AllToAllV(tensor.MustHost(tensor.Float32, 2, 3), tensor.MustHost(tensor.Float32, 2, 3), counts, []int{1, 1}, nil)
			})
		}
		wg.Wait()
		if !strings.Contains(errs[0].Error(), "rank 1 failed: all-to-all-v on world[0 1], rank 1: sendCounts [1 2] sum to 3 rows") {
			t.Errorf("rank 0: %v", errs[0])
		}
		if !strings.Contains(errs[1].Error(), "sendCounts [1 2] sum to 3 rows: expected the 2 rows") {
			t.Errorf("rank 1: %v", errs[1])
		}
	})
}

// split splits ranks into one group labelled label, from one goroutine per
// rank.
func split(t *testing.T, ranks []comm.Comm, label string) ([]comm.Comm, []error) {
	out, errs := make([]comm.Comm, len(ranks)), make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, c := range ranks {
		wg.Go(func() { out[r], errs[r] = comm.SplitNamed(c, 0, r, label) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out, errs
}

func TestClosedPeer(t *testing.T) {
	ranks := local.NewWorld(3, local.WithTimeout(10*time.Second))
	done := make(chan error)
	go func() {
		_, err := ranks[0].AllReduce(tensor.MustHost(tensor.Float32, 1), comm.Sum, nil)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	ranks[2].Close()
	start := time.Now()
	err := <-done
	if !errors.Is(err, comm.ErrClosed) || !strings.Contains(err.Error(), "rank 2 closed world[0 1 2]") {
		t.Errorf("waiting rank: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	if _, err := ranks[2].AllReduce(tensor.MustHost(tensor.Float32, 1), comm.Sum, nil); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("closed rank: %v", err)
	}
}

func TestRunReportsFailures(t *testing.T) {
	boom := errors.New("boom")
	start := time.Now()
	err := local.Run(3, func(c comm.Comm) error {
		if c.Rank() == 1 {
			return boom
		}
		return c.Barrier()
	}, local.WithTimeout(10*time.Second))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "world rank 1 aborted: boom") {
		t.Errorf("got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v: the abort should wake the others", time.Since(start))
	}
	err = local.Run(2, func(c comm.Comm) error {
		if c.Rank() == 0 {
			panic("oops")
		}
		return c.Barrier()
	}, local.WithTimeout(10*time.Second))
	if err == nil || !strings.Contains(err.Error(), "rank 0 panicked: oops") {
		t.Errorf("got %v", err)
	}
}

func TestNotHost(t *testing.T) {
	c := local.NewWorld(1)[0]
	dev, _ := tensor.New(fakeBuf{}, 0, 2)
	_, err := c.AllReduce(dev, comm.Sum, nil)
	if err == nil || !strings.Contains(err.Error(), "expected a tensor in host memory") {
		t.Errorf("got %v", err)
	}
}

type fakeBuf struct{}

func (fakeBuf) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA} }
func (fakeBuf) DType() tensor.DType   { return tensor.Float32 }
func (fakeBuf) Len() int              { return 2 }
