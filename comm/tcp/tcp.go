package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/internal/worldsetup"
	"github.com/asynctp/asynctp/comm/rendezvous"
)

// DefaultTimeout is the deadline of every op (and of New, when its context
// has none) unless WithTimeout says otherwise.
const DefaultTimeout = 5 * time.Minute

// ErrPeerGone is wrapped by the errors of a world in which a rank's
// connection closed without a goodbye: its process exited, crashed or was
// killed.
var ErrPeerGone = errors.New("tcp: a rank of the world is gone")

// Option configures New.
type Option func(*options)

type options struct {
	timeout   time.Duration
	label     string
	key       string
	host      string
	onFailure func(error)
}

// WithTimeout sets the deadline of every op: a rank that waits longer than
// d for a peer fails with an error naming the peers that did not arrive,
// and fails the world (every rank's pending and later ops). d ≤ 0 keeps
// DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithLabel sets the label of the world's Name (default "world": "world[0 1]").
func WithLabel(label string) Option { return func(o *options) { o.label = label } }

// WithKey sets the prefix of the store keys of this world (the ranks'
// addresses). By default the k-th New on a store client uses
// "asynctp/tcp/<k>", which agrees between ranks as long as they create their
// worlds in the same order.
func WithKey(prefix string) Option { return func(o *options) { o.key = prefix } }

// WithHost sets the address this rank listens on and tells its peers. By
// default: 127.0.0.1 when the store is on a loopback address (every rank
// on this host); else the local address of this rank's connection to the
// store, which the others reach as they reach the store; and where that
// is a loopback address too (the store's host name resolves to loopback
// here), every interface, each of whose addresses the peers try in turn,
// loopback last. Never loopback alone when the store is elsewhere.
func WithHost(host string) Option { return func(o *options) { o.host = host } }

// WithOnFailure calls f once, from the goroutine that notices it, when the
// world fails (a peer gone or unreachable, a deadline, an abort): a
// process can say so the moment it happens, before its ops return the
// error.
func WithOnFailure(f func(error)) Option { return func(o *options) { o.onFailure = f } }

// New makes this process's rank of a world of size ranks that move host
// tensors over TCP. It is collective: every rank calls it with the same
// size and options, and its own rank. Each rank listens on a port of its
// own, publishes the address in the store and connects to every other rank
// (the higher rank dials), so the store is only used here; store may be nil
// for a world of one rank. New fails when the mesh is not complete before
// ctx's deadline (or the op timeout), naming the ranks that did not connect.
//
// The returned Comm must be closed; Close of the world ends the
// connections (the groups split from it stop working).
func New(ctx context.Context, store *rendezvous.Client, rank, size int, opts ...Option) (*Comm, error) {
	o := options{timeout: DefaultTimeout, label: "world"}
	for _, f := range opts {
		f(&o)
	}
	switch {
	case size < 1 || rank < 0 || rank >= size:
		return nil, fmt.Errorf("tcp: New(rank %d, size %d): expected 0 ≤ rank < size", rank, size)
	case store == nil && size > 1:
		return nil, fmt.Errorf("tcp: New(rank %d, size %d): expected a rendezvous store to exchange the ranks' addresses (nil is only for a world of one rank)", rank, size)
	}
	w := &world{rank: rank, size: size, opts: o, peers: make([]*peer, size),
		boxes: map[msgKey]*box{}, groupClosed: map[groupPeer]bool{}, failed: make(chan struct{}), told: make(chan struct{})}
	if size > 1 {
		w.prefix = o.key
		if w.prefix == "" {
			w.prefix = worldsetup.Prefix(store, "tcp")
		}
		if err := w.connect(ctx, store); err != nil {
			return nil, fmt.Errorf("tcp: world rank %d of %d: %w", rank, size, err)
		}
		now := time.Now().UnixNano()
		for _, p := range w.peers {
			if p != nil {
				p.heard.Store(now)
				w.readers.Add(1)
				go w.read(p)
			}
		}
		w.heartbeats = make(chan struct{})
		go w.beat()
	}
	members := make([]int, size)
	for i := range members {
		members[i] = i
	}
	return &Comm{g: newGroup(w, "w", o.label, members), rank: rank, isWorld: true}, nil
}

