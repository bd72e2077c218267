package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynctp/asynctp/comm"
)

// world is this process's rank of a TCP world and what its groups share:
// the connections to the peers, the mailbox of the frames they sent, and
// the failure state. One goroutine per peer reads its connection into the
// mailbox, so that a peer's writes never wait for this rank's ops; the ops
// take their messages out of it.
type world struct {
	rank, size int
	opts       options
	prefix     string
	peers      []*peer // by world rank; nil for this rank
	readers    sync.WaitGroup

	mu          sync.Mutex
	boxes       map[msgKey]*box
	groupClosed map[groupPeer]bool // groups a peer closed
	err         error              // why the world failed, once it has
	failed      chan struct{}      // closed with err
	told        chan struct{}      // closed once the peers were told of the failure (or need not be)
	closing     bool               // Close of the world has begun
	heartbeats  chan struct{}      // closed to stop beat
	stopBeats   sync.Once
}

// peer is the connection to one other rank.
type peer struct {
	rank int
	conn net.Conn
	r    *bufio.Reader
	wmu  sync.Mutex // one frame at a time
	bye  bool       // the peer closed its world; guarded by world.mu
	// heard is when a frame from the peer last arrived (UnixNano): its
	// pings say that the peer and the link to it are alive.
	heard atomic.Int64
}

// msgKey names a message: the op seq of a group, from a world rank.
type msgKey struct {
	group string
	seq   uint64
	from  int
}

type groupPeer struct {
	group string
	rank  int // world rank
}

// box holds one expected or arrived message; ready is closed when msg or
// err is set.
type box struct {
	msg   *message
	err   error
	ready chan struct{}
}

// closedBy returns the error of a message that can no longer come from
// world rank from in group g (it closed its world or the group), or nil.
// w.mu must be held.
func (w *world) closedBy(g *group, from int) error {
	if p := w.peers[from]; p != nil && p.bye {
		return fmt.Errorf("world rank %d closed its world before arriving (%w)", from, comm.ErrClosed)
	}
	if w.groupClosed[groupPeer{g.id, from}] {
		return fmt.Errorf("world rank %d closed %s before arriving (%w)", from, g.name, comm.ErrClosed)
	}
	return nil
}

// boxLocked returns the box of k, making it if needed. w.mu must be held.
func (w *world) boxLocked(k msgKey) *box {
	b := w.boxes[k]
	if b == nil {
		b = &box{ready: make(chan struct{})}
		w.boxes[k] = b
	}
	return b
}

// recv waits for the message k of group g until deadline, the world's
// failure or its sender's close.
func (w *world) recv(g *group, k msgKey, deadline time.Time) (*message, error) {
	w.mu.Lock()
	b := w.boxLocked(k)
	if b.msg == nil && b.err == nil {
		if err := w.closedBy(g, k.from); err != nil {
			b.err = err
			close(b.ready)
		}
	}
	w.mu.Unlock()
	select {
	case <-b.ready:
	default:
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		select {
		case <-b.ready:
		case <-w.failed:
			return nil, w.failure()
		case <-timer.C:
			return nil, errDeadline
		}
	}
	w.mu.Lock()
	delete(w.boxes, k)
	w.mu.Unlock()
	if b.err != nil && errors.Is(b.err, comm.ErrClosed) {
		// A peer that left in the middle of an op mostly left because the
		// world failed: its bye can overtake, on another connection, the
		// abort that says why. Wait a moment for it, to name the cause.
		t := time.NewTimer(min(closedGrace, w.opts.timeout))
		defer t.Stop()
		select {
		case <-w.failed:
			return nil, w.failure()
		case <-t.C:
		}
	}
	return b.msg, b.err
}

// closedGrace is how long an op that a peer left waits for the world's
// failure that may have made it leave.
const closedGrace = time.Second

var errDeadline = errors.New("deadline")

// arrived reports whether message k is in the mailbox.
func (w *world) arrived(k msgKey) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.boxes[k]
	return b != nil && b.msg != nil
}

// deliver puts a peer's message in the mailbox.
func (w *world) deliver(k msgKey, m *message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.boxLocked(k)
	if b.msg != nil {
		return fmt.Errorf("a second message for op #%d of group %q", k.seq, k.group)
	}
	if b.err != nil { // the receiver gave up on it; keep nothing
		delete(w.boxes, k)
		return nil
	}
	b.msg = m
	close(b.ready)
	return nil
}

// wakeClosed fails the waits for messages that world rank from will not
// send: in group id, or in every group ("" after its bye).
func (w *world) wakeClosed(id string, from int, why error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, b := range w.boxes {
		if k.from == from && (id == "" || k.group == id) && b.msg == nil && b.err == nil {
			b.err = why
			close(b.ready)
		}
	}
}

// failure returns the world's error, or nil while it is healthy.
func (w *world) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// fail fails the world with err; the first failure wins. With tell the
// peers are told (an abort frame), so that they fail promptly too.
func (w *world) fail(err error, tell bool) { w.failAs(err, tell, false) }

