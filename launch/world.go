package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/comm/tcp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The transports a world runs over (cmd/train's --comm).
const (
	Local   = "local"   // goroutine ranks of one process over comm/local, CPU (Goroutines)
	TCP     = "tcp"     // process ranks over comm/tcp, CPU
	NCCL    = "nccl"    // process ranks over comm/nccl, one GPU each
	NVSHMEM = "nvshmem" // process ranks over comm/nvshmem, GPUs may be shared
	// Hybrid: process ranks, one GPU each; every group's collectives on
	// NCCL, and symmetric memory (for the peer-copy pipelined and the fused
	// strategies, on the groups whose peers it reaches by loads and
	// stores) from an NVSHMEM world of the same processes, bootstrapped
	// through the same store (comm/hybrid).
	Hybrid = "nccl+nvshmem"
)

// Transports lists the transports, in the order help texts give them.
var Transports = []string{Local, TCP, NCCL, NVSHMEM, Hybrid}

// GPU reports whether transport moves GPU tensors.
func GPU(transport string) bool {
	return transport == NCCL || transport == NVSHMEM || transport == Hybrid
}

// Symmetric reports whether the groups of transport have symmetric memory
// (comm.SymmetricMemory), which the peer-copy pipelined and the fused
// strategies build on.
func Symmetric(transport string) bool { return transport == NVSHMEM || transport == Hybrid }

// Options say how a rank opens its world.
type Options struct {
	// Transport is one of Transports (not Local: see Goroutines).
	Transport string
	// Timeout is the deadline of every wait for another rank: joining,
	// every collective, heartbeats (--comm-timeout). 0: 5 minutes.
	Timeout time.Duration
	// DP, TP and EP are the grid's sizes (comm.NewGrid); all 0: no grid.
	DP, TP, EP int
	// CPU makes the backend of a CPU rank, threads being its share of the
	// cores of its node; nil: cpu.New with those threads.
	CPU func(rank, threads int) (tensor.Backend, error)
	// CUDA are the options of a GPU rank's backend.
	CUDA []cudabackend.Option
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
	// Log receives the lines a rank prints when its world fails (the moment
	// it happens, naming the ranks it lost); nil: os.Stderr.
	Log io.Writer
	// Exit ends the process at once with the code: where a transport cannot
	// abort (NVSHMEM), a rank that learns that a peer died or failed calls
	// it, after printing why. nil: no heartbeats, and such a rank waits for
	// its op's deadline.
	Exit func(code int)
	// Hosts places goroutine ranks on hosts (Goroutines: a simulated
	// cluster, host Hosts[r] for rank r); nil: one host. Process ranks
	// find theirs at the rendezvous (HostID, $ASYNCTP_HOST_ID).
	Hosts []int
}

func (o *Options) defaults() {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
}

// World is one rank's place in a run: its transport, grid, backend and
// the store, with one Close.
type World struct {
	Info      rendezvous.Info
	Transport string
	// Comm is the world; Grid its groups (nil without a layout).
	Comm comm.Comm
	Grid *comm.Grid
	// Backend is what the rank computes on, DType its tensors' (float32 on
	// the CPU, bfloat16 on GPUs), Stream the backend's stream on which
	// every collective is ordered (nil on the CPU).
	Backend tensor.Backend
	DType   tensor.DType
	Stream  comm.Stream
	// Device says what the rank runs on, for the start-up report.
	Device string
	// Report is the transport's own description of the world (NVSHMEM's
	// hosts, GPUs and paths), empty where it has none.
	Report string
	// Store is the job's store (nil for a world of one process).
	Store *rendezvous.Client
	// Hosts is the host of each world rank, an index into HostNames (in
	// the order of the hosts' first ranks), found at the rendezvous from
	// each rank's host identity (HostID; Options.Hosts for goroutine
	// ranks); HostSummary and LocalRanks read it. The hybrid transport
	// offers its symmetric memory only inside a host.
	Hosts     []int
	HostNames []string

	store  *store
	closes []func() error  // in the order they run
	fail   func(err error) // tells the others that this rank failed, where the transport cannot
	closed bool
}

// Open makes this process the rank info of a world (see the package
// documentation). ctx bounds the joining; the world's waits have
// o.Timeout.
func Open(ctx context.Context, info rendezvous.Info, o Options) (w *World, err error) {
	o.defaults()
	w = &World{Info: info, Transport: o.Transport}
	defer func() {
		if err != nil {
			w.close(true)
			w = nil
		}
	}()
	if info.WorldSize > 1 {
		jctx, cancel := context.WithTimeout(ctx, o.Timeout)
		w.store, err = joinStore(jctx, info, o.Timeout, o.Getenv)
		cancel()
		if err != nil {
			return nil, err
		}
		w.Store = w.store.c
	}
	hctx, cancel := context.WithTimeout(ctx, o.Timeout)
	err = placeHosts(hctx, w, o.Getenv)
	cancel()
	if err != nil {
		return nil, err
	}
	switch o.Transport {
	case TCP:
		err = openTCP(ctx, w, o)
	case NCCL:
		err = openNCCL(ctx, w, o)
	case NVSHMEM:
		err = openNVSHMEM(ctx, w, o)
	case Hybrid:
		err = openHybrid(ctx, w, o)
	default:
		err = fmt.Errorf("transport %q: expected one of %s for a rank of processes", o.Transport, strings.Join(slices.DeleteFunc(slices.Clone(Transports), func(s string) bool { return s == Local }), ", "))
	}
	if err != nil {
		return nil, err
	}
	if o.DP > 0 || o.TP > 0 || o.EP > 0 {
		if w.Grid, err = comm.NewGrid(w.Comm, o.DP, o.TP, o.EP); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// later adds f to what Close runs (in order).
func (w *World) later(f func() error) { w.closes = append(w.closes, f) }

// Close releases the rank's world after a run that ended well: the grid,
// the transport, the backend and the store, which its host keeps until the
// others have left (at most rendezvous.ShutdownTimeout).
func (w *World) Close() error { return w.close(false) }

func (w *World) close(lost bool) error {
	if w == nil || w.closed {
		return nil
	}
	w.closed = true
	var errs []error
	if w.Grid != nil {
		errs = append(errs, w.Grid.Close())
	}
	for _, f := range w.closes {
		errs = append(errs, f())
	}
	errs = append(errs, w.store.close(lost))
	return errors.Join(errs...)
}

// Fail ends the rank's world after it failed with err: it aborts the world
// (comm.Aborter: the others' pending and later ops fail at once, naming
// this rank), tells the others through the store where the transport
// cannot abort (NVSHMEM), and releases what can be released without
// waiting for the others; the store's host closes the store at once.
func (w *World) Fail(err error) {
	if w == nil || w.closed {
		return
	}
	if a, ok := w.Comm.(comm.Aborter); ok {
		a.Abort(err)
	}
	if w.fail != nil {
		w.fail(err)
		w.closed = true
		w.store.close(true)
		return
	}
	w.close(true)
}

// cpuThreads is a CPU rank's share of the cores of its node.
func cpuThreads(info rendezvous.Info) int {
	return max(1, runtime.GOMAXPROCS(0)/max(1, info.LocalWorldSize))
}

func cpuBackend(o Options, rank, threads int) (tensor.Backend, error) {
	if o.CPU != nil {
		return o.CPU(rank, threads)
	}
	return cpu.New(cpu.WithThreads(threads)), nil
}

// openTCP: comm/tcp between the processes, each on the CPU with its share
// of the cores of its node.
func openTCP(ctx context.Context, w *World, o Options) error {
	info := w.Info
	c, err := tcp.New(ctx, w.Store, info.Rank, info.WorldSize,
		tcp.WithTimeout(o.Timeout), tcp.WithHost(o.Getenv(EnvTCPHost)),
		tcp.WithOnFailure(func(err error) {
			fmt.Fprintf(o.Log, "rank %d: the tcp world failed: %v\n", info.Rank, err)
		}))
	if err != nil {
		return err
	}
	w.later(c.Close)
	w.Comm = c
	threads := cpuThreads(info)
	b, err := cpuBackend(o, info.Rank, threads)
	if err != nil {
		return err
	}
	w.Backend, w.DType = b, tensor.Float32
	w.Device = fmt.Sprintf("cpu, %d ranks as processes (%d threads each)", info.WorldSize, threads)
	return nil
}
