package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// DefaultTimeout bounds a call whose context has no deadline, unless
// Options.Timeout says otherwise.
const DefaultTimeout = 5 * time.Minute

var (
	// ErrClosed is returned by calls on a Client after its Close.
	ErrClosed = errors.New("rendezvous: client closed")
	// ErrConnectionLost is wrapped by the errors of calls whose store went
	// away (closed, crashed or unreachable).
	ErrConnectionLost = errors.New("rendezvous: connection to the store lost")
	// ErrJobMismatch is wrapped by Dial's error when the store belongs to
	// another job; the message names both job ids.
	ErrJobMismatch = errors.New("rendezvous: job id mismatch")
)

// Options tune Dial and Join. The zero value is ready to use.
type Options struct {
	// Timeout bounds Dial and every call whose context has no deadline
	// (DefaultTimeout when 0), so that no call waits forever.
	Timeout time.Duration
	// ListenAddr is where Join's rank 0 serves the store ("host:port"). When
	// empty: MasterAddr:MasterPort if MasterAddr is a loopback address (or
	// 127.0.0.1:0 for a world of 1 without one), else all interfaces at
	// MasterPort.
	ListenAddr string
}

func (o Options) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultTimeout
}

// withTimeout gives ctx a deadline of d from now if it has none.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// Client is one rank's connection to the store. Its methods are safe for
// concurrent use; calls proceed independently (a blocked Get does not delay a
// Set from another goroutine).
type Client struct {
	conn    net.Conn
	addr    string
	jobID   string
	rank    int
	timeout time.Duration

	writeMu sync.Mutex
	mu      sync.Mutex
	pending map[uint64]chan frame
	nextID  uint64
	err     error         // why the client stopped; set once
	done    chan struct{} // closed when err is set
	readEnd chan struct{} // closed when the read loop has returned
}

// Dial connects rank to the store of job jobID at addr, retrying with backoff
// while the server is not up yet, until ctx's deadline (Options.Timeout when
// ctx has none). A store of another job is not retried: the error wraps
// ErrJobMismatch.
func Dial(ctx context.Context, addr, jobID string, rank int, opts Options) (*Client, error) {
	ctx, cancel := withTimeout(ctx, opts.timeout())
	defer cancel()
	start, backoff := time.Now(), 20*time.Millisecond
	var last error // the last failure not caused by ctx's end
	for attempt := 1; ; attempt++ {
		c, err := dialOnce(ctx, addr, jobID, rank, opts.timeout())
		if err == nil {
			return c, nil
		}
		var rej *rejectedError
		if errors.As(err, &rej) {
			return nil, fmt.Errorf("rendezvous: rank %d dialing the store at %s: %w", rank, addr, err)
		}
		var ne net.Error
		if last == nil || ctx.Err() == nil && !(errors.As(err, &ne) && ne.Timeout()) {
			last = err // an attempt cut short by the deadline says less than the one before
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
			backoff = min(2*backoff, time.Second)
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("rendezvous: rank %d could not reach the store of job %q at %s within %v (%d attempts): %w; last attempt: %w",
				rank, jobID, addr, time.Since(start).Round(time.Millisecond), attempt, ctx.Err(), last)
		}
	}
}

// rejectedError is a hello the server refused; retrying cannot help.
type rejectedError struct {
	msg      string
	mismatch bool
}

func (e *rejectedError) Error() string {
	if e.mismatch {
		return ErrJobMismatch.Error() + ": " + e.msg
	}
	return "the store refused the connection: " + e.msg
}

func (e *rejectedError) Unwrap() error {
	if e.mismatch {
		return ErrJobMismatch
	}
	return nil
}

// dialOnce makes one connection attempt and handshake.
func dialOnce(ctx context.Context, addr, jobID string, rank int, timeout time.Duration) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	r := bufio.NewReader(conn)
	f, err := handshake(conn, r, jobID, rank)
	if !stop() || err != nil {
		conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	if f.kind != statusOK {
		conn.Close()
		msg := "(no message)"
		if len(f.fields) > 0 {
			msg = string(f.fields[0])
		}
		return nil, &rejectedError{msg: msg, mismatch: f.kind == statusJobMismatch}
	}
	c := &Client{conn: conn, addr: addr, jobID: jobID, rank: rank, timeout: timeout, pending: map[uint64]chan frame{},
		done: make(chan struct{}), readEnd: make(chan struct{})}
	go c.readLoop(r)
	return c, nil
}

func handshake(conn net.Conn, r *bufio.Reader, jobID string, rank int) (frame, error) {
	hello, err := frame{kind: opHello, fields: [][]byte{[]byte(protoMagic), []byte(protoVersion),
		[]byte(jobID), []byte(strconv.Itoa(rank))}}.encode(nil)
	if err != nil {
		return frame{}, err
	}
	if _, err := conn.Write(hello); err != nil {
		return frame{}, err
	}
	return readFrame(r, maxHello)
}

// Rank is the rank this client said hello as.
func (c *Client) Rank() int { return c.rank }

// Addr is the store's address.
func (c *Client) Addr() string { return c.addr }

// LocalAddr is the local end of the client's connection ("10.0.0.2:41234"):
// this host's address on the route to the store.
func (c *Client) LocalAddr() string { return c.conn.LocalAddr().String() }

// Close ends the connection; calls in progress fail with ErrClosed.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	<-c.readEnd
	return nil
}

// fail stops the client with err (the first reason wins).
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
	c.mu.Unlock()
	c.conn.Close()
}

func (c *Client) readLoop(r *bufio.Reader) {
	defer close(c.readEnd)
	for {
		f, err := readFrame(r, maxFrame)
		if err != nil {
			c.fail(fmt.Errorf("%w (store %s, seen from rank %d): %v", ErrConnectionLost, c.addr, c.rank, err))
			return
		}
		c.mu.Lock()
		ch := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if ch != nil {
			ch <- f // buffered; one response per id
		}
	}
}

// call sends a request and waits for its response, ctx's end or the
// connection's end. A blocking request abandoned at ctx's end is cancelled on
// the server too.
func (c *Client) call(ctx context.Context, op byte, fields ...[]byte) ([][]byte, error) {
	ch := make(chan frame, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}
	if err := c.send(ctx, frame{kind: op, id: id, fields: fields}); err != nil {
		forget()
		return nil, err
	}
	select {
	case f := <-ch:
		return response(f)
	case <-ctx.Done():
		forget()
		if op == opGet || op == opWait {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				c.send(ctx, frame{kind: opCancel, id: id})
			}()
		}
		return nil, ctx.Err()
	case <-c.done:
		select {
		case f := <-ch: // answered just before the end
			return response(f)
		default:
		}
		return nil, c.err
	}
}

func response(f frame) ([][]byte, error) {
	if f.kind == statusOK {
		return f.fields, nil
	}
	msg := "(no message)"
	if len(f.fields) > 0 {
		msg = string(f.fields[0])
	}
	return nil, errors.New("the store answered: " + msg)
}

// send writes one frame. A failed write leaves the stream in an unknown
// state, so it stops the client.
func (c *Client) send(ctx context.Context, f frame) error {
	buf, err := f.encode(nil)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	select {
	case <-c.done:
		return c.err
	default:
	}
	deadline, _ := ctx.Deadline()
	c.conn.SetWriteDeadline(deadline)
	if _, err := c.conn.Write(buf); err != nil {
		c.fail(fmt.Errorf("%w (store %s, seen from rank %d): writing a %s request: %v", ErrConnectionLost, c.addr, c.rank, opNames[f.kind], err))
		return c.err
	}
	return nil
}