// failAs is fail; own says that this rank aborted the world itself (its
// caller knows why: WithOnFailure is not called).
func (w *world) failAs(err error, tell, own bool) {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return
	}
	w.err = err
	close(w.failed)
	w.mu.Unlock()
	w.stopHeartbeats()
	if f := w.opts.onFailure; f != nil && !own {
		f(err)
	}
	defer close(w.told)
	if !tell {
		return
	}
	var causes byte
	for _, c := range []struct {
		err error
		bit byte
	}{{comm.ErrTimeout, causeTimeout}, {ErrPeerGone, causeGone}, {comm.ErrClosed, causeClosed}, {comm.ErrMismatch, causeMismatch}} {
		if errors.Is(err, c.err) {
			causes |= c.bit
		}
	}
	f := newFrame(kindAbort).u8(causes).str32(err.Error()).frame(0)
	var wg sync.WaitGroup
	for _, p := range w.peers {
		if p != nil {
			wg.Go(func() { w.send(p.rank, time.Now().Add(2*time.Second), f) })
		}
	}
	wg.Wait()
}

// waitTold waits, in a failed world, until the peers were told why (the
// abort frames are sent, each within its deadline): a group's close frame
// sent first would reach them as a peer that merely left, and they would
// name it instead of the lost rank.
func (w *world) waitTold() {
	if w.failure() != nil {
		<-w.told
	}
}

// remoteError is the failure of another rank, told by its abort frame: its
// message, and the sentinels the original error wrapped.
type remoteError struct {
	from   int
	msg    string
	causes []error
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Unwrap() []error { return append(e.causes, comm.ErrAborted) }

func newRemoteError(from int, causes byte, msg string) error {
	e := &remoteError{from: from, msg: msg}
	for _, c := range []struct {
		bit byte
		err error
	}{{causeTimeout, comm.ErrTimeout}, {causeGone, ErrPeerGone}, {causeClosed, comm.ErrClosed}, {causeMismatch, comm.ErrMismatch}} {
		if causes&c.bit != 0 {
			e.causes = append(e.causes, c.err)
		}
	}
	if !strings.Contains(msg, fmt.Sprintf("world rank %d ", from)) {
		e.msg = fmt.Sprintf("world rank %d failed: %s", from, msg)
	}
	return e
}

// send writes one frame (and the extra parts that follow it, if any) to
// world rank to before deadline. A failed write leaves the stream in an
// unknown state, so it ends the connection (the reader then reports the
// peer). It is a no-op once the connection is closed.
func (w *world) send(to int, deadline time.Time, parts ...[]byte) error {
	p := w.peers[to]
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.conn.SetWriteDeadline(deadline)
	bufs := net.Buffers(parts)
	if _, err := bufs.WriteTo(p.conn); err != nil {
		p.conn.Close()
		return fmt.Errorf("sending to world rank %d: %w", to, err)
	}
	return nil
}

// read is the reader of one peer's connection: it files data frames in the
// mailbox and acts on the others until the connection ends. A connection
// that ends without a goodbye fails the world: the peer is gone.
func (w *world) read(p *peer) {
	defer w.readers.Done()
	for {
		body, err := readFrame(p.r, maxFrame)
		if err == nil {
			p.heard.Store(time.Now().UnixNano())
			err = w.handle(p, body)
		}
		if err == nil {
			continue
		}
		w.mu.Lock()
		quiet := w.closing || p.bye
		w.mu.Unlock()
		if since := time.Since(time.Unix(0, p.heard.Load())); !quiet && since > 2*w.heartbeat() {
			// Silent first, then the connection ended (a write to it gave up):
			// the link is lost, with every peer as silent as this one.
			lost, _ := w.silent(2 * w.heartbeat())
			w.fail(fmt.Errorf("%s unreachable: nothing heard for %v, then the connection to world rank %d ended (%v): their host, or the link to it, is down (%w) (%w)",
				rankList(lost), since.Round(time.Millisecond), p.rank, err, comm.ErrTimeout, comm.ErrAborted), true)
		} else if !quiet {
			w.fail(fmt.Errorf("world rank %d is gone: its connection ended without a goodbye (%v): its process exited, crashed or was killed (%w) (%w)",
				p.rank, err, ErrPeerGone, comm.ErrAborted), true)
		}
		p.conn.Close()
		return
	}
}

// errBye ends the reader after a goodbye.
var errBye = errors.New("goodbye")

func (w *world) handle(p *peer, body []byte) error {
	d := dec{b: body}
	switch kind := d.u8(); kind {
	case kindData:
		k := msgKey{group: d.str(), seq: d.u64(), from: p.rank}
		h := d.header()
		if d.err != nil {
			return fmt.Errorf("malformed data frame: %w", d.err)
		}
		return w.deliver(k, &message{h: h, payload: d.b})
	case kindAbort:
		causes, msg := d.u8(), d.str32()
		if d.err != nil {
			return fmt.Errorf("malformed abort frame: %w", d.err)
		}
		w.fail(newRemoteError(p.rank, causes, msg), false)
	case kindCloseGroup:
		id := d.str()
		if d.err != nil {
			return fmt.Errorf("malformed close frame: %w", d.err)
		}
		w.mu.Lock()
		w.groupClosed[groupPeer{id, p.rank}] = true
		w.mu.Unlock()
		w.wakeClosed(id, p.rank, fmt.Errorf("world rank %d closed the group before arriving (%w)", p.rank, comm.ErrClosed))
	case kindPing:
	case kindBye:
		w.mu.Lock()
		p.bye = true
		w.mu.Unlock()
		w.wakeClosed("", p.rank, fmt.Errorf("world rank %d closed its world before arriving (%w)", p.rank, comm.ErrClosed))
		return errBye
	default:
		return fmt.Errorf("unknown frame kind %d", kind)
	}
	return nil
}

// heartbeat is the interval of the pings: a tenth of the op timeout,
// between 100 ms and 1 s.
func (w *world) heartbeat() time.Duration {
	return min(max(w.opts.timeout/10, 100*time.Millisecond), time.Second)
}

func (w *world) stopHeartbeats() {
	w.stopBeats.Do(func() {
		if w.heartbeats != nil {
			close(w.heartbeats)
		}
	})
}

// beat fails the world when peers stay silent for the op timeout: their
// host, or the link to it, is down (a cut link ends no connection; without
// pings a rank would only learn of it at its next op's deadline, and could
// not tell a silent peer from one that waits, as it does, for the silent
// one). Each peer's pings go from a goroutine of their own (ping).
func (w *world) beat() {
	for _, p := range w.peers {
		if p != nil {
			go w.ping(p)
		}
	}
	tick := time.NewTicker(w.heartbeat())
	defer tick.Stop()
	for {
		select {
		case <-w.heartbeats:
			return
		case <-tick.C:
		}
		if lost, since := w.silent(w.opts.timeout); len(lost) > 0 {
			// Every peer silent for more than two beats is as lost as the
			// first one past the timeout (a host's ranks fall silent together).
			lost, _ = w.silent(2 * w.heartbeat())
			w.fail(fmt.Errorf("%s unreachable: nothing heard for %v (the op timeout is %v): their host, or the link to it, is down, or their process is stopped (%w)",
				rankList(lost), since.Round(time.Millisecond), w.opts.timeout, comm.ErrTimeout), true)
			return
		}
	}
}

// ping sends the peer a ping each heartbeat, between the frames of the
// ops. A write may wait while the link is down and the socket's buffer
// full: it has the op timeout, by which beat has failed the world.
func (w *world) ping(p *peer) {
	tick := time.NewTicker(w.heartbeat())
	defer tick.Stop()
	frame := newFrame(kindPing).frame(0)
	for {
		select {
		case <-w.heartbeats:
			return
		case <-tick.C:
		}
		p.wmu.Lock()
		p.conn.SetWriteDeadline(time.Now().Add(w.opts.timeout))
		_, err := p.conn.Write(frame)
		if err != nil {
			p.conn.Close() // a part of a frame may have gone: the stream is lost
		}
		p.wmu.Unlock()
		if err != nil {
			return
		}
	}
}

// silent returns the world ranks (peers still in the world) from which
// nothing arrived for at least d, and the longest silence.
func (w *world) silent(d time.Duration) (ranks []int, longest time.Duration) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.peers {
		if p == nil || p.bye {
			continue
		}
		if s := now.Sub(time.Unix(0, p.heard.Load())); s >= d {
			ranks = append(ranks, p.rank)
			longest = max(longest, s)
		}
	}
	return ranks, longest
}

