package rendezvous

// The heartbeats and the abort key over a real store: ranks are
// goroutines, each with its own client.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
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
func storeWorld(t *testing.T, n int) (*Server, []*Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := Serve(ctx, "127.0.0.1:0", "liveness-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	clients := make([]*Client, n)
	for r := range n {
		if clients[r], err = Dial(ctx, srv.Addr(), "liveness-test", r, Options{Timeout: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { clients[r].Close() })
	}
	return srv, clients
}

func startAll(t *testing.T, clients []*Client, ev *events, interval, lost time.Duration, fromStart bool) []*Liveness {
	t.Helper()
	ls := make([]*Liveness, len(clients))
	for r, c := range clients {
		var err error
		ls[r], err = StartLiveness(c, LivenessConfig{Prefix: "test", Rank: r, Size: len(clients), Interval: interval, Lost: lost,
			FromStart: fromStart, OnGone: ev.onGone(r), OnAbort: ev.onAbort(r)})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ls
}

// waitFor polls cond for up to d.
func waitUntil(d time.Duration, cond func() bool) bool {
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
	ls := startAll(t, clients, ev, interval, lost, false)
	time.Sleep(5 * interval) // everyone has beaten
	ls[3].Close(true)        // rank 3 is done: not a death
	ls[2].Close(false)       // rank 2 "dies": its heartbeats stop
	start := time.Now()
	for _, r := range []int{0, 1} {
		if !waitUntil(3*time.Second, func() bool { err, _ := ev.get(r); return err != nil }) {
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
	if s := ls[0].Probe(3 * interval); !strings.Contains(s, "world rank 2 sent no heartbeat") || !strings.Contains(s, "world rank 3 closed") ||
		strings.Contains(s, "world rank 1") {
		t.Errorf("probe: %q", s)
	}
	for _, l := range ls[:2] {
		l.Close(true)
	}
}

// TestLivenessAbort: an abort told by one rank reaches the others, with its
// rank and message.
func TestLivenessAbort(t *testing.T) {
	_, clients := storeWorld(t, 3)
	ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
	ls := startAll(t, clients, ev, 20*time.Millisecond, 5*time.Second, false)
	ls[1].Abort(errors.New("rank 1 ran out of memory\nreally"))
	for _, r := range []int{0, 2} {
		if !waitUntil(3*time.Second, func() bool { _, a := ev.get(r); return a != "" }) {
			t.Fatalf("rank %d: the abort did not arrive", r)
		}
		if _, a := ev.get(r); a != "1: rank 1 ran out of memory\nreally" {
			t.Errorf("rank %d got %q", r, a)
		}
	}
	if s := ls[0].Probe(60 * time.Millisecond); !strings.HasPrefix(s, "every peer process is alive") {
		t.Errorf("probe of a healthy world: %q", s)
	}
	for _, l := range ls {
		l.Close(true)
	}
	if from, msg := parseAbort([]byte("garbage")); from != -1 || msg != "garbage" {
		t.Errorf("parseAbort(garbage) = %d, %q", from, msg)
	}
}

// TestLivenessStoreGone: when the store's host goes away the ranks say so.
func TestLivenessStoreGone(t *testing.T) {
	srv, clients := storeWorld(t, 2)
	ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
	ls := startAll(t, clients, ev, 20*time.Millisecond, 5*time.Second, false)
	time.Sleep(60 * time.Millisecond)
	srv.Close()
	for r := range 2 {
		if !waitUntil(3*time.Second, func() bool { err, _ := ev.get(r); return err != nil }) {
			t.Fatalf("rank %d: the lost store was not reported", r)
		}
		if err, _ := ev.get(r); !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "rendezvous store is gone") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	for _, l := range ls {
		l.Close(false)
	}
}

// TestLivenessFromStart: with FromStart a peer that never sends a
// heartbeat is gone after Lost; without it, it is left alone.
func TestLivenessFromStart(t *testing.T) {
	_, clients := storeWorld(t, 3)
	const interval, lost = 20 * time.Millisecond, 200 * time.Millisecond
	for _, fromStart := range []bool{true, false} {
		ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
		ls2 := make([]*Liveness, 2) // ranks 0 and 1 of 3: rank 2 never starts
		for r := range 2 {
			var err error
			ls2[r], err = StartLiveness(clients[r], LivenessConfig{Prefix: fmt.Sprintf("start-%v", fromStart), Rank: r, Size: 3,
				Interval: interval, Lost: lost, FromStart: fromStart, OnGone: ev.onGone(r), OnAbort: ev.onAbort(r)})
			if err != nil {
				t.Fatal(err)
			}
		}
		got := waitUntil(lost+2*time.Second, func() bool { err, _ := ev.get(0); return err != nil })
		if fromStart {
			err, _ := ev.get(0)
			if !got || !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "world rank 2 ") || strings.Contains(err.Error(), "world rank 1") {
				t.Errorf("FromStart: rank 0 got %v, want an ErrPeerGone naming world rank 2 only", err)
			}
		} else if got {
			err, _ := ev.get(0)
			t.Errorf("without FromStart: a peer that never started was reported: %v", err)
		}
		for _, l := range ls2 {
			l.Close(true)
		}
	}
}

// TestLivenessOwnAbort: a rank's own abort is not reported back to it.
func TestLivenessOwnAbort(t *testing.T) {
	_, clients := storeWorld(t, 2)
	ev := &events{gone: map[int]error{}, aborts: map[int]string{}}
	ls := startAll(t, clients, ev, 20*time.Millisecond, 5*time.Second, true)
	ls[0].Abort(errors.New("boom"))
	if !waitUntil(3*time.Second, func() bool { _, a := ev.get(1); return a != "" }) {
		t.Fatal("rank 1: the abort did not arrive")
	}
	time.Sleep(100 * time.Millisecond)
	if _, a := ev.get(0); a != "" {
		t.Errorf("rank 0 was told of its own abort: %q", a)
	}
	for _, l := range ls {
		l.Close(true)
	}
}

// TestLivenessConfig: a bad configuration is an error naming what was
// expected.
func TestLivenessConfig(t *testing.T) {
	_, clients := storeWorld(t, 1)
	ok := LivenessConfig{Prefix: "p", Rank: 0, Size: 1, Interval: time.Second, Lost: time.Second,
		OnGone: func(error) {}, OnAbort: func(int, string) {}}
	for _, c := range []struct {
		name  string
		store *Client
		edit  func(*LivenessConfig)
		want  string
	}{
		{"no store", nil, func(*LivenessConfig) {}, "needs a store client"},
		{"rank", clients[0], func(c *LivenessConfig) { c.Rank = 1 }, "expected 0 <= rank < size"},
		{"interval", clients[0], func(c *LivenessConfig) { c.Interval = 0 }, "expected both > 0"},
		{"callbacks", clients[0], func(c *LivenessConfig) { c.OnAbort = nil }, "OnGone and OnAbort"},
	} {
		cfg := ok
		c.edit(&cfg)
		if _, err := StartLiveness(c.store, cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
