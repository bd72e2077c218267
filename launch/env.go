package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// Environment variables of the process ranks, beside the launchers' own
// (rendezvous.FromEnv).
const (
	// EnvStore says where the store is: "launcher" when --nproc's launcher
	// (Spawn) hosts it at ASYNCTP_MASTER_ADDR:ASYNCTP_MASTER_PORT (every
	// rank dials it); otherwise rank 0 hosts it there.
	EnvStore = "ASYNCTP_STORE"
	// EnvStorePort overrides the port of the store when the launcher's
	// master port is taken by the launcher's own store (torchrun's agent
	// store, TORCHELASTIC_USE_AGENT_STORE=True; by default the port after
	// MASTER_PORT is used then).
	EnvStorePort = "ASYNCTP_STORE_PORT"
	// EnvTCPHost is the address a tcp rank listens on and tells its peers
	// (default: see tcp.WithHost).
	EnvTCPHost = "ASYNCTP_TCP_HOST"
)

// StartedBy reads how this process was started (getenv: os.Getenv when
// nil): a rank of a launcher's world (asynctp's variables, whatever the
// world's size; torchrun, srun or mpirun with a world of more than one
// process), launched true; or on its own, rank 0 of 1.
func StartedBy(getenv func(string) string) (info rendezvous.Info, launched bool, err error) {
	info, err = rendezvous.FromEnv(getenv)
	if err != nil {
		return info, false, err
	}
	if info.Source == "asynctp" || info.WorldSize > 1 {
		return info, true, nil
	}
	return rendezvous.Info{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}, false, nil
}

// LauncherName says who started the processes: "--nproc" (Spawn), "alone",
// or the launcher of info.
func LauncherName(info rendezvous.Info, getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	switch {
	case info.Source == "asynctp" && getenv(EnvStore) == "launcher":
		return "--nproc"
	case info.Source == "single":
		return "alone"
	}
	return info.Source
}

// store is this rank's connection to the job's store and, on the rank that
// hosts it, the store itself.
type store struct {
	c   *rendezvous.Client
	srv *rendezvous.Server // nil unless this rank hosts it
}

// close closes the client and, on the store's host, the store: after a
// clean run it waits (at most rendezvous.ShutdownTimeout) for the other
// ranks to disconnect, so that answers already sent reach them; when the
// world is lost (lost) it closes at once, since ranks that are gone never
// disconnect.
func (s *store) close(lost bool) error {
	if s == nil || s.c == nil {
		return nil
	}
	s.c.Close()
	if s.srv == nil {
		return nil
	}
	if lost {
		return s.srv.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), rendezvous.ShutdownTimeout)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// joinStore connects to the job's store: the launcher's (EnvStore=launcher,
// Spawn), or rank 0's, which rank 0 serves. Under torchrun with the agent's
// store on MASTER_PORT, rank 0 serves on the next port (or
// ASYNCTP_STORE_PORT).
func joinStore(ctx context.Context, info rendezvous.Info, timeout time.Duration, getenv func(string) string) (*store, error) {
	opts := rendezvous.Options{Timeout: timeout}
	if getenv(EnvStore) == "launcher" {
		c, err := rendezvous.Dial(ctx, net.JoinHostPort(info.MasterAddr, strconv.Itoa(info.MasterPort)), info.JobID, info.Rank, opts)
		if err != nil {
			return nil, err
		}
		return &store{c: c}, nil
	}
	if s := getenv(EnvStorePort); s != "" {
		port, err := strconv.Atoi(s)
		if err != nil || port < 1 || port > 65535 {
			return nil, fmt.Errorf("%s=%q: expected a TCP port", EnvStorePort, s)
		}
		info.MasterPort = port
	} else if info.Source == "torchrun" && strings.EqualFold(getenv("TORCHELASTIC_USE_AGENT_STORE"), "true") {
		info.MasterPort++ // torchrun's own store is on MASTER_PORT
	}
	if err := info.Validate(); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(info.MasterAddr, strconv.Itoa(info.MasterPort))
	if info.Rank != 0 {
		c, err := rendezvous.Dial(ctx, addr, info.JobID, info.Rank, opts)
		if err != nil {
			return nil, err
		}
		return &store{c: c}, nil
	}
	listen := net.JoinHostPort("", strconv.Itoa(info.MasterPort))
	if info.MasterAddr == "" || isLoopback(info.MasterAddr) {
		listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(info.MasterPort))
		addr = listen
	}
	srv, err := rendezvous.Serve(ctx, listen, info.JobID)
	if err != nil {
		return nil, err
	}
	srv.SetWorld(info.WorldSize)
	// Rank 0 reaches its own store as the others do, at the master address,
	// so that the address its connection leaves from is one they can reach
	// (comm/tcp advertises it); loopback only if that address is not this
	// host's.
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	c, err := rendezvous.Dial(dctx, addr, info.JobID, info.Rank, opts)
	cancel()
	if err != nil {
		local := net.JoinHostPort("127.0.0.1", strconv.Itoa(info.MasterPort))
		c, err = rendezvous.Dial(ctx, local, info.JobID, info.Rank, opts)
	}
	if err != nil {
		srv.Close()
		return nil, err
	}
	return &store{c: c, srv: srv}, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
