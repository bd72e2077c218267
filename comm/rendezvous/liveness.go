package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrPeerGone is wrapped by the errors of a Liveness whose peer stopped
// sending heartbeats (its process exited, crashed, was killed or hangs) or
// whose store went away.
var ErrPeerGone = errors.New("rendezvous: a rank of the world is gone")

// ClosedMark is added to a rank's heartbeat counter when it closes its
// Liveness cleanly, so that its silence afterwards is not taken for a
// death.
const ClosedMark = int64(1) << 40

// LivenessConfig says how one rank keeps its heartbeat in the store and
// watches its peers' (StartLiveness).
type LivenessConfig struct {
	// Prefix of the keys: Prefix/hb/<world rank> (heartbeat counters,
	// Add) and Prefix/abort ("<rank>\n<message>", Set once by a failing
	// rank). The ranks of one world use the same prefix.
	Prefix     string
	Rank, Size int           // this rank and the world's size
	Interval   time.Duration // between heartbeats
	Lost       time.Duration // silence after which a peer is gone

	// FromStart counts a peer that has not sent its first heartbeat yet
	// as gone too, Lost after StartLiveness: for callers that start the
	// liveness once every peer has joined. Otherwise (NCCL, which starts
	// it before the communicator's init) a peer that never started is
	// left to the init's deadline.
	FromStart bool

	// OnGone is called at most once, from the liveness's goroutine, when
	// a peer fell silent or the store is gone, with an error wrapping
	// ErrPeerGone that names the peers. Heartbeats go on after it.
	OnGone func(err error)
	// OnAbort is called at most once when another rank Aborts, with its
	// world rank (−1 when unreadable) and message.
	OnAbort func(from int, message string)
}

// Liveness is one rank's heartbeats and abort watch over the store, for
// transports that do not notice a lost peer by themselves (NCCL on NVLink
// or PCIe: its kernels wait for data that never comes; NVSHMEM, which
// cannot abort). Each rank bumps its heartbeat counter every Interval and
// reads its peers'; a peer whose counter stops for Lost is gone. A rank
// that fails on its own sets the abort key (Abort), which every rank
// waits on, so that one failure fails every rank at once instead of at
// their deadlines.
type Liveness struct {
	store *Client
	cfg   LivenessConfig

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	peers []peerState // by world rank
	gone  bool        // OnGone was called
}

type peerState struct {
	count   int64     // last heartbeat counter read
	changed time.Time // when count last changed (or when watching began)
	closed  bool      // the peer closed its liveness cleanly
}

