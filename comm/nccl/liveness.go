package nccl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// ErrPeerGone is wrapped by the errors of a world in which a rank stopped
// sending heartbeats (its process exited, crashed or hangs) or the store's
// host went away. NCCL itself does not notice a dead peer on NVLink or PCIe:
// its kernels wait for data that never comes.
var ErrPeerGone = errors.New("nccl: a rank of the world is gone")

// closedMark is added to a rank's heartbeat counter when it closes its world
// normally, so that its silence afterwards is not taken for a death.
const closedMark = int64(1) << 40

// liveness is a world's use of the store after the unique id: each rank
// bumps a heartbeat counter, and reads its peers' to notice a rank whose
// process is gone; and an abort key that any rank sets when its world
// fails, which every rank waits on, so that one failure fails all ranks
// promptly instead of at their deadlines.
type liveness struct {
	store      *rendezvous.Client
	prefix     string
	rank, size int
	interval   time.Duration // between heartbeats
	lost       time.Duration // silence after which a started peer is gone

	onGone  func(err error)                // a peer (or the store) is gone
	onAbort func(from int, message string) // another rank aborted

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	peers []peerState // by world rank
	gone  bool        // onGone was called
}

type peerState struct {
	count   int64     // last heartbeat counter read
	changed time.Time // when count last changed (or when watching began)
	closed  bool      // the peer closed its world normally
}

func (l *liveness) hbKey(rank int) string { return fmt.Sprintf("%s/hb/%d", l.prefix, rank) }
func (l *liveness) abortKey() string      { return l.prefix + "/abort" }

