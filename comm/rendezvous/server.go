package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
)

const (
	helloTimeout = 10 * time.Second // a connection must say hello within this
	writeTimeout = 30 * time.Second // a response must be taken by the client within this
)

var errServerClosed = errors.New("store server closed")

// Server is the key-value store hosted by rank 0. It runs until Close or
// Shutdown.
type Server struct {
	ln        net.Listener
	jobID     string
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup // accept loop, connections, blocked requests

	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced whenever data or conns change
	conns   map[*serverConn]struct{}
	world   int // SetWorld's; 0: any rank
}

// SetWorld has the server turn away a rank outside [0, n) with an error
// naming the world.
func (s *Server) SetWorld(n int) {
	s.mu.Lock()
	s.world = n
	s.mu.Unlock()
}

// Serve listens on addr ("host:port"; port 0 picks a free one, see Addr) and
// serves the store of job jobID. Clients of another job are turned away. The
// context bounds only the setup, not the server's life.
func Serve(ctx context.Context, addr, jobID string) (*Server, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: store of job %q cannot listen on %s: %w", jobID, addr, err)
	}
	s := &Server{ln: ln, jobID: jobID, done: make(chan struct{}), data: map[string][]byte{},
		changed: make(chan struct{}), conns: map[*serverConn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server is bound to, with the port it got.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// String describes the server, for logs.
func (s *Server) String() string {
	return fmt.Sprintf("rendezvous store of job %q at %s", s.jobID, s.Addr())
}

// Close stops the server at once: clients still connected see their pending
// and later calls fail with ErrConnectionLost. Close is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.conn.Close()
		}
		s.mu.Unlock()
	})
	s.wg.Wait()
	return nil
}

// Shutdown stops accepting connections, waits until every client has
// disconnected (so that the answers already sent reach them), then closes. At
// ctx's end it closes anyway and returns an error naming the ranks still
// connected.
func (s *Server) Shutdown(ctx context.Context) error {
	s.ln.Close()
	for {
		s.mu.Lock()
		var ranks []int
		for c := range s.conns {
			ranks = append(ranks, c.rank)
		}
		changed := s.changed
		s.mu.Unlock()
		if len(ranks) == 0 {
			return s.Close()
		}
		select {
		case <-changed:
		case <-s.done:
			return s.Close()
		case <-ctx.Done():
			slices.Sort(ranks)
			s.Close()
			return fmt.Errorf("rendezvous: store of job %q shut down with ranks %v still connected: %w", s.jobID, ranks, ctx.Err())
		}
	}
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return // Shutdown
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors: try again
			continue
		}
		c := &serverConn{s: s, conn: conn, rank: -1, pending: map[uint64]context.CancelFunc{}}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		s.mu.Lock()
		select {
		case <-s.done:
			s.mu.Unlock()
			conn.Close()
			return
		default:
		}
		s.conns[c] = struct{}{}
		s.notifyLocked()
		s.mu.Unlock()
		s.wg.Add(1)
		go c.serve()
	}
}

// notifyLocked wakes everyone waiting for a change. s.mu must be held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) set(key string, value []byte) {
	s.mu.Lock()
	s.data[key] = value
	s.notifyLocked()
	s.mu.Unlock()
}

// add adds delta to the decimal counter under key (0 when absent).
func (s *Server) add(key string, delta int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var v int64
	if old, ok := s.data[key]; ok {
		var err error
		if v, err = strconv.ParseInt(string(old), 10, 64); err != nil {
			return 0, fmt.Errorf("key %q holds %d bytes that are not a decimal counter", key, len(old))
		}
	}
	if (delta > 0 && v > math.MaxInt64-delta) || (delta < 0 && v < math.MinInt64-delta) {
		return 0, fmt.Errorf("counter %q = %d would overflow adding %d", key, v, delta)
	}
	v += delta
	s.data[key] = strconv.AppendInt(nil, v, 10)
	s.notifyLocked()
	return v, nil
}

// missing returns the keys not yet set.
func (s *Server) missing(keys []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, k := range keys {
		if _, ok := s.data[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// await blocks until every key is set and returns their values, or fails when
// ctx ends or the server closes.
func (s *Server) await(ctx context.Context, keys []string) ([][]byte, error) {
	for {
		s.mu.Lock()
		values := make([][]byte, 0, len(keys))
		for _, k := range keys {
			v, ok := s.data[k]
			if !ok {
				break
			}
			values = append(values, v)
		}
		changed := s.changed
		s.mu.Unlock()
		if len(values) == len(keys) {
			return values, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, errServerClosed
		}
	}
}
