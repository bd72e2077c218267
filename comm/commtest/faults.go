package commtest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// errorCases: calls that are wrong on every rank in the same way (shapes,
// dtypes, counts, root) fail at the call, on every rank, with a *comm.Error
// naming the op and the rank and saying what was expected; the Comm stays
// usable.
func errorCases(r *rank) {
	p, me, s := r.c.Size(), r.c.Rank(), r.cfg.stream
	f32 := func(shape ...int) *tensor.Tensor { return r.alloc(tensor.Float32, shape...) }
	ones := func(n int) []int {
		c := make([]int, n)
		for i := range c {
			c[i] = 1
		}
		return c
	}
	skew := ones(p)
	skew[0] = 2
	neg := ones(p)
	neg[p-1] = -1
	tcs := []struct {
		name, op string
		call     func() (comm.Work, error)
	}{
		{"all-gather dst rows", comm.OpAllGather, func() (comm.Work, error) { return r.c.AllGather(f32(2*p+1, 3), f32(2, 3), s) }},
		{"all-gather dtype", comm.OpAllGather, func() (comm.Work, error) {
			return r.c.AllGather(r.alloc(tensor.Float64, 2*p, 3), f32(2, 3), s)
		}},
		{"reduce-scatter src rows", comm.OpReduceScatter, func() (comm.Work, error) {
			return r.c.ReduceScatter(f32(2, 3), f32(2*p+1, 3), comm.Sum, s)
		}},
		{"reduce-scatter row shape", comm.OpReduceScatter, func() (comm.Work, error) {
			return r.c.ReduceScatter(f32(2, 3), f32(2*p, 4), comm.Sum, s)
		}},
		{"all-reduce i32 avg", comm.OpAllReduce, func() (comm.Work, error) {
			return r.c.AllReduce(r.alloc(tensor.Int32, 4), comm.Avg, s)
		}},
		{"all-to-all-v counts sum", comm.OpAllToAllV, func() (comm.Work, error) {
			return r.c.AllToAllV(f32(p, 3), f32(p, 3), skew, ones(p), s)
		}},
		{"all-to-all-v count length", comm.OpAllToAllV, func() (comm.Work, error) {
			return r.c.AllToAllV(f32(p, 3), f32(p, 3), ones(p), ones(p+1), s)
		}},
		{"all-to-all-v negative count", comm.OpAllToAllV, func() (comm.Work, error) {
			return r.c.AllToAllV(f32(p, 3), f32(p, 3), neg, ones(p), s)
		}},
		{"all-to-all-v row shape", comm.OpAllToAllV, func() (comm.Work, error) {
			return r.c.AllToAllV(f32(p, 3), f32(p, 4), ones(p), ones(p), s)
		}},
		{"broadcast root", comm.OpBroadcast, func() (comm.Work, error) { return r.c.Broadcast(f32(3), p, s) }},
	}
	for _, tc := range tcs {
		w, err := tc.call()
		if err == nil {
			r.errorf("%s: no error from the call", tc.name)
			if err := w.Wait(s); err != nil {
				r.fatalf("%s: %v", tc.name, err)
			}
			continue
		}
		var e *comm.Error
		switch {
		case !errors.As(err, &e):
			r.errorf("%s: %v: expected a *comm.Error", tc.name, err)
		case e.Op != tc.op || e.Rank != me || e.Group != r.c.Name():
			r.errorf("%s: %v: expected op %s, rank %d, group %s", tc.name, err, tc.op, me, r.c.Name())
		case !strings.Contains(err.Error(), "expected"):
			r.errorf("%s: %v: the message should say what was expected", tc.name, err)
		}
	}
	r.allReduce("all-reduce after errors", tensor.Float32, comm.Sum, 3)
}

