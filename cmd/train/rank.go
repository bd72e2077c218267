package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/rendezvous"
	"github.com/asynctp/asynctp/comm/tcp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/train"
)

// Environment variables of the process ranks, beside the launchers' own
// (rendezvous.FromEnv).
const (
	// envStore says where the store is: "launcher" when --nproc's launcher
	// hosts it at ASYNCTP_MASTER_ADDR:ASYNCTP_MASTER_PORT (every rank dials
	// it); otherwise rank 0 hosts it there (rendezvous.Join).
	envStore = "ASYNCTP_STORE"
	// envStorePort overrides the port of the store when the launcher's
	// master port is taken by the launcher's own store (torchrun's agent
	// store, TORCHELASTIC_USE_AGENT_STORE=True; by default the port after
	// MASTER_PORT is used then).
	envStorePort = "ASYNCTP_STORE_PORT"
	// envTCPHost is the address a --comm tcp rank listens on and tells its
	// peers (default: the interface that routes to the store's host).
	envTCPHost = "ASYNCTP_TCP_HOST"
	// envFault is a test hook (see faultHook).
	envFault = "ASYNCTP_FAULT_EXIT_AT_STEP"
)

// startedBy reads how this process was started: a rank of a launcher's
// world (ASYNCTP_* of --nproc's launcher, whatever its size; torchrun, srun
// or mpirun with a world of more than one process), or on its own.
func startedBy() (rendezvous.Info, origin, error) {
	info, err := rendezvous.FromEnv(nil)
	if err != nil {
		return info, origin{}, err
	}
	if info.Source == "asynctp" || info.WorldSize > 1 {
		return info, origin{launched: true, world: info.WorldSize}, nil
	}
	return rendezvous.Info{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}, origin{}, nil
}

// rankEnv is a process rank: its place in the world and, once joined, the
// store.
type rankEnv struct {
	info  rendezvous.Info
	store *rendezvous.Client // nil for a world of one
}

// transport is what a rank trains with: its world, the backend its model
// runs on and the stream of that backend on which the collectives are
// ordered (nil on the CPU), the model's dtype, a line for the log, and how
// to release them (after the world, the backend).
type transport struct {
	world  comm.Comm
	stream comm.Stream
	b      tensor.Backend
	dt     tensor.DType
	note   string
	close  func()
	// fail, when set, tells the others that this rank failed with err;
	// close is then not called (NVSHMEM: closing would wait for peers).
	fail func(err error)
}

// runRankProcess is this process's rank of a world of processes: started by
// --nproc's launcher, torchrun, srun or mpirun, or alone (a world of one).
// It joins the store, opens its transport and backend, and trains its part
// of the model (train.RunSharded) like a goroutine rank of runParallel: rank 0
// prints and writes metrics.jsonl and config.json, every rank writes its
// own checkpoints under OUT/rank-NNNNN. An error aborts the world, so that
// the other ranks stop at once with an error naming this rank.
func runRankProcess(ctx context.Context, cfg Config, info rendezvous.Info) error {
	err := rankProcess(ctx, cfg, info)
	if err != nil && info.WorldSize > 1 {
		return fmt.Errorf("rank %d: %w", info.Rank, err)
	}
	return err
}

func rankProcess(ctx context.Context, cfg Config, info rendezvous.Info) error {
	p := cfg.Parallel
	rank := info.Rank
	say := func(format string, args ...any) {
		if rank == 0 {
			fmt.Printf(format, args...)
		}
	}
	fault, err := faultHook(rank)
	if err != nil {
		return err
	}
	ds, err := openDataset(cfg)
	if err != nil {
		return err
	}
	probe, err := train.NewLoader(ds, loaderConfig(cfg)) // the data's errors before joining
	if err != nil {
		return err
	}

	env := rankEnv{info: info}
	if info.WorldSize > 1 {
		jctx, cancel := context.WithTimeout(ctx, time.Duration(p.CommTimeout))
		store, closeStore, err := joinStore(jctx, info, time.Duration(p.CommTimeout))
		cancel()
		if err != nil {
			return err
		}
		defer closeStore()
		env.store = store
	}
	t, err := openTransport(ctx, cfg, env)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			t.close()
		}
	}()

	say("device: %s\n", t.note)
	say("parallel: %s over --comm %s, %d processes (%s), comm timeout %v\n", p, p.Comm, info.WorldSize, launcherName(info), time.Duration(p.CommTimeout))
	mc := cfg.Model.WithDefaults()
	say("model: %s, %d layers, width %d, %d heads, vocab %d, seq %d, %.2fM parameters\n",
		cfg.Preset, mc.Layers, mc.Dim, mc.Heads, mc.Vocab, mc.Seq, float64(paramCount(mc))/1e6)
	say("data: %s, %d tokens; batch %d x %d, %d steps\n", probe.Name(), probe.Tokens(), cfg.Train.Batch, cfg.Train.Seq, cfg.Train.Steps)
	res, err := trainRank(ctx, t.world, cfg, ds, t.b, t.stream, t.dt, fault)
	if err == nil {
		// Nobody closes its connections while another still trains.
		if err = t.world.Barrier(); err != nil {
			err = fmt.Errorf("the final barrier: %w", err)
		}
	}
	if err != nil {
		abort(t.world, err)
		if t.fail != nil {
			t.fail(err)
			closed = true
		}
		return err
	}
	closed = true
	t.close()
	say("done: step %d, loss %.4f, %.0f tokens/s; checkpoints %s\n", res.Step, res.FinalLoss, res.TokensPerSec,
		filepath.Join(cfg.Train.OutDir, "rank-*", filepath.Base(res.LastCheckpoint)))
	return nil
}