// connect builds the mesh: every rank listens, publishes its address, dials
// the lower ranks and accepts the higher ones.
func (w *world) connect(ctx context.Context, store *rendezvous.Client) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(w.opts.timeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	host, all := w.opts.host, false
	if host == "" {
		host, all = pickHost(store.Addr(), store.LocalAddr())
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fmt.Errorf("listening on %s: %w", host, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	addrs := ln.Addr().String()
	if all {
		_, port, _ := net.SplitHostPort(addrs)
		addrs = strings.Join(hostAddrs(port), ",")
	}
	if err := store.Set(ctx, w.addrKey(w.rank), []byte(addrs)); err != nil {
		return fmt.Errorf("publishing this rank's address: %w", err)
	}

	var mu sync.Mutex
	accepted := make(chan error, 1)
	go func() { // the higher ranks dial this one
		n := w.size - 1 - w.rank
		for n > 0 {
			conn, err := ln.Accept()
			if err != nil {
				var missing []int
				mu.Lock()
				for q := w.rank + 1; q < w.size; q++ {
					if w.peers[q] == nil {
						missing = append(missing, q)
					}
				}
				mu.Unlock()
				accepted <- fmt.Errorf("ranks %v did not connect by the deadline (%v): %w", missing, ctx.Err(), err)
				return
			}
			r := bufio.NewReaderSize(conn, 64<<10)
			// A stray connection that says nothing holds the others up
			// for helloTimeout at most.
			q, err := readHello(conn, r, w.prefix, w.size, earliest(deadline, time.Now().Add(helloTimeout)))
			mu.Lock()
			if err == nil && (q <= w.rank || w.peers[q] != nil) {
				err = fmt.Errorf("rank %d connected twice, or is not a higher rank", q)
			}
			mu.Unlock()
			if err == nil {
				conn.SetWriteDeadline(deadline)
				_, err = conn.Write(helloFrame(w.prefix, w.rank, w.size))
				conn.SetWriteDeadline(time.Time{})
			}
			if err != nil {
				conn.Close() // a stray connection: ignore it
				continue
			}
			mu.Lock()
			w.peers[q] = &peer{rank: q, conn: conn, r: r}
			mu.Unlock()
			n--
		}
		accepted <- nil
	}()

	var dialErr error
	for q := 0; q < w.rank && dialErr == nil; q++ { // this rank dials the lower ones
		addr, err := store.Get(ctx, w.addrKey(q))
		if err != nil {
			dialErr = fmt.Errorf("waiting for the address of rank %d: %w", q, err)
			break
		}
		conn, r, err := dialPeer(ctx, string(addr), w.prefix, w.rank, w.size, q, deadline)
		if err != nil {
			if conn != nil {
				conn.Close()
			}
			dialErr = fmt.Errorf("connecting to rank %d at %s: %w", q, addr, err)
			break
		}
		mu.Lock()
		w.peers[q] = &peer{rank: q, conn: conn, r: r}
		mu.Unlock()
	}
	if dialErr != nil {
		ln.Close()
	}
	accErr := <-accepted
	if err := errors.Join(dialErr, accErr); err != nil {
		for _, p := range w.peers {
			if p != nil {
				p.conn.Close()
			}
		}
		return err
	}
	return nil
}

// dialPeer connects to rank q at addrs (one address, or several separated
// by commas, tried in turn) and exchanges hellos, retrying while no
// address answers until deadline.
func dialPeer(ctx context.Context, addrs, prefix string, rank, size, q int, deadline time.Time) (net.Conn, *bufio.Reader, error) {
	var d net.Dialer
	list := strings.Split(addrs, ",")
	for backoff, i := 10*time.Millisecond, 0; ; i++ {
		addr := list[i%len(list)]
		actx, cancel := ctx, context.CancelFunc(func() {})
		if len(list) > 1 { // an address of another network must not hold up the next one
			actx, cancel = context.WithTimeout(ctx, dialAttempt)
		}
		conn, err := d.DialContext(actx, "tcp", addr)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, err
			}
			if i%len(list) == len(list)-1 {
				time.Sleep(backoff)
				backoff = min(2*backoff, 500*time.Millisecond)
			}
			continue
		}
		conn.SetWriteDeadline(deadline)
		if _, err := conn.Write(helloFrame(prefix, rank, size)); err != nil {
			return conn, nil, err
		}
		conn.SetWriteDeadline(time.Time{})
		r := bufio.NewReaderSize(conn, 64<<10)
		got, err := readHello(conn, r, prefix, size, deadline)
		if err == nil && got != q {
			err = fmt.Errorf("the peer says it is rank %d", got)
		}
		return conn, r, err
	}
}

// dialAttempt bounds one connection attempt to one of several addresses
// of a peer.
const dialAttempt = 2 * time.Second