// startLiveness starts the heartbeats and the abort watcher of a world.
func startLiveness(store *rendezvous.Client, prefix string, rank, size int, interval, lost time.Duration,
	onGone func(error), onAbort func(int, string)) *liveness {
	l := &liveness{store: store, prefix: prefix, rank: rank, size: size, interval: interval, lost: lost,
		onGone: onGone, onAbort: onAbort, peers: make([]peerState, size)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	now := time.Now()
	for q := range l.peers {
		l.peers[q].changed = now
	}
	l.wg.Add(2)
	go l.beat()
	go l.watchAbort()
	return l
}

// call runs one store call with a deadline of a few intervals.
func (l *liveness) add(key string, delta int64) (int64, error) {
	ctx, cancel := context.WithTimeout(l.ctx, max(4*l.interval, 2*time.Second))
	defer cancel()
	return l.store.Add(ctx, key, delta)
}

func (l *liveness) beat() {
	defer l.wg.Done()
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		if _, err := l.add(l.hbKey(l.rank), 1); err != nil && l.storeLost(err) {
			return
		}
		for q := range l.size {
			if q == l.rank {
				continue
			}
			v, err := l.add(l.hbKey(q), 0)
			if err != nil {
				if l.storeLost(err) {
					return
				}
				break // a slow store: try again at the next beat
			}
			l.observe(q, v, time.Now())
		}
		if err := l.check(time.Now()); err != nil {
			l.onGone(err) // and keep beating: this rank is alive
		}
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// storeLost reports whether err means the store is gone for good (and says
// so through onGone unless the liveness is being closed).
func (l *liveness) storeLost(err error) bool {
	if l.ctx.Err() != nil || errors.Is(err, rendezvous.ErrClosed) {
		return true
	}
	if errors.Is(err, rendezvous.ErrConnectionLost) {
		l.mu.Lock()
		first := !l.gone
		l.gone = true
		l.mu.Unlock()
		if first {
			l.onGone(fmt.Errorf("nccl: the rendezvous store is gone (hosted by world rank 0; its process exited?): %w: %w", err, ErrPeerGone))
		}
		return true
	}
	return false
}

// observe records peer q's counter v read at now.
func (l *liveness) observe(q int, v int64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := &l.peers[q]
	if v >= closedMark {
		p.closed = true
	}
	if v != p.count {
		p.count, p.changed = v, now
	}
}

// check returns the error naming the peers that started and then fell
// silent for longer than lost, or nil. It reports once.
func (l *liveness) check(now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone {
		return nil
	}
	var gone []string
	for q, p := range l.peers {
		if q == l.rank || p.closed || p.count == 0 {
			continue // a peer that has not started yet is the init deadline's business
		}
		if d := now.Sub(p.changed); d > l.lost {
			gone = append(gone, fmt.Sprintf("world rank %d (no heartbeat for %v)", q, d.Round(time.Millisecond)))
		}
	}
	if len(gone) == 0 {
		return nil
	}
	l.gone = true
	return fmt.Errorf("nccl: %s gone: its process exited, was killed or hangs: %w", strings.Join(gone, ", "), ErrPeerGone)
}

// probe reads every peer's heartbeat counter twice, wait apart, and names
// the peers whose counter did not move (and those that closed), for the
// error of a timeout or of an NCCL failure: whether a peer is alive says
// whether it died or is stuck elsewhere.
func (l *liveness) probe(wait time.Duration) string {
	read := func() []int64 {
		v := make([]int64, l.size)
		for q := range l.size {
			if q == l.rank {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), max(wait, time.Second))
			n, err := l.store.Add(ctx, l.hbKey(q), 0)
			cancel()
			if err != nil {
				v[q] = -1
				continue
			}
			v[q] = n
		}
		return v
	}
	before := read()
	time.Sleep(wait)
	after := read()
	var silent, closed, unknown []string
	for q := range l.size {
		switch {
		case q == l.rank:
		case before[q] < 0 || after[q] < 0:
			unknown = append(unknown, fmt.Sprintf("world rank %d", q))
		case after[q] >= closedMark:
			closed = append(closed, fmt.Sprintf("world rank %d", q))
		case after[q] == before[q]:
			silent = append(silent, fmt.Sprintf("world rank %d", q))
		}
	}
	var parts []string
	if len(silent) > 0 {
		parts = append(parts, fmt.Sprintf("%s sent no heartbeat for %v (process gone or hung)", strings.Join(silent, ", "), wait))
	}
	if len(closed) > 0 {
		parts = append(parts, strings.Join(closed, ", ")+" closed its communicators")
	}
	if len(unknown) > 0 {
		parts = append(parts, "the store could not be read for "+strings.Join(unknown, ", "))
	}
	if len(parts) == 0 {
		return "every peer process is alive (its heartbeat moves): a peer is stuck elsewhere or called a different op"
	}
	return strings.Join(parts, "; ")
}

// watchAbort waits for the abort key and reports it.
func (l *liveness) watchAbort() {
	defer l.wg.Done()
	for {
		v, err := l.store.Get(l.ctx, l.abortKey())
		if err == nil {
			from, msg := parseAbort(v)
			l.onAbort(from, msg)
			return
		}
		if l.ctx.Err() != nil || errors.Is(err, rendezvous.ErrClosed) || errors.Is(err, rendezvous.ErrConnectionLost) {
			return // the heartbeats report a lost store
		}
		select { // the store's own timeout: wait again
		case <-l.ctx.Done():
			return
		case <-time.After(l.interval):
		}
	}
}

// tellAbort publishes this rank's failure to the other ranks.
func (l *liveness) tellAbort(err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l.store.Set(ctx, l.abortKey(), []byte(strconv.Itoa(l.rank)+"\n"+err.Error()))
}

func parseAbort(v []byte) (from int, msg string) {
	r, m, ok := strings.Cut(string(v), "\n")
	n, err := strconv.Atoi(r)
	if !ok || err != nil {
		return -1, string(v)
	}
	return n, m
}

// close marks this rank as closed (when clean) and stops the goroutines.
func (l *liveness) close(clean bool) {
	if clean {
		l.add(l.hbKey(l.rank), closedMark)
	}
	l.cancel()
	l.wg.Wait()
}