// StartLiveness starts the heartbeats and the abort watch of this rank
// (two goroutines, until Close).
func StartLiveness(store *Client, cfg LivenessConfig) (*Liveness, error) {
	switch {
	case store == nil:
		return nil, errors.New("rendezvous: liveness needs a store client, got nil")
	case cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return nil, fmt.Errorf("rendezvous: liveness of rank %d in a world of %d, expected 0 <= rank < size", cfg.Rank, cfg.Size)
	case cfg.Interval <= 0 || cfg.Lost <= 0:
		return nil, fmt.Errorf("rendezvous: liveness with heartbeat interval %v and lost-after %v, expected both > 0", cfg.Interval, cfg.Lost)
	case cfg.OnGone == nil || cfg.OnAbort == nil:
		return nil, errors.New("rendezvous: liveness needs both OnGone and OnAbort")
	}
	l := &Liveness{store: store, cfg: cfg, peers: make([]peerState, cfg.Size)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	now := time.Now()
	for q := range l.peers {
		l.peers[q].changed = now
	}
	l.wg.Add(2)
	go l.beat()
	go l.watchAbort()
	return l, nil
}

// Interval is the time between heartbeats.
func (l *Liveness) Interval() time.Duration { return l.cfg.Interval }

func (l *Liveness) hbKey(rank int) string { return fmt.Sprintf("%s/hb/%d", l.cfg.Prefix, rank) }
func (l *Liveness) abortKey() string      { return l.cfg.Prefix + "/abort" }

// add runs one store Add with a deadline of a few intervals.
func (l *Liveness) add(key string, delta int64) (int64, error) {
	ctx, cancel := context.WithTimeout(l.ctx, max(4*l.cfg.Interval, 2*time.Second))
	defer cancel()
	return l.store.Add(ctx, key, delta)
}

func (l *Liveness) beat() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := l.add(l.hbKey(l.cfg.Rank), 1); err != nil && l.storeLost(err) {
			return
		}
		for q := range l.cfg.Size {
			if q == l.cfg.Rank {
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
			l.cfg.OnGone(err) // and keep beating: this rank is alive
		}
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// storeLost reports whether err means the store is gone for good (and says
// so through OnGone unless the liveness is being closed).
func (l *Liveness) storeLost(err error) bool {
	if l.ctx.Err() != nil || errors.Is(err, ErrClosed) {
		return true
	}
	if errors.Is(err, ErrConnectionLost) {
		l.mu.Lock()
		first := !l.gone
		l.gone = true
		l.mu.Unlock()
		if first {
			l.cfg.OnGone(fmt.Errorf("the rendezvous store is gone (hosted by world rank 0 or by the launcher: its process exited?): %w: %w", err, ErrPeerGone))
		}
		return true
	}
	return false
}

// observe records peer q's counter v read at now.
func (l *Liveness) observe(q int, v int64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := &l.peers[q]
	if v >= ClosedMark {
		p.closed = true
	}
	if v != p.count {
		p.count, p.changed = v, now
	}
}

// check returns the error naming the peers that fell silent for longer
// than Lost, or nil. It reports once, and never while closing.
func (l *Liveness) check(now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone || l.ctx.Err() != nil {
		return nil
	}
	var gone []string
	for q, p := range l.peers {
		if q == l.cfg.Rank || p.closed || p.count == 0 && !l.cfg.FromStart {
			continue // a peer that has not started yet is the init deadline's business
		}
		if d := now.Sub(p.changed); d > l.cfg.Lost {
			gone = append(gone, fmt.Sprintf("world rank %d (no heartbeat for %v)", q, d.Round(time.Millisecond)))
		}
	}
	if len(gone) == 0 {
		return nil
	}
	l.gone = true
	return fmt.Errorf("%s gone: its process exited, crashed, was killed or hangs: %w", strings.Join(gone, ", "), ErrPeerGone)
}

// Probe reads every peer's heartbeat counter twice, wait apart, and names
// the peers whose counter did not move (and those that closed), for the
// error of a timeout or of a transport failure: whether a peer is alive
// says whether it died or is stuck elsewhere.
func (l *Liveness) Probe(wait time.Duration) string {
	read := func() []int64 {
		v := make([]int64, l.cfg.Size)
		for q := range l.cfg.Size {
			if q == l.cfg.Rank {
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
	for q := range l.cfg.Size {
		switch {
		case q == l.cfg.Rank:
		case before[q] < 0 || after[q] < 0:
			unknown = append(unknown, fmt.Sprintf("world rank %d", q))
		case after[q] >= ClosedMark:
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

// watchAbort waits for the abort key and reports another rank's.
func (l *Liveness) watchAbort() {
	defer l.wg.Done()
	for {
		v, err := l.store.Get(l.ctx, l.abortKey())
		if err == nil {
			if from, msg := parseAbort(v); from != l.cfg.Rank && l.ctx.Err() == nil {
				l.cfg.OnAbort(from, msg)
			}
			return
		}
		if l.ctx.Err() != nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrConnectionLost) {
			return // the heartbeats report a lost store
		}
		select { // the store's own timeout: wait again
		case <-l.ctx.Done():
			return
		case <-time.After(l.cfg.Interval):
		}
	}
}

// Abort publishes this rank's failure err to the other ranks (their
// OnAbort).
func (l *Liveness) Abort(err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l.store.Set(ctx, l.abortKey(), []byte(strconv.Itoa(l.cfg.Rank)+"\n"+err.Error()))
}

func parseAbort(v []byte) (from int, msg string) {
	r, m, ok := strings.Cut(string(v), "\n")
	n, err := strconv.Atoi(r)
	if !ok || err != nil {
		return -1, string(v)
	}
	return n, m
}

// Close stops the heartbeats and the watch; clean marks this rank as
// closed (ClosedMark), so that the others do not take its silence for a
// death. Close(false) leaves the rank looking dead once Lost passes.
func (l *Liveness) Close(clean bool) {
	if clean {
		l.add(l.hbKey(l.cfg.Rank), ClosedMark)
	}
	l.cancel()
	l.wg.Wait()
}