// helloTimeout bounds the wait for an accepted connection's hello.
const helloTimeout = 5 * time.Second

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (w *world) addrKey(rank int) string { return w.prefix + "/addr/" + strconv.Itoa(rank) }

// pickHost is the address to listen on, from the store's address and the
// local end of this rank's connection to it: loopback for a store on
// loopback (every rank is on this host), else the local address of the
// route to the store, which the peers reach as they reach the store. When
// that is a loopback address although the store's is not (a host name that
// resolves to loopback here, as Debian's 127.0.1.1), all is true: listen on
// every interface and publish each address (hostAddrs).
func pickHost(storeAddr, localAddr string) (host string, all bool) {
	sh, _, err := net.SplitHostPort(storeAddr)
	if err != nil {
		return "127.0.0.1", false
	}
	if ip := net.ParseIP(sh); sh == "localhost" || ip != nil && ip.IsLoopback() {
		return "127.0.0.1", false
	}
	lh, _, err := net.SplitHostPort(localAddr)
	if ip := net.ParseIP(lh); err == nil && ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() {
		return lh, false
	}
	return "", true
}

// hostAddrs are this host's addresses with port, those of the up,
// non-loopback interfaces first (IPv4 before IPv6), loopback last.
func hostAddrs(port string) []string {
	var v4, v6 []string
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		as, _ := ifc.Addrs()
		for _, a := range as {
			n, ok := a.(*net.IPNet)
			if !ok || n.IP.IsLinkLocalUnicast() || n.IP.IsLoopback() {
				continue
			}
			if n.IP.To4() != nil {
				v4 = append(v4, net.JoinHostPort(n.IP.String(), port))
			} else {
				v6 = append(v6, net.JoinHostPort(n.IP.String(), port))
			}
		}
	}
	return append(append(v4, v6...), net.JoinHostPort("127.0.0.1", port))
}

// group is one group of a world as this rank sees it: its id (the same on
// every member, carried by every frame of its ops), label and members.
type group struct {
	w       *world
	id      string
	label   string
	name    string
	members []int // world rank of each group rank
}

func newGroup(w *world, id, label string, members []int) *group {
	return &group{w: w, id: id, label: label, name: comm.GroupName(label, members), members: members}
}

// Comm is one rank's handle on a group of a TCP world: the world made by
// New or a group split from it. It implements comm.Comm, comm.Aborter and
// comm.NamedSplitter. Ops move host tensors and complete before they
// return (their Work is already done).
type Comm struct {
	g       *group
	rank    int
	isWorld bool
	seq     atomic.Uint64 // ops called
	closed  atomic.Bool
}

var (
	_ comm.Comm          = (*Comm)(nil)
	_ comm.Aborter       = (*Comm)(nil)
	_ comm.NamedSplitter = (*Comm)(nil)
)

func (c *Comm) Rank() int    { return c.rank }
func (c *Comm) Size() int    { return len(c.g.members) }
func (c *Comm) Name() string { return c.g.name }

// Members returns the world rank of each rank of the group.
func (c *Comm) Members() []int { return append([]int(nil), c.g.members...) }

// Abort fails the world: every pending and later op of every rank, in every
// group, fails with an error that names this rank and carries err's text
// (and, on this rank, wraps err and comm.ErrAborted).
func (c *Comm) Abort(err error) {
	c.g.w.failAs(fmt.Errorf("world rank %d aborted: %w (%w)", c.g.w.rank, err, comm.ErrAborted), true, true)
}

// Close closes this rank's handle. Peers that wait for it in an op, or call
// one later, fail with comm.ErrClosed instead of waiting for their deadline.
// Closing the world says goodbye to every peer and ends the connections,
// so that a peer whose connection ends without one knows that this rank
// died; the groups split from the world fail with comm.ErrClosed after it.
func (c *Comm) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	w := c.g.w
	w.waitTold()
	if c.isWorld {
		w.shutdown()
		return nil
	}
	f := newFrame(kindCloseGroup).str(c.g.id).frame(0)
	for q, m := range c.g.members {
		if q != c.rank {
			w.send(m, time.Now().Add(time.Second), f)
		}
	}
	return nil
}

// wrap makes err an error of op on this rank.
func (c *Comm) wrap(op string, err error) error {
	return fmt.Errorf("tcp: %w", &comm.Error{Op: op, Group: c.g.name, Rank: c.rank, Err: err})
}

// describe names group rank q, with its world rank when they differ.
func (g *group) describe(q int) string {
	if g.members[q] == q {
		return fmt.Sprintf("rank %d", q)
	}
	return fmt.Sprintf("rank %d (world rank %d)", q, g.members[q])
}