// launcherName says who started the processes.
func launcherName(info rendezvous.Info) string {
	switch {
	case info.Source == "asynctp" && os.Getenv(envStore) == "launcher":
		return "--nproc"
	case info.Source == "single":
		return "alone"
	}
	return info.Source
}

// joinStore connects to the job's store: the launcher's (--nproc), or rank
// 0's (rendezvous.Join, rank 0 serving it). Under torchrun with the agent's
// store on MASTER_PORT, rank 0 serves on the next port (or
// ASYNCTP_STORE_PORT).
func joinStore(ctx context.Context, info rendezvous.Info, timeout time.Duration) (*rendezvous.Client, func() error, error) {
	opts := rendezvous.Options{Timeout: timeout}
	if os.Getenv(envStore) == "launcher" {
		addr := fmt.Sprintf("%s:%d", info.MasterAddr, info.MasterPort)
		c, err := rendezvous.Dial(ctx, addr, info.JobID, info.Rank, opts)
		if err != nil {
			return nil, nil, err
		}
		return c, c.Close, nil
	}
	if s := os.Getenv(envStorePort); s != "" {
		port, err := strconv.Atoi(s)
		if err != nil || port < 1 || port > 65535 {
			return nil, nil, fmt.Errorf("%s=%q: expected a TCP port", envStorePort, s)
		}
		info.MasterPort = port
	} else if info.Source == "torchrun" && strings.EqualFold(os.Getenv("TORCHELASTIC_USE_AGENT_STORE"), "true") {
		info.MasterPort++ // torchrun's own store is on MASTER_PORT
	}
	return rendezvous.Join(ctx, info, opts)
}

// openTransport opens the rank's transport (--comm) and backend.
func openTransport(ctx context.Context, cfg Config, env rankEnv) (*transport, error) {
	switch cfg.Parallel.Comm {
	case CommTCP:
		return openTCP(ctx, cfg, env)
	case CommNCCL:
		return openNCCL(ctx, cfg, env)
	case CommNVSHMEM:
		return openNVSHMEM(ctx, cfg, env)
	}
	return nil, fmt.Errorf("--comm %s: not a transport of process ranks", cfg.Parallel.Comm)
}

// openTCP: comm/tcp between the processes, each on the CPU with its share
// of the cores of its node.
func openTCP(ctx context.Context, cfg Config, env rankEnv) (*transport, error) {
	info := env.info
	c, err := tcp.New(ctx, env.store, info.Rank, info.WorldSize,
		tcp.WithTimeout(time.Duration(cfg.Parallel.CommTimeout)), tcp.WithHost(os.Getenv(envTCPHost)))
	if err != nil {
		return nil, err
	}
	threads := max(1, runtime.GOMAXPROCS(0)/max(1, info.LocalWorldSize))
	b, err := cpuGrouped(newRankBackend(info.Rank, threads), cfg.GroupedGEMM)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &transport{world: c, b: b, dt: tensor.Float32, close: func() { c.Close() },
		note: fmt.Sprintf("cpu, %d ranks as processes (%d threads each)", info.WorldSize, threads)}, nil
}

// faultHook is the test hook ASYNCTP_FAULT_EXIT_AT_STEP=<step>:<rank>[:exit]:
// that rank dies right after that step, before the step's checkpoint, as a
// crashed process would: killed by SIGKILL, or with ":exit" exiting with
// status 3. The failure tests of the launcher use it; never set it in a
// real run.
func faultHook(rank int) (func(train.StepMetrics), error) {
	v := os.Getenv(envFault)
	if v == "" {
		return nil, nil
	}
	parts := strings.Split(v, ":")
	step, err1 := strconv.Atoi(parts[0])
	var r int
	var err2 error
	if len(parts) > 1 {
		r, err2 = strconv.Atoi(parts[1])
	}
	if len(parts) < 2 || len(parts) > 3 || err1 != nil || err2 != nil || len(parts) == 3 && parts[2] != "exit" {
		return nil, fmt.Errorf("%s=%q: expected <step>:<rank> or <step>:<rank>:exit (a test hook)", envFault, v)
	}
	if r != rank {
		return nil, nil
	}
	return func(m train.StepMetrics) {
		if m.Step != step {
			return
		}
		if len(parts) == 3 {
			fmt.Fprintf(os.Stderr, "train: rank %d: %s: exiting with status 3 after step %d (a test hook)\n", rank, envFault, step)
			os.Exit(3)
		}
		fmt.Fprintf(os.Stderr, "train: rank %d: %s: killing this process after step %d (a test hook)\n", rank, envFault, step)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			p.Kill() // SIGKILL: no deferred function runs, nothing is closed
		}
		select {}
	}, nil
}
