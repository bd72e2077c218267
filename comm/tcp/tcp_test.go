package tcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/commtest"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/tensor"
)

// newWorld makes the n ranks of a fresh world in this process: a store on
// 127.0.0.1, one client and one New per rank, run at once.
func newWorld(t testing.TB, n int, opts ...Option) []comm.Comm {
	t.Helper()
	job := fmt.Sprintf("tcp-test-%d", time.Now().UnixNano())
	srv, err := rendezvous.Serve(context.Background(), "127.0.0.1:0", job)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ranks := make([]comm.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cl, err := rendezvous.Dial(ctx, srv.Addr(), job, r, rendezvous.Options{})
			if err != nil {
				errs[r] = err
				return
			}
			t.Cleanup(func() { cl.Close() })
			c, err := New(ctx, cl, r, n, opts...)
			if err != nil {
				errs[r] = err
				return
			}
			ranks[r] = c
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("a world of %d: %v", n, err)
	}
	return ranks
}

// The conformance suite, with the cases where ranks disagree.
func TestConformance(t *testing.T) {
	commtest.Run(t, func(t *testing.T, n int) []comm.Comm { return newWorld(t, n) },
		commtest.Sizes(1, 2, 3, 4, 5), commtest.Mismatch())
}

// allReduce runs a 4-element all-reduce on c and returns its error.
func allReduce(c comm.Comm) error {
	w, err := c.AllReduce(tensor.MustHost(tensor.Float32, 4), comm.Sum, nil)
	if err == nil {
		err = w.Wait(nil)
	}
	return err
}

// both runs f on ranks 0 and 1 at once and returns their errors and how
// long each took.
func both(ranks []comm.Comm, f func(c comm.Comm) error) ([]error, []time.Duration) {
	errs, took := make([]error, 2), make([]time.Duration, 2)
	var wg sync.WaitGroup
	for q := range 2 {
		wg.Go(func() {
			start := time.Now()
			errs[q] = f(ranks[q])
			took[q] = time.Since(start)
		})
	}
	wg.Wait()
	return errs, took
}

// Rank 2 never calls: ranks 0 and 1 fail at the deadline naming it and the
// op; then rank 2's call fails at once (the others told it).
func TestMissingRank(t *testing.T) {
	const timeout = time.Second
	ranks := newWorld(t, 3, WithTimeout(timeout))
	defer closeAll(ranks)
	errs, took := both(ranks, allReduce)
	for q, err := range errs {
		msg := fmt.Sprint(err)
		if !errors.Is(err, comm.ErrTimeout) || !strings.Contains(msg, "rank 2") || !strings.Contains(msg, comm.OpAllReduce) {
			t.Errorf("rank %d: %v; want an error naming rank 2 and the all-reduce that wraps comm.ErrTimeout", q, err)
		}
		if took[q] > 3*timeout {
			t.Errorf("rank %d failed after %v, want within %v", q, took[q], 3*timeout)
		}
	}
	time.Sleep(100 * time.Millisecond) // the abort frames are on their way
	start := time.Now()
	err := allReduce(ranks[2])
	if err == nil || time.Since(start) > timeout/2 {
		t.Errorf("rank 2, arriving late: %v after %v; want an error at once", err, time.Since(start))
	}
	t.Logf("rank 0: %v\nrank 2: %v", errs[0], err)
}

// Rank 2 aborts while 0 and 1 wait for it: they fail at once with an error
// naming it and carrying the abort's message.
func TestAbort(t *testing.T) {
	const timeout = 20 * time.Second
	ranks := newWorld(t, 3, WithTimeout(timeout))
	defer closeAll(ranks)
	go func() {
		time.Sleep(100 * time.Millisecond)
		ranks[2].(comm.Aborter).Abort(errors.New("boom"))
	}()
	errs, took := both(ranks, allReduce)
	for q, err := range errs {
		msg := fmt.Sprint(err)
		if !errors.Is(err, comm.ErrAborted) || !strings.Contains(msg, "world rank 2") || !strings.Contains(msg, "boom") {
			t.Errorf("rank %d: %v; want an error naming world rank 2 with its message that wraps comm.ErrAborted", q, err)
		}
		if took[q] > timeout/4 {
			t.Errorf("rank %d failed after %v, want well before the deadline %v", q, took[q], timeout)
		}
	}
	t.Logf("rank 0: %v", errs[0])
}

