package rendezvous

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// serverConn is the server's side of one client connection.
type serverConn struct {
	s      *Server
	conn   net.Conn
	rank   int // -1 until hello; guarded by s.mu
	ctx    context.Context
	cancel context.CancelFunc // ends the blocked requests of this connection

	writeMu sync.Mutex
	mu      sync.Mutex
	pending map[uint64]context.CancelFunc // blocked requests by id
}

func (c *serverConn) serve() {
	defer func() {
		c.cancel()
		c.conn.Close()
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.notifyLocked()
		c.s.mu.Unlock()
		c.s.wg.Done()
	}()
	r := bufio.NewReader(c.conn)
	if !c.hello(r) {
		return
	}
	for {
		f, err := readFrame(r, maxFrame)
		if err != nil {
			return // closed, or garbage: drop the connection
		}
		c.handle(f)
	}
}

// hello reads and answers the handshake; false drops the connection.
func (c *serverConn) hello(r *bufio.Reader) bool {
	c.conn.SetReadDeadline(time.Now().Add(helloTimeout))
	f, err := readFrame(r, maxHello) // nothing big before the client is known
	if err != nil {
		return false
	}
	if f.kind != opHello || len(f.fields) != 4 || string(f.fields[0]) != protoMagic {
		c.reply(f.id, statusError, []byte("not an asynctp rendezvous hello"))
		return false
	}
	if v := string(f.fields[1]); v != protoVersion {
		c.reply(f.id, statusError, fmt.Appendf(nil, "protocol version %q, the server speaks %q", v, protoVersion))
		return false
	}
	job := string(f.fields[2])
	rank, err := strconv.Atoi(string(f.fields[3]))
	if err != nil {
		c.reply(f.id, statusError, fmt.Appendf(nil, "rank %q is not an integer", f.fields[3]))
		return false
	}
	if job != c.s.jobID {
		c.reply(f.id, statusJobMismatch, fmt.Appendf(nil,
			"the store at %s serves job %q, but rank %d belongs to job %q", c.s.Addr(), c.s.jobID, rank, job))
		return false
	}
	c.s.mu.Lock()
	world := c.s.world
	c.s.mu.Unlock()
	if world > 0 && (rank < 0 || rank >= world) {
		c.reply(f.id, statusError, fmt.Appendf(nil, "rank %d is outside the world of %d ranks of job %q, expected 0 to %d", rank, world, job, world-1))
		return false
	}
	c.s.mu.Lock()
	c.rank = rank
	c.s.mu.Unlock()
	c.conn.SetReadDeadline(time.Time{})
	return c.reply(f.id, statusOK, []byte(c.s.jobID)) == nil
}

// handle runs one request; blocking ones continue in their own goroutine.
func (c *serverConn) handle(f frame) {
	fail := func(format string, args ...any) {
		c.reply(f.id, statusError, fmt.Appendf(nil, format, args...))
	}
	if _, ok := opNames[f.kind]; !ok || f.kind == opHello {
		fail("unexpected op %d", f.kind)
		return
	}
	want, nkeys := -1, len(f.fields) // wait and check: any number of keys
	switch f.kind {
	case opSet, opAdd:
		want, nkeys = 2, 1
	case opGet:
		want, nkeys = 1, 1
	case opCancel:
		want, nkeys = 0, 0
	}
	if want >= 0 && len(f.fields) != want {
		fail("%s request with %d fields, want %d", opNames[f.kind], len(f.fields), want)
		return
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = string(f.fields[i])
		if err := checkKey(keys[i]); err != nil {
			fail("%s: %v", opNames[f.kind], err)
			return
		}
	}
	switch f.kind {
	case opSet:
		if len(f.fields[1]) > MaxValueSize {
			fail("set %q: value of %d bytes exceeds the limit of %d", keys[0], len(f.fields[1]), MaxValueSize)
			return
		}
		c.s.set(keys[0], f.fields[1])
		c.reply(f.id, statusOK)
	case opAdd:
		delta, err := parseInt64Field(f.fields[1])
		if err == nil {
			var v int64
			if v, err = c.s.add(keys[0], delta); err == nil {
				c.reply(f.id, statusOK, int64Field(v))
				return
			}
		}
		fail("add %q: %v", keys[0], err)
	case opCheck:
		var missing [][]byte
		for _, k := range c.s.missing(keys) {
			missing = append(missing, []byte(k))
		}
		c.reply(f.id, statusOK, missing...)
	case opGet, opWait:
		c.block(f, keys)
	case opCancel:
		c.mu.Lock()
		if cancel := c.pending[f.id]; cancel != nil {
			cancel()
		}
		c.mu.Unlock()
	}
}

// block answers a get or wait once its keys are set, in a goroutine that a
// cancel request, the connection's end or the server's close stops.
func (c *serverConn) block(f frame, keys []string) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	if old := c.pending[f.id]; old != nil {
		old()
	}
	c.pending[f.id] = cancel
	c.mu.Unlock()
	c.s.wg.Add(1)
	go func() {
		defer c.s.wg.Done()
		values, err := c.s.await(ctx, keys)
		c.mu.Lock()
		delete(c.pending, f.id)
		c.mu.Unlock()
		cancel()
		switch {
		case err != nil:
			// Cancelled by the client, its connection gone, or the server
			// closing (which closes the connection): no answer.
		case f.kind == opGet:
			c.reply(f.id, statusOK, values[0])
		default:
			c.reply(f.id, statusOK)
		}
	}()
}

// reply sends one response; a failed write drops the connection.
func (c *serverConn) reply(id uint64, status byte, fields ...[]byte) error {
	buf, err := frame{kind: status, id: id, fields: fields}.encode(nil)
	if err != nil {
		buf, _ = frame{kind: statusError, id: id, fields: [][]byte{[]byte(err.Error())}}.encode(nil)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err = c.conn.Write(buf); err != nil {
		c.conn.Close()
	}
	return err
}
