package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/testutil"
)

// testCtx is a context that ends well within the test's budget.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func startServer(t *testing.T, job string) *Server {
	t.Helper()
	srv, err := Serve(testCtx(t, 5*time.Second), "127.0.0.1:0", job)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

func dialT(t *testing.T, addr, job string, rank int) *Client {
	t.Helper()
	c, err := Dial(testCtx(t, 5*time.Second), addr, job, rank, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSetGetAdd(t *testing.T) {
	srv := startServer(t, "job")
	c := dialT(t, srv.Addr(), "job", 0)
	ctx := testCtx(t, 5*time.Second)
	uid := bytes.Repeat([]byte{0, 1, 0xff, '\n'}, 32) // 128 opaque bytes
	if err := c.Set(ctx, "uid", uid); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "uid"); err != nil || !bytes.Equal(got, uid) {
		t.Fatalf("Get(uid) = %x, %v; want %x", got, err, uid)
	}
	if err := c.Set(ctx, "uid", nil); err != nil { // overwrite with an empty value
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "uid"); err != nil || len(got) != 0 {
		t.Fatalf("Get(uid) after overwrite = %q, %v; want empty", got, err)
	}
	for _, d := range []int64{5, -7, 0} {
		if _, err := c.Add(ctx, "n", d); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.Get(ctx, "n"); err != nil || string(got) != "-2" {
		t.Fatalf("Get(counter) = %q, %v; want \"-2\"", got, err)
	}
	if err := c.Wait(ctx, "uid", "n"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Add(ctx, "uid", 1) // holds "" now, not a counter
	testutil.ErrorContains(t, err, `add 1 to "uid"`, "not a decimal counter")
	testutil.ErrorContains(t, c.Set(ctx, "", []byte("x")), "empty key")
	testutil.ErrorContains(t, c.Set(ctx, strings.Repeat("k", MaxKeySize+1), nil), "exceeds the limit")
	testutil.ErrorContains(t, c.Set(ctx, "big", make([]byte, MaxValueSize+1)), `set "big"`, "exceeds the limit of 67108864")
	if got, err := c.Get(ctx, "n"); err != nil || string(got) != "-2" { // the connection survived
		t.Fatalf("Get after refused calls = %q, %v", got, err)
	}
}

func TestConcurrentClients(t *testing.T) {
	const n = 8
	srv := startServer(t, "job")
	ctx := testCtx(t, 10*time.Second)
	errs := make(chan error, n)
	for r := 0; r < n; r++ {
		go func() {
			errs <- func() error {
				c, err := Dial(ctx, srv.Addr(), "job", r, Options{})
				if err != nil {
					return err
				}
				defer c.Close()
				// Gets of keys that other ranks have not set yet, posted before our own Set.
				for p := n - 1; p >= 0; p-- {
					if p == r {
						if err := c.Set(ctx, fmt.Sprint("k", r), []byte(fmt.Sprint("v", r))); err != nil {
							return err
						}
						continue
					}
					v, err := c.Get(ctx, fmt.Sprint("k", p))
					if err != nil {
						return err
					}
					if string(v) != fmt.Sprint("v", p) {
						return fmt.Errorf("rank %d read k%d = %q", r, p, v)
					}
				}
				return c.Barrier(ctx, "end", n)
			}()
		}()
	}
	for r := 0; r < n; r++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestAddAtomic(t *testing.T) {
	const clients, goroutines, adds = 8, 8, 50
	srv := startServer(t, "job")
	ctx := testCtx(t, 10*time.Second)
	var mu sync.Mutex
	var seen []int64
	var wg sync.WaitGroup
	for ci := 0; ci < clients; ci++ {
		c := dialT(t, srv.Addr(), "job", ci)
		for g := 0; g < goroutines; g++ { // goroutines share each client
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < adds; i++ {
					v, err := c.Add(ctx, "counter", 1)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					seen = append(seen, v)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	const total = clients * goroutines * adds
	slices.Sort(seen)
	for i, v := range seen {
		if v != int64(i+1) {
			t.Fatalf("Add results sorted: position %d holds %d, want %d (lost or duplicated increments)", i, v, i+1)
		}
	}
	if len(seen) != total {
		t.Fatalf("%d Add results, want %d", len(seen), total)
	}
}

func TestGetBlocksUntilSet(t *testing.T) {
	srv := startServer(t, "job")
	reader, writer := dialT(t, srv.Addr(), "job", 1), dialT(t, srv.Addr(), "job", 0)
	ctx := testCtx(t, 5*time.Second)
	got := make(chan []byte, 1)
	go func() {
		v, err := reader.Get(ctx, "late")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	select {
	case v := <-got:
		t.Fatalf("Get returned %q before the key was set", v)
	case <-time.After(100 * time.Millisecond):
	}
	// The blocked Get must not hold up other calls on the same client.
	if err := reader.Set(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := writer.Set(ctx, "late", []byte("now")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "now" {
		t.Fatalf("Get = %q, want \"now\"", v)
	}
}

func TestDeadlines(t *testing.T) {
	srv := startServer(t, "job")
	c := dialT(t, srv.Addr(), "job", 3)
	ctx := testCtx(t, 5*time.Second)

	short := testCtx(t, 100*time.Millisecond)
	start := time.Now()
	_, err := c.Get(short, "nccl/uid")
	testutil.ErrorContains(t, err, "rank 3", `get "nccl/uid"`, "not set within", srv.Addr())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get error %v does not wrap context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Get gave up after %v, want about 100ms", d)
	}

	if err := c.Set(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	err = c.Wait(testCtx(t, 100*time.Millisecond), "a", "b", "c")
	testutil.ErrorContains(t, err, `["b" "c"] not set within`)

	err = c.Barrier(testCtx(t, 100*time.Millisecond), "start", 3)
	testutil.ErrorContains(t, err, `barrier "start": 1 of 3 ranks arrived within`)

	// A context without deadline gets Options.Timeout.
	quick, err := Dial(ctx, srv.Addr(), "job", 4, Options{Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer quick.Close()
	_, err = quick.Get(context.Background(), "never")
	testutil.ErrorContains(t, err, `get "never": the key was not set within`)

	// The abandoned waits were cancelled on the server, and the client still works.
	if err := c.Set(ctx, "b", []byte("B")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "b"); err != nil || string(v) != "B" {
		t.Fatalf("Get(b) after timeouts = %q, %v", v, err)
	}
	waitFor(t, "the server to drop the abandoned waits", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		for sc := range srv.conns {
			sc.mu.Lock()
			n := len(sc.pending)
			sc.mu.Unlock()
			if n > 0 {
				return false
			}
		}
		return true
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(3 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestJobMismatch(t *testing.T) {
	srv := startServer(t, "job-a")
	start := time.Now()
	c, err := Dial(testCtx(t, 5*time.Second), srv.Addr(), "job-b", 2, Options{})
	if c != nil {
		c.Close()
	}
	testutil.ErrorContains(t, err, `serves job "job-a"`, `rank 2 belongs to job "job-b"`)
	if !errors.Is(err, ErrJobMismatch) {
		t.Errorf("error %v does not wrap ErrJobMismatch", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Dial took %v: a job mismatch must not be retried", d)
	}
}

func TestServerCloseDuringGet(t *testing.T) {
	srv := startServer(t, "job")
	c := dialT(t, srv.Addr(), "job", 1)
	ctx := testCtx(t, 5*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	srv.Close()
	select {
	case err := <-errc:
		testutil.ErrorContains(t, err, `get "never"`)
		if !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("Get error %v: want the store's loss", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Get still blocked 3s after the server closed")
	}
	waitFor(t, "the client to see the loss", func() bool {
		return errors.Is(c.Set(ctx, "x", nil), ErrConnectionLost)
	})
}

func TestClientClose(t *testing.T) {
	srv := startServer(t, "job")
	c := dialT(t, srv.Addr(), "job", 0)
	ctx := testCtx(t, 5*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "never")
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending Get after Close: %v, want ErrClosed", err)
	}
	if err := c.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close: %v, want ErrClosed", err)
	}
}

func TestDialRetriesUntilServerUp(t *testing.T) {
	addr := freeAddr(t)
	ctx := testCtx(t, 5*time.Second)
	go func() {
		time.Sleep(200 * time.Millisecond)
		srv, err := Serve(ctx, addr, "job")
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { srv.Close() })
	}()
	c, err := Dial(ctx, addr, "job", 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Add(ctx, "n", 1); err != nil {
		t.Fatal(err)
	}
}

func TestDialDeadline(t *testing.T) {
	addr := freeAddr(t)
	_, err := Dial(testCtx(t, 300*time.Millisecond), addr, "job", 1, Options{})
	testutil.ErrorContains(t, err, "rank 1 could not reach the store", addr, "attempts", "connection refused")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
	}
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestBarrierReuse(t *testing.T) {
	const n, rounds = 5, 3
	srv := startServer(t, "job")
	ctx := testCtx(t, 10*time.Second)
	var mu sync.Mutex
	arrived := make([]int, rounds)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		c := dialT(t, srv.Addr(), "job", r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < rounds; round++ {
				mu.Lock()
				arrived[round]++
				mu.Unlock()
				if err := c.Barrier(ctx, "step", n); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				a := arrived[round]
				mu.Unlock()
				if a != n {
					t.Errorf("rank %d left barrier round %d with %d of %d arrived", r, round, a, n)
				}
			}
		}()
	}
	wg.Wait()
	testutil.ErrorContains(t, dialT(t, srv.Addr(), "job", 0).Barrier(ctx, "x", 0), "0 participants")
}

func TestShutdownWaitsForClients(t *testing.T) {
	srv := startServer(t, "job")
	c1, c2 := dialT(t, srv.Addr(), "job", 1), dialT(t, srv.Addr(), "job", 2)
	c1.Close()
	waitFor(t, "the server to see rank 1 leave", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 1
	})
	err := srv.Shutdown(testCtx(t, 100*time.Millisecond))
	testutil.ErrorContains(t, err, "ranks [2] still connected")
	if _, err := c2.Add(testCtx(t, time.Second), "n", 1); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("Add after Shutdown: %v, want ErrConnectionLost", err)
	}

	srv2 := startServer(t, "job")
	c3 := dialT(t, srv2.Addr(), "job", 3)
	done := make(chan error, 1)
	go func() { done <- srv2.Shutdown(testCtx(t, 5*time.Second)) }()
	time.Sleep(50 * time.Millisecond)
	if _, err := c3.Add(testCtx(t, time.Second), "n", 1); err != nil {
		t.Fatalf("Add during Shutdown: %v", err) // connected clients are still served
	}
	c3.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestJoinSingleProcess(t *testing.T) {
	info, err := FromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 5*time.Second)
	c, closeFn, err := Join(ctx, info, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := c.BroadcastBytes(ctx, "uid", 0, 0, []byte("id")); err != nil || string(v) != "id" {
		t.Fatalf("BroadcastBytes = %q, %v", v, err)
	}
	if err := c.Barrier(ctx, "all", info.WorldSize); err != nil {
		t.Fatal(err)
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	_, _, err = Join(ctx, Info{Rank: 2, WorldSize: 2, LocalWorldSize: 1}, Options{})
	testutil.ErrorContains(t, err, "Rank=2 is out of range")
}

func TestBroadcastTimeout(t *testing.T) {
	srv := startServer(t, "job")
	c := dialT(t, srv.Addr(), "job", 1)
	_, err := c.BroadcastBytes(testCtx(t, 100*time.Millisecond), "nvshmem/uid", 1, 0, nil)
	testutil.ErrorContains(t, err, "rank 1: broadcast from root rank 0", `get "nvshmem/uid": the key was not set within`)
}