// A rank that closes a group, or its world, while the others wait for it
// in that group makes them fail at once with comm.ErrClosed naming it; a
// clean close of the world is not a death (no ErrPeerGone).
func TestClose(t *testing.T) {
	const timeout = 20 * time.Second
	ranks := newWorld(t, 3, WithTimeout(timeout))
	defer closeAll(ranks)
	subs := make([]comm.Comm, 3)
	var wg sync.WaitGroup
	for q, c := range ranks {
		wg.Go(func() {
			var err error
			if subs[q], err = comm.SplitNamed(c, 0, q, "sub"); err != nil {
				t.Errorf("rank %d: split: %v", q, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, whole := range []bool{false, true} {
		go func() {
			time.Sleep(100 * time.Millisecond)
			if whole {
				ranks[2].Close()
			} else {
				subs[2].Close()
			}
		}()
		group := subs
		if whole {
			group = ranks
		}
		errs, took := both(group, allReduce)
		for q, err := range errs {
			if !errors.Is(err, comm.ErrClosed) || errors.Is(err, ErrPeerGone) || !strings.Contains(fmt.Sprint(err), "world rank 2 closed") {
				t.Errorf("whole=%v: rank %d: %v; want an error naming world rank 2 that wraps comm.ErrClosed", whole, q, err)
			}
			if took[q] > timeout/4 {
				t.Errorf("whole=%v: rank %d failed after %v", whole, q, took[q])
			}
		}
		t.Logf("whole=%v: rank 0: %v", whole, errs[0])
	}
	// The world without rank 2 refuses further ops with comm.ErrClosed,
	// without failing: rank 2 left, it did not die.
	errs, _ := both(ranks, func(c comm.Comm) error { _, err := c.Split(0, 0); return err })
	for q, err := range errs {
		if !errors.Is(err, comm.ErrClosed) || errors.Is(err, comm.ErrAborted) {
			t.Errorf("rank %d: split after rank 2 left: %v, want comm.ErrClosed without comm.ErrAborted", q, err)
		}
	}
}

// New fails clearly: bad arguments, and a world whose other ranks never
// come, naming them.
func TestNewErrors(t *testing.T) {
	if _, err := New(context.Background(), nil, 0, 2); err == nil || !strings.Contains(err.Error(), "rendezvous store") {
		t.Errorf("no store: %v", err)
	}
	if _, err := New(context.Background(), nil, 2, 2); err == nil || !strings.Contains(err.Error(), "0 ≤ rank < size") {
		t.Errorf("rank out of range: %v", err)
	}
	c, err := New(context.Background(), nil, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := allReduce(c); err != nil || c.Name() != "world[0]" {
		t.Errorf("a world of one: %s: %v", c.Name(), err)
	}
	c.Close()
	if err := allReduce(c); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("an op after Close: %v, want comm.ErrClosed", err)
	}

	srv, err := rendezvous.Serve(context.Background(), "127.0.0.1:0", "job")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	cl, err := rendezvous.Dial(ctx, srv.Addr(), "job", 0, rendezvous.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = New(ctx, cl, 0, 3)
	if err == nil || !strings.Contains(err.Error(), "ranks [1 2] did not connect") {
		t.Errorf("rank 0 alone in a world of 3: %v", err)
	}
	t.Logf("rank 0 alone: %v", err)
}

func closeAll(ranks []comm.Comm) {
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
}

// The address a rank advertises: loopback only when the store is on
// loopback; else the address its connection to the store leaves from;
// every interface when that is loopback although the store is not.
func TestPickHost(t *testing.T) {
	for _, c := range []struct {
		store, local, host string
		all                bool
	}{
		{"127.0.0.1:29500", "127.0.0.1:40000", "127.0.0.1", false},
		{"localhost:29500", "127.0.0.1:40000", "127.0.0.1", false},
		{"10.0.0.1:29500", "10.0.0.2:40000", "10.0.0.2", false},
		{"10.0.0.1:29500", "10.0.0.1:40000", "10.0.0.1", false}, // the store's own host
		{"node0:29500", "127.0.1.1:40000", "", true},            // node0 resolves to loopback here
		{"[fd00::1]:29500", "[fd00::2]:40000", "fd00::2", false},
	} {
		host, all := pickHost(c.store, c.local)
		if host != c.host || all != c.all {
			t.Errorf("store %s, local end %s: host %q, all %v; want %q, %v", c.store, c.local, host, all, c.host, c.all)
		}
	}
	if as := hostAddrs("1"); len(as) == 0 || as[len(as)-1] != "127.0.0.1:1" {
		t.Errorf("hostAddrs: %v, want loopback last", as)
	}
}
