package nccl

// The heartbeats and the abort key over a real rendezvous store, with no
// NCCL: ranks are goroutines, each with its own client.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// events collects what the liveness of each rank reports.
type events struct {
	mu     sync.Mutex
	gone   map[int]error
	aborts map[int]string
}

func (e *events) onGone(rank int) func(error) {
	return func(err error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.gone[rank] = err
	}
}

func (e *events) onAbort(rank int) func(int, string) {
	return func(from int, msg string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.aborts[rank] = fmt.Sprintf("%d: %s", from, msg)
	}
}

func (e *events) get(rank int) (error, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gone[rank], e.aborts[rank]
}

// storeWorld serves a store and dials n clients to it.
func storeWorld(t *testing.T, n int) (*rendezvous.Server, []*rendezvous.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := rendezvous.Serve(ctx, "127.0.0.1:0", "liveness-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	clients := make([]*rendezvous.Client, n)
	for r := range n {
		if clients[r], err = rendezvous.Dial(ctx, srv.Addr(), "liveness-test", r, rendezvous.Options{Timeout: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { clients[r].Close() })
	}
	return srv, clients
}

func startAll(t *testing.T, clients []*rendezvous.Client, ev *events, interval, lost time.Duration) []*liveness {
	ls := make([]*liveness, len(clients))
	for r, c := range clients {
		ls[r] = startLiveness(c, "test", r, len(clients), interval, lost, ev.onGone(r), ev.onAbort(r))
	}
	return ls
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}

// TestLivenessPeerGone: a rank that stops beating without closing is named
// by the others; one that closes normally is not.
func TestLivenessPeerGone(t *testing.T) {
	_, clients := storeWorld(t, 4)
	ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
	const interval, lost = 20 * time.Millisecond, 300 * time.Millisecond
	ls := startAll(t, clients, ev, interval, lost)
	time.Sleep(5 * interval) // everyone has beaten
	ls[3].close(true)        // rank 3 is done: not a death
	ls[2].cancel()           // rank 2 "dies": its heartbeats stop
	ls[2].wg.Wait()
	start := time.Now()
	for _, r := range []int{0, 1} {
		if !waitFor(3*time.Second, func() bool { err, _ := ev.get(r); return err != nil }) {
			t.Fatalf("rank %d: no report of rank 2 within 3s", r)
		}
		err, _ := ev.get(r)
		if !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "world rank 2 ") || strings.Contains(err.Error(), "world rank 3") {
			t.Errorf("rank %d: %v: want an ErrPeerGone naming world rank 2 only", r, err)
		}
	}
	if took := time.Since(start); took > lost+50*interval {
		t.Errorf("noticed after %v, want about %v", took, lost)
	}
	if s := ls[0].probe(3 * interval); !strings.Contains(s, "world rank 2 sent no heartbeat") || !strings.Contains(s, "world rank 3 closed") ||
		strings.Contains(s, "world rank 1") {
		t.Errorf("probe: %q", s)
	}
	for _, l := range ls[:2] {
		l.close(true)
	}
}

// TestLivenessAbort: an abort told by one rank reaches the others, with its
// rank and message.
func TestLivenessAbort(t *testing.T) {
	_, clients := storeWorld(t, 3)
	ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
	ls := startAll(t, clients, ev, 20*time.Millisecond, 5*time.Second)
	ls[1].tellAbort(errors.New("rank 1 ran out of memory\nreally"))
	for _, r := range []int{0, 2} {
		if !waitFor(3*time.Second, func() bool { _, a := ev.get(r); return a != "" }) {
			t.Fatalf("rank %d: the abort did not arrive", r)
		}
		if _, a := ev.get(r); a != "1: rank 1 ran out of memory\nreally" {
			t.Errorf("rank %d got %q", r, a)
		}
	}
	if s := ls[0].probe(60 * time.Millisecond); !strings.HasPrefix(s, "every peer process is alive") {
		t.Errorf("probe of a healthy world: %q", s)
	}
	for _, l := range ls {
		l.close(true)
	}
	if from, msg := parseAbort([]byte("garbage")); from != -1 || msg != "garbage" {
		t.Errorf("parseAbort(garbage) = %d, %q", from, msg)
	}
}

// TestLivenessStoreGone: when the store's host goes away the ranks say so.
func TestLivenessStoreGone(t *testing.T) {
	srv, clients := storeWorld(t, 2)
	ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
	ls := startAll(t, clients, ev, 20*time.Millisecond, 5*time.Second)
	time.Sleep(60 * time.Millisecond)
	srv.Close()
	for r := range 2 {
		if !waitFor(3*time.Second, func() bool { err, _ := ev.get(r); return err != nil }) {
			t.Fatalf("rank %d: the lost store was not reported", r)
		}
		if err, _ := ev.get(r); !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "rendezvous store is gone") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	for _, l := range ls {
		l.close(false)
	}
}
