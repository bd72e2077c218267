package rendezvous

import (
	"context"
	"net"
	"strconv"
	"time"
)

// ShutdownTimeout is how long the close function of rank 0's Join waits for
// the other ranks to disconnect before closing the store under them.
const ShutdownTimeout = 30 * time.Second

func joinHostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// Join connects this process to its job's store: rank 0 serves it (see
// Options.ListenAddr for where) and connects to it as a client too; the other
// ranks Dial MasterAddr:MasterPort, retrying until rank 0 is up or ctx ends.
//
// The returned function closes the client and, on rank 0, shuts the store
// down once every other rank has disconnected (at most ShutdownTimeout), so
// that answers already sent reach them. Ranks should meet at a Barrier before
// closing, so that rank 0 does not close the store while others still use it.
func Join(ctx context.Context, info Info, opts Options) (*Client, func() error, error) {
	if err := info.Validate(); err != nil {
		return nil, nil, err
	}
	if info.Rank != 0 {
		c, err := Dial(ctx, info.masterHostPort(), info.JobID, info.Rank, opts)
		if err != nil {
			return nil, nil, err
		}
		return c, c.Close, nil
	}

	listen := opts.ListenAddr
	switch {
	case listen != "":
	case info.MasterAddr == "":
		listen = joinHostPort("127.0.0.1", info.MasterPort)
	case isLoopback(info.MasterAddr):
		listen = info.masterHostPort()
	default:
		listen = joinHostPort("", info.MasterPort)
	}
	srv, err := Serve(ctx, listen, info.JobID)
	if err == nil {
		srv.SetWorld(info.WorldSize)
	}
	if err != nil {
		return nil, nil, err
	}
	c, err := Dial(ctx, dialable(srv.Addr()), info.JobID, info.Rank, opts)
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	closeAll := func() error {
		c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		return srv.Shutdown(ctx)
	}
	return c, closeAll, nil
}

// isLoopback reports whether host names this machine's loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// dialable turns a bound address into one a local client can dial: an
// unspecified host (0.0.0.0, ::) becomes the loopback address.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port) // [::] listens on IPv4 too
	}
	return addr
}