// mismatchCases: rank 0 disagrees with the others; every rank must fail
// with comm.ErrMismatch and an error that names rank 0. Then the Comm is
// still usable.
func mismatchCases(r *rank) {
	p, me, s := r.c.Size(), r.c.Rank(), r.cfg.stream
	expectMismatch := func(what string, w comm.Work, err error) {
		r.tb.Helper()
		if err == nil {
			err = w.Wait(s)
		}
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), "rank 0") {
			r.errorf("%s: got %v, want an error naming rank 0 that wraps comm.ErrMismatch", what, err)
		}
	}
	n := 4
	if me == 0 {
		n = 5
	}
	w, err := r.c.AllReduce(r.alloc(tensor.Float32, n), comm.Sum, s)
	expectMismatch("all-reduce of different sizes", w, err)

	buf := r.alloc(tensor.Float32, 4)
	if me == 0 {
		w, err = r.c.Broadcast(buf, 0, s)
	} else {
		w, err = r.c.AllReduce(buf, comm.Sum, s)
	}
	expectMismatch("broadcast on rank 0, all-reduce elsewhere", w, err)

	send, recv := make([]int, p), make([]int, p)
	for i := range send {
		send[i], recv[i] = 1, 1
	}
	if me == 0 {
		recv[1] = 2 // rank 1 sends 1
	}
	w, err = r.c.AllToAllV(r.alloc(tensor.Float32, p+btoi(me == 0), 3), r.alloc(tensor.Float32, p, 3), send, recv, s)
	expectMismatch("all-to-all-v with counts that disagree", w, err)

	r.allReduce("all-reduce after mismatches", tensor.Float32, comm.Sum, 3)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// faultWorld runs fn for ranks 0 and 1 of a fresh world of 3 at once and
// returns their errors and how long each call took.
func faultWorld(t *testing.T, cfg *config, ranks []comm.Comm) (errs []error, took []time.Duration) {
	errs, took = make([]error, 2), make([]time.Duration, 2)
	var wg sync.WaitGroup
	for q := range 2 {
		buf, err := cfg.mem.Alloc(tensor.Float32, 4)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			start := time.Now()
			w, err := ranks[q].AllReduce(buf, comm.Sum, cfg.stream)
			if err == nil {
				err = w.Wait(cfg.stream)
			}
			errs[q], took[q] = err, time.Since(start)
		})
	}
	wg.Wait()
	return errs, took
}

func newFaultWorld(t *testing.T, cfg *config) []comm.Comm {
	ranks := cfg.missing(t, 3)
	if len(ranks) != 3 {
		t.Fatalf("commtest: newWorld(3) returned %d ranks", len(ranks))
	}
	t.Cleanup(func() {
		for _, c := range ranks {
			c.Close()
		}
	})
	return ranks
}

// missingRank: rank 2 never calls; ranks 0 and 1 time out naming it.
func missingRank(t *testing.T, cfg *config) {
	ranks := newFaultWorld(t, cfg)
	errs, took := faultWorld(t, cfg, ranks)
	for q, err := range errs {
		msg := fmt.Sprint(err)
		if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(msg, "rank 2") || !strings.Contains(msg, comm.OpAllReduce) {
			t.Errorf("rank %d: got %v, want an error naming rank 2 and %s that wraps comm.ErrTimeout", q, err, comm.OpAllReduce)
		}
		if limit := 3*cfg.timeout + time.Second; took[q] > limit {
			t.Errorf("rank %d: failed after %v, want within %v", q, took[q], limit)
		}
	}
	start := time.Now()
	buf, _ := cfg.mem.Alloc(tensor.Float32, 4)
	w, err := ranks[2].AllReduce(buf, comm.Sum, cfg.stream)
	if err == nil {
		err = w.Wait(cfg.stream)
	}
	if err == nil {
		t.Errorf("rank 2, arriving after the others gave up: no error")
	}
	if took := time.Since(start); took > cfg.timeout/2 {
		t.Errorf("rank 2, arriving after the others gave up: failed after %v, want promptly (timeout %v)", took, cfg.timeout)
	}
}

// abortRank: rank 2 aborts while 0 and 1 wait for it.
func abortRank(t *testing.T, cfg *config) {
	ranks := newFaultWorld(t, cfg)
	a, ok := ranks[2].(comm.Aborter)
	if !ok {
		t.Skipf("commtest: %T is not a comm.Aborter", ranks[2])
	}
	boom := errors.New("commtest: boom")
	go func() {
		time.Sleep(cfg.timeout / 10)
		a.Abort(boom)
	}()
	errs, took := faultWorld(t, cfg, ranks)
	for q, err := range errs {
		if !errors.Is(err, boom) || !strings.Contains(fmt.Sprint(err), "rank 2") {
			t.Errorf("rank %d: got %v, want an error naming rank 2 that wraps the abort's error", q, err)
		}
		if took[q] >= cfg.timeout {
			t.Errorf("rank %d: failed after %v, want before the timeout %v", q, took[q], cfg.timeout)
		}
	}
}