// rankList is "world rank 2 is" or "world ranks 2, 3 are".
func rankList(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("world rank %d is", rs[0])
	}
	return "world ranks " + joinRanks(rs) + " are"
}

func joinRanks(rs []int) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, ", ")
}

// lingerTimeout bounds how long Close of the world waits for the peers to
// end their side of the connections (so that nothing this rank sent is
// lost to a reset).
const lingerTimeout = 2 * time.Second

// shutdown says goodbye to every peer, ends this side of each connection,
// waits (at most lingerTimeout) for the peers to end theirs, and closes.
func (w *world) shutdown() {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return
	}
	w.closing = true
	w.mu.Unlock()
	w.stopHeartbeats()
	bye := newFrame(kindBye).frame(0)
	for _, p := range w.peers {
		if p == nil {
			continue
		}
		if w.send(p.rank, time.Now().Add(time.Second), bye) == nil {
			if tc, ok := p.conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
	}
	done := make(chan struct{})
	go func() { w.readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(lingerTimeout):
	}
	for _, p := range w.peers {
		if p != nil {
			p.conn.Close()
		}
	}
	<-done
}

// usable returns the error of an op called on c now, or nil.
func (c *Comm) usable(op string) error {
	if c.closed.Load() {
		return c.wrap(op, fmt.Errorf("this rank's handle is closed (%w)", comm.ErrClosed))
	}
	w := c.g.w
	w.mu.Lock()
	err, closing := w.err, w.closing
	w.mu.Unlock()
	switch {
	case err != nil:
		return c.wrap(op, err)
	case closing:
		return c.wrap(op, fmt.Errorf("the world was closed on this rank (%w)", comm.ErrClosed))
	}
	return nil
}
